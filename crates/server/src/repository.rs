//! The model repository: finding models and their versions, building their engines, and warming them.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use inferd_batcher::{BatchObserver, Batcher};
use inferd_core::{
    Backend, BatchingConfig, Engine, ModelConfig, ModelMetadata, Precision, Task, WarmUp, MODEL_CONFIG_FILE,
};
use inferd_onnx::OnnxSettings;

use crate::registry::Model;
use crate::text::TextModel;

/// The repository's models, and the ones the routes without a model name serve.
pub struct Repository {
    /// Every version to serve, sorted by name and version; none loaded yet.
    pub models: Vec<Arc<Model>>,
    pub defaults: Defaults,
}

/// The models that the routes without a model name serve.
#[derive(Clone, Debug, Default)]
pub struct Defaults {
    /// `/predict`: `--default-model`, or the only model.
    pub model: Option<String>,
    /// `/embed`: `--default-embed-model`, or the default model when it embeds text, or the only text model.
    pub embed: Option<String>,
}

impl Repository {
    /// Reads the repository at `dir` (see [`discover`]); `default_model` must be one of its models, and is the
    /// only one when not given; `default_embed_model` must be one of its text models.
    pub fn open(
        dir: &Path,
        default_model: Option<&str>,
        default_embed_model: Option<&str>,
    ) -> anyhow::Result<Repository> {
        let configs = discover(dir)?;
        let find = |name: &str| configs.iter().find(|c| c.name == name);
        let model = match (default_model, configs.as_slice()) {
            (Some(name), _) if find(name).is_none() => {
                anyhow::bail!("--default-model `{name}` is not a model in {}", dir.display())
            }
            (Some(name), _) => Some(name.to_owned()),
            (None, [only, ..]) if configs.iter().all(|c| c.name == only.name) => Some(only.name.clone()),
            (None, _) => None,
        };
        let mut text: Vec<&ModelConfig> = configs.iter().filter(|c| c.task == Task::Embed).collect();
        text.dedup_by(|a, b| a.name == b.name);
        let embed = match default_embed_model {
            Some(name) => match find(name) {
                Some(c) if c.task == Task::Embed => Some(name.to_owned()),
                Some(_) => {
                    anyhow::bail!("--default-embed-model `{name}` does not embed text (its task is not `embed`)")
                }
                None => anyhow::bail!("--default-embed-model `{name}` is not a model in {}", dir.display()),
            },
            None => match (model.as_deref().and_then(find), text.as_slice()) {
                (Some(c), _) if c.task == Task::Embed => Some(c.name.clone()),
                (_, [only]) => Some(only.name.clone()),
                _ => None,
            },
        };
        Ok(Repository { models: configs.into_iter().map(Model::new).collect(), defaults: Defaults { model, embed } })
    }

    /// ONNX Runtime engine instances across the repository: they share the cores.
    pub fn onnx_instances(&self) -> usize {
        self.models.iter().filter(|m| m.config.backend == Backend::Onnx).map(|m| m.config.instances).sum()
    }
}

/// Loads `models` one after the other, each reporting its batches to `observer(name)`, until `stop` says the
/// server is shutting down: the models left are then marked failed. Blocking: run it on the blocking pool.
pub fn load_all(
    models: &[Arc<Model>],
    settings: &EngineSettings,
    observer: impl Fn(&str) -> Arc<dyn BatchObserver>,
    stop: impl Fn() -> bool,
) {
    for model in models {
        if stop() {
            model.set_loaded(Err("the server shut down before the model loaded".into()));
        } else {
            model.set_loaded(load_model(&model.config, settings, observer(model.name())).map_err(|e| format!("{e:#}")));
        }
    }
}

