//! inferd-models: a model's life below HTTP. [`repository`] finds the models a folder holds (discovery, no
//! loading); [`loader`] builds a model's engines (the one place that picks a backend), warms them and starts its
//! batcher; [`task`] is what a model does with a request before the batcher (tokenize texts, say) and after it
//! (pool, normalise). The server's protocols, the benchmarks and any later front end share these without HTTP.

pub mod budget;
pub mod loader;
pub mod remote;
pub mod repository;
pub mod task;

pub use budget::{DeviceMemory, GpuMemoryReader, HostMemory};
pub use inferd_onnx::OnnxSettings;
pub use loader::{build_engine, load, EngineBuilder, EngineSettings, LoadedModel, ModelMemory};
pub use remote::{RemoteLimits, RemoteRepository, SyncReport};
pub use repository::{Defaults, FolderStamp, Repository};
pub use task::{
    registration, triton_classification, Answer, Input, Prepared, Registration, Request, Reserve, Service, Task,
    TaskError, TextFront, TextInput, Texts, Token, Tower,
};
