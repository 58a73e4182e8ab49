//! Loading: a model version's engines built (the one place that picks a backend), warmed, and started behind
//! its batcher, with its task. Blocking throughout: callers run it on a blocking thread.

use std::sync::Arc;

use anyhow::Context;
use inferd_batcher::{BatchObserver, Batcher};
use inferd_core::{Backend, BatchingConfig, Engine, ModelConfig, ModelMetadata, Precision, WarmUp};
use inferd_onnx::OnnxSettings;

use crate::budget::{self, GpuMemoryReader, HostMemory, Need, Place};
use crate::task::{self, Service, Task, Tower};

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
    /// Reads a GPU's memory: for the budget checked before a model loads on a GPU, and what its load took there.
    pub gpu_memory: Option<GpuMemoryReader>,
}

/// Builds one engine instance for a model: the one place that picks a backend. A text engine computes the
/// contracts its task asks for ([`task::registration`]).
pub fn build_engine(config: &ModelConfig, settings: &EngineSettings) -> inferd_core::Result<Box<dyn Engine>> {
    if let Some(build) = &settings.builder {
        return build(config);
    }
    let wants = task::registration(config).contracts;
    let precision = settings.default_precision;
    Ok(match config.backend {
        Backend::Onnx => Box::new(inferd_onnx::OnnxEngine::load(config, &settings.onnx, precision, wants)?),
        Backend::Candle => Box::new(inferd_candle::CandleEngine::load(config, precision, wants)?),
    })
}

/// A loaded model version: its batcher and its task. Cheap to clone.
#[derive(Clone)]
pub struct LoadedModel {
    pub version: u64,
    pub batcher: Batcher,
    /// A model of two towers: the batcher of its texts, which run on its engines' text towers.
    pub text_batcher: Option<Batcher>,
    pub task: Arc<dyn Task>,
    /// Its task's name in `model.toml`.
    task_name: &'static str,
    /// The batching it runs with: `model.toml`'s, with `max_batch_size = 0` for a graph without a batch dimension.
    pub batching: BatchingConfig,
    /// Whether every instance ran its warm-up (see [`WarmUp`]).
    pub warmed: bool,
    pub memory: ModelMemory,
}

/// What a loaded model holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelMemory {
    /// Its instances' weights, by the engines' own account (see [`Engine::weight_bytes`]); `None` where one
    /// cannot tell.
    pub weight_bytes: Option<u64>,
    /// Device memory its GPU lost while it loaded and warmed (models load one after another, so this is its own,
    /// short of another process's at the same time); `None` on the CPU.
    pub device_bytes: Option<u64>,
}

impl LoadedModel {
    pub fn name(&self) -> &str {
        self.batcher.name()
    }

    /// The model as the protocols show it (its task's face: a text model takes texts and gives embeddings).
    pub fn metadata(&self) -> &ModelMetadata {
        self.task.metadata()
    }

    /// What it serves.
    pub fn service(&self) -> Service {
        self.task.service()
    }

    /// Its task's name in `model.toml` (`embed`, `rerank`, …).
    pub fn task_name(&self) -> &'static str {
        self.task_name
    }

    /// The model as its engines run it.
    pub fn engine_metadata(&self) -> &ModelMetadata {
        self.batcher.metadata()
    }

    /// The batcher of `tower`'s requests.
    pub fn batcher_for(&self, tower: Tower) -> &Batcher {
        match (tower, &self.text_batcher) {
            (Tower::Text, Some(texts)) => texts,
            _ => &self.batcher,
        }
    }

    /// Every batcher it has: its own, and a model of two towers' texts'.
    pub fn batchers(&self) -> impl Iterator<Item = &Batcher> {
        std::iter::once(&self.batcher).chain(&self.text_batcher)
    }
}