/// Reads every model's `model.toml`, and returns each version to serve: `dir` is one model folder, or a folder
/// of them. A broken `model.toml` stops start-up (the error names the file and the field); a folder without one
/// is skipped.
pub fn discover(dir: &Path) -> anyhow::Result<Vec<ModelConfig>> {
    if dir.join(MODEL_CONFIG_FILE).is_file() {
        return Ok(ModelConfig::load_versions(dir)?);
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read the model repository {}: {e}", dir.display()))?;
    let mut configs = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.join(MODEL_CONFIG_FILE).is_file() {
            configs.extend(ModelConfig::load_versions(&path)?);
        } else if path.is_dir() {
            tracing::debug!(folder = %path.display(), "no model.toml: not a model");
        }
    }
    if configs.is_empty() {
        anyhow::bail!("no models in {}: each model is a folder holding a model.toml", dir.display());
    }
    configs.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
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

/// A loaded model as the routes use it: its batcher and, for a text model, its tokenizing front. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    /// The model version it serves.
    pub version: u64,
    pub batcher: Batcher,
    pub text: Option<Arc<TextModel>>,
    /// The batching it runs with: `model.toml`'s, with `max_batch_size = 0` for a graph without a batch dimension.
    pub batching: BatchingConfig,
    /// Whether every instance ran its warm-up (see [`WarmUp`]).
    pub warmed: bool,
}

impl Endpoint {
    pub fn name(&self) -> &str {
        self.batcher.name()
    }

    /// The model as the tensor protocols show it: a text model takes texts and gives embeddings.
    pub fn metadata(&self) -> &ModelMetadata {
        match &self.text {
            Some(text) => text.public(),
            None => self.batcher.metadata(),
        }
    }
}

/// Loads every instance of a model, warms each (see [`WarmUp::plan`]), and starts its batcher, which reports to
/// `observer`; a text model's tokenizer too. A warm-up that fails fails the load, with its message. Blocking.
pub fn load_model(
    config: &ModelConfig,
    settings: &EngineSettings,
    observer: Arc<dyn BatchObserver>,
) -> anyhow::Result<Endpoint> {
    let started = std::time::Instant::now();
    let mut engines = Vec::with_capacity(config.instances);
    let mut batching = config.batching.clone();
    let mut warmed = true;
    for instance in 0..config.instances {
        let mut engine = build_engine(config, settings)?;
        let meta = engine.metadata();
        if meta.text.is_some() && !meta.has_batch_dim() {
            // Sequences are batched by tokens, padded to the longest: a graph of one fixed row cannot take that.
            anyhow::bail!(
                "a text model needs a batch dimension (its inputs' first dimension -1); this graph's is fixed \
                 (max_batch_size = 0 is for tensor models)"
            );
        }
        if instance == 0 && !meta.has_batch_dim() && batching.max_batch_size > 0 {
            let shapes: Vec<String> = meta.inputs.iter().map(|s| format!("{} {:?}", s.name, s.shape)).collect();
            tracing::info!(
                model = %config.name,
                inputs = %shapes.join(", "),
                "the model has no batch dimension (its inputs' first dimensions are fixed): each request runs as \
                 sent, alone (max_batch_size = 0)"
            );
            batching.max_batch_size = 0;
        }
        // A text model warms with sequences of its longest length: on a GPU as many as its token budget takes,
        // to claim the memory its largest batch needs; on the CPU one, which is all the allocator needs to see
        // (a full budget there is seconds of arithmetic before the model is ready).
        let rows = match (&meta.text, batching.max_batch_size) {
            (Some(text), max) if meta.on_gpu() => {
                (batching.max_batch_tokens / text.max_seq_len.max(1)).clamp(1, max.max(1))
            }
            (Some(_), _) | (None, 0) => 1,
            (None, max) => max,
        };
        match WarmUp::plan(&config.warmup, meta, rows).context("warm-up")? {
            WarmUp::Run(inputs) => {
                let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
                engine.run(&inputs).with_context(|| format!("warm-up with inputs of shapes {shapes:?}"))?;
            }
            WarmUp::Skip(why) => {
                if instance == 0 {
                    tracing::warn!(
                        model = %config.name,
                        reason = %why,
                        "no warm-up: the model serves now, and its first requests pay for the engine's set-up"
                    );
                }
                warmed = false;
            }
        }
        engines.push(engine);
    }
    let text = match engines.first().map(|e| e.metadata()).filter(|m| m.text.is_some()) {
        Some(meta) => Some(TextModel::load(meta)?),
        None => None,
    };
    let batcher =
        Batcher::start(&config.name, &batching, engines, Some(observer)).context("cannot start its threads")?;
    let meta = batcher.metadata();
    tracing::info!(
        model = %config.name,
        backend = config.backend.as_str(),
        device = %meta.device,
        precision = %meta.precision,
        instances = config.instances,
        max_batch_size = batching.max_batch_size,
        warmed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "model ready"
    );
    Ok(Endpoint { version: config.version, batcher, text, batching, warmed })
}
