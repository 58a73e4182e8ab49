//! The model repository: finding models, building their engines, warming them, and each model's state.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use inferd_batcher::{BatchObserver, Batcher};
use inferd_core::{Backend, Engine, ModelConfig, Precision, MODEL_CONFIG_FILE};
use inferd_onnx::OnnxSettings;

/// Reads every model's `model.toml`: `dir` is one model folder, or a folder of them. A broken `model.toml` stops
/// start-up (the error names the file and the field); a folder without one is skipped.
pub fn discover(dir: &Path) -> anyhow::Result<Vec<ModelConfig>> {
    if dir.join(MODEL_CONFIG_FILE).is_file() {
        return Ok(vec![ModelConfig::load(dir)?]);
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read the model repository {}: {e}", dir.display()))?;
    let mut configs = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.join(MODEL_CONFIG_FILE).is_file() {
            configs.push(ModelConfig::load(&path)?);
        } else if path.is_dir() {
            tracing::debug!(folder = %path.display(), "no model.toml: not a model");
        }
    }
    if configs.is_empty() {
        anyhow::bail!("no models in {}: each model is a folder holding a model.toml", dir.display());
    }
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(configs)
}

/// Builds an engine for a model in place of its backend: for tests that need an engine no model file describes
/// (a slow one, say), run through the whole server.
pub type EngineBuilder = Arc<dyn Fn(&ModelConfig) -> inferd_core::Result<Box<dyn Engine>> + Send + Sync>;

/// What the engines need from the server's configuration.
#[derive(Clone)]
pub struct EngineSettings {
    pub onnx: OnnxSettings,
    pub default_precision: Precision,
    /// Replaces the backends when set.
    pub builder: Option<EngineBuilder>,
}

/// Builds one engine instance for a model: the one place that picks a backend.
pub fn build_engine(config: &ModelConfig, settings: &EngineSettings) -> inferd_core::Result<Box<dyn Engine>> {
    if let Some(build) = &settings.builder {
        return build(config);
    }
    Ok(match config.backend {
        Backend::Onnx => Box::new(inferd_onnx::OnnxEngine::load(config, &settings.onnx, settings.default_precision)?),
        Backend::Candle => Box::new(inferd_candle::CandleEngine::load(config, settings.default_precision)?),
    })
}

/// Loads every instance of a model, warms each at its max batch size, and starts its batcher, which reports to
/// `observer`. Blocking.
pub fn load_model(
    config: &ModelConfig,
    settings: &EngineSettings,
    observer: Arc<dyn BatchObserver>,
) -> Result<Batcher, String> {
    let started = std::time::Instant::now();
    let mut engines = Vec::with_capacity(config.instances);
    for _ in 0..config.instances {
        let mut engine = build_engine(config, settings).map_err(|e| e.to_string())?;
        let warm_up =
            engine.metadata().warm_up_inputs(config.batching.max_batch_size).map_err(|e| format!("warm-up: {e}"))?;
        engine.run(&warm_up).map_err(|e| format!("warm-up at batch size {}: {e}", config.batching.max_batch_size))?;
        engines.push(engine);
    }
    let batcher = Batcher::start(&config.name, &config.batching, engines, Some(observer))
        .map_err(|e| format!("cannot start its threads: {e}"))?;
    let meta = batcher.metadata();
    tracing::info!(
        model = %config.name,
        backend = config.backend.as_str(),
        device = %meta.device,
        precision = %meta.precision,
        instances = config.instances,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "model ready"
    );
    Ok(batcher)
}

/// One model of the repository and how far it got.
pub struct Model {
    pub config: ModelConfig,
    /// Unset while loading; then the running batcher, or why the model could not load.
    state: OnceLock<Result<Batcher, String>>,
}

/// A model's state, for routes and health.
pub enum ModelState<'a> {
    Loading,
    Ready(&'a Batcher),
    Failed(&'a str),
}

impl Model {
    pub fn new(config: ModelConfig) -> Arc<Model> {
        Arc::new(Model { config, state: OnceLock::new() })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn state(&self) -> ModelState<'_> {
        match self.state.get() {
            None => ModelState::Loading,
            Some(Ok(batcher)) => ModelState::Ready(batcher),
            Some(Err(e)) => ModelState::Failed(e),
        }
    }

    /// Records the outcome of loading (once).
    pub fn set_loaded(&self, outcome: Result<Batcher, String>) {
        if let Err(e) = &outcome {
            tracing::error!(model = %self.config.name, error = %e, "model failed to load; the other models still serve");
        }
        let _ = self.state.set(outcome);
    }

    pub fn batcher(&self) -> Option<&Batcher> {
        self.state.get().and_then(|s| s.as_ref().ok())
    }
}