/// Loads every instance of a model, warms each (see [`WarmUp::plan`]), makes its task, and starts its batcher,
/// which reports to `observer`. A warm-up that fails fails the load, with its message.
pub fn load(
    config: &ModelConfig,
    settings: &EngineSettings,
    observer: Arc<dyn BatchObserver>,
) -> anyhow::Result<LoadedModel> {
    let started = std::time::Instant::now();
    let (place, before) = budget::place(config, settings.gpu_memory.as_ref());
    // Candle checks its weights against its GPU itself, exactly, once it knows the dtype it loads them in.
    if settings.builder.is_none() && !(config.backend == Backend::Candle && matches!(place, Place::Gpu(_))) {
        budget::check(Need::of(config), place, before, HostMemory::read())?;
    }
    let mut engines = Vec::with_capacity(config.instances);
    // A model of two towers' text towers, one per instance.
    let mut text_engines = Vec::new();
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
        if !warm_up(engine.as_mut(), config, &batching, instance)? {
            warmed = false;
        }
        if let Some(mut texts) = engine.text_tower() {
            if !warm_up(texts.as_mut(), config, &batching, instance).context("its text tower")? {
                warmed = false;
            }
            text_engines.push(texts);
        }
        // The warm-up's largest batch proved it fits; its working memory goes back until batches need it again.
        engine.release_cached_memory();
        engines.push(engine);
    }
    let Some(first) = engines.first() else { anyhow::bail!("model `{}` has no instance to run", config.name) };
    let texts = text_engines.first().map(|e| e.metadata());
    // The batcher batches a text engine's sequences by tokens; the task must be the one that makes them.
    let takes_text = first.metadata().text.is_some() || texts.is_some_and(|t| t.text.is_some());
    if task::registration(config).service.takes_text() != takes_text {
        anyhow::bail!(
            "its task is `{}`, but its engine {} text",
            config.task.as_str(),
            if takes_text { "takes" } else { "does not take" }
        );
    }
    let task = task::for_model(config, first.metadata(), texts)?;
    let device_bytes = match (place, before, &settings.gpu_memory) {
        (Place::Gpu(n), Some(before), Some(read)) if first.metadata().on_gpu() => {
            read(n).map(|after| before.free.saturating_sub(after.free))
        }
        _ => None,
    };
    let memory = ModelMemory { weight_bytes: engines.iter().map(|e| e.weight_bytes()).sum(), device_bytes };
    let text_batcher = match text_engines.is_empty() {
        true => None,
        false => Some(
            Batcher::start(&config.name, &batching, text_engines, observer.clone())
                .context("cannot start its text towers' threads")?,
        ),
    };
    let batcher = Batcher::start(&config.name, &batching, engines, observer).context("cannot start its threads")?;
    let meta = batcher.metadata();
    tracing::info!(
        model = %config.name,
        backend = config.backend.as_str(),
        device = %meta.device,
        precision = %meta.precision,
        instances = config.instances,
        max_batch_size = batching.max_batch_size,
        warmed,
        weight_bytes = memory.weight_bytes,
        device_bytes = memory.device_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "model ready"
    );
    Ok(LoadedModel {
        version: config.version,
        batcher,
        text_batcher,
        task,
        task_name: config.task.as_str(),
        batching,
        warmed,
        memory,
    })
}

/// Runs one instance's warm-up; false where the shapes are unknown and nothing was run.
fn warm_up(
    engine: &mut dyn Engine,
    config: &ModelConfig,
    batching: &BatchingConfig,
    instance: usize,
) -> anyhow::Result<bool> {
    let meta = engine.metadata();
    // A text model warms with sequences of its longest length: on a GPU as many as its token budget takes, to
    // prove that its largest batch fits (and pick its kernels) before it serves; on the CPU one, which is all the
    // allocator needs to see (a full budget there is seconds of arithmetic before the model is ready).
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
            Ok(true)
        }
        WarmUp::Skip(why) => {
            if instance == 0 {
                tracing::warn!(
                    model = %config.name,
                    reason = %why,
                    "no warm-up: the model serves now, and its first requests pay for the engine's set-up"
                );
            }
            Ok(false)
        }
    }
}
