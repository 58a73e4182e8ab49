//! inferd-core: tensors, data types, model configuration and the `Engine` trait that every other inferd crate
//! builds on. It knows nothing of HTTP, async runtimes or any particular engine.

mod config;
mod dtype;
mod engine;
mod error;
mod host;
mod tensor;
pub mod text;
mod warmup;

pub use config::{
    Anchor, Backend, BatchingConfig, CandleOptions, Channels, DeviceSpec, Filter, ImageConfig, Labels, Layout,
    ModelConfig, OnnxOptions, OutputConfig, OutputKind, Pooling, Precision, Resize, Rounding, Task, TensorSpec,
    TextOverrides, VersionPolicy, WarmupConfig, WarmupInput, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_PIXELS,
    DEFAULT_TEXT_WEIGHTS, MAX_BATCH_SIZE_LIMIT, MAX_IMAGE_SIDE, MAX_INSTANCES, MAX_WARMUP_ELEMENTS, MODEL_CONFIG_FILE,
    PROCESSOR_CONFIG_FILE,
};
pub use dtype::{le_bytes, DataType, Element, UnknownDataType};
pub use engine::{Engine, ModelMetadata};
pub use error::{Error, Result};
pub use host::HostMemory;
pub use tensor::{element_count, Tensor, TensorData};
pub use warmup::WarmUp;

/// Re-exported for [`with_element_type!`] and for the engines' FP16/BF16 data.
pub use half;
