//! Fixtures for the crate's unit tests: a repository of models made in a temporary folder, whose engines are a
//! fake that echoes its input (or fails to load, for a model whose name starts with `broken`), a registry over
//! it, and the app state around that registry.

use std::path::Path;
use std::sync::Arc;

use inferd_core::{DataType, Engine, ModelConfig, ModelMetadata, Precision, Tensor, TensorSpec};
use inferd_models::{Defaults, EngineSettings, OnnxSettings, Repository};

use crate::gpu::{GpuMonitor, NoGpu};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::state::AppState;

/// Gives back its `FP32 [-1, 2]` input as its output.
pub struct Echo(ModelMetadata);

impl Echo {
    pub fn new() -> Echo {
        let spec = |name: &str| TensorSpec {
            name: name.into(),
            datatype: DataType::Fp32,
            shape: vec![-1, 2],
            optional: false,
        };
        Echo(ModelMetadata {
            inputs: vec![spec("x")],
            outputs: vec![spec("y")],
            device: "cpu".into(),
            precision: Precision::Fp32,
            platform: "echo",
            text: None,
        })
    }
}

impl Engine for Echo {
    fn metadata(&self) -> &ModelMetadata {
        &self.0
    }

    fn run(&mut self, inputs: &[Tensor]) -> inferd_core::Result<Vec<Tensor>> {
        Ok(inputs.to_vec())
    }
}

/// Writes model `name`'s folder into `repository`, with `toml` after the lines every model has.
pub fn model_folder(repository: &Path, name: &str, toml: &str) {
    let dir = repository.join(name);
    std::fs::create_dir_all(&dir).expect("model folder");
    std::fs::write(dir.join("model.toml"), format!("backend = \"onnx\"\nfile = \"model.onnx\"\n{toml}"))
        .expect("model.toml");
}

/// The registry of the models in `repository`, none loaded yet.
pub fn registry(repository: &Path) -> Registry {
    let repository = Repository::new(repository);
    let configs = repository.discover().expect("discovers");
    let mut names: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
    names.dedup();
    let build = |config: &ModelConfig| -> inferd_core::Result<Box<dyn Engine>> {
        // A model named `broken…`, or a version whose folder holds a file named `broken`, cannot load.
        if config.name.starts_with("broken") || config.dir.join("broken").exists() {
            return Err(inferd_core::Error::engine("this engine cannot load"));
        }
        Ok(Box::new(Echo::new()))
    };
    let settings = EngineSettings {
        onnx: OnnxSettings { library: "no-library".into(), shared_threads: 1 },
        default_precision: Precision::Fp32,
        builder: Some(Arc::new(build)),
        gpu_memory: None,
    };
    Registry::new(repository, configs, settings, Arc::new(Metrics::new(&names)))
}

/// The app state over the models in `repository`, loaded, with the server's flags `args`.
pub fn loaded_state(repository: &Path, args: &[&str]) -> AppState {
    let config = crate::ServeConfig::from_args(args.iter().copied()).expect("flags parse");
    let registry = registry(repository);
    registry.load_all(|| false);
    let gpu = GpuMonitor::new(Arc::new(NoGpu));
    AppState::new(&config, registry, Defaults::default(), gpu).expect("state")
}
