//! The registry: the models being served, one entry per version, and the state of each. It alone changes them:
//! the start-up load, and model control ([`control`]). Every route reads a snapshot, and resolves the model it
//! names here, once. Discovery is the repository's and loading the loader's ([`inferd_models`]); what the
//! server's readiness makes of the states is [`readiness`]'s.

mod control;
pub mod readiness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use inferd_core::ModelConfig;
use inferd_models::{EngineSettings, LoadedModel, RemoteRepository, Repository};

use crate::codec::quoted;
use crate::error::AppError;
use crate::metrics::{BatchCounts, BatchMetrics, Metrics};

/// Why model control could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

/// One version of one model, and how far it got.
pub struct ModelEntry {
    pub config: ModelConfig,
    /// The name as the metrics label it, shared rather than copied per request.
    label: Arc<str>,
    /// Unset while loading; then set once.
    state: OnceLock<Loaded>,
    /// Set when model control replaced this entry: a request that resolved it before must resolve again.
    retired: AtomicBool,
}

enum Loaded {
    Ready {
        model: Arc<LoadedModel>,
        metrics: Arc<BatchMetrics>,
    },
    /// Loading failed at start-up: readiness waits for it.
    Failed(String),
    /// Unloaded by model control, or a load by model control failed: not served, and readiness does not wait.
    Unloaded(String),
}

/// A model version's state, for routes and health.
pub enum ModelState<'a> {
    Loading,
    Ready(&'a Arc<LoadedModel>),
    Failed(&'a str),
    Unloaded(&'a str),
}

impl ModelEntry {
    fn new(config: ModelConfig) -> Arc<ModelEntry> {
        let label = Arc::from(config.name.as_str());
        Arc::new(ModelEntry { config, label, state: OnceLock::new(), retired: AtomicBool::new(false) })
    }

    fn with(config: ModelConfig, loaded: Loaded) -> Arc<ModelEntry> {
        let entry = ModelEntry::new(config);
        let _ = entry.state.set(loaded);
        entry
    }

    /// This version, taken out of service for `why`: what replaces it when model control or poll mode unloads it.
    fn unloaded(&self, why: impl Into<String>) -> Arc<ModelEntry> {
        ModelEntry::with(self.config.clone(), Loaded::Unloaded(why.into()))
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn label(&self) -> Arc<str> {
        self.label.clone()
    }

    pub fn version(&self) -> u64 {
        self.config.version
    }

    pub fn state(&self) -> ModelState<'_> {
        match self.state.get() {
            None => ModelState::Loading,
            Some(Loaded::Ready { model, .. }) => ModelState::Ready(model),
            Some(Loaded::Failed(e)) => ModelState::Failed(e),
            Some(Loaded::Unloaded(why)) => ModelState::Unloaded(why),
        }
    }

    /// The loaded model, if it is loaded.
    pub fn loaded(&self) -> Option<&Arc<LoadedModel>> {
        match self.state.get() {
            Some(Loaded::Ready { model, .. }) => Some(model),
            _ => None,
        }
    }

    /// The loaded model, or why it is not served (503).
    pub fn serving(&self) -> Result<Arc<LoadedModel>, AppError> {
        let name = self.name();
        match self.state() {
            ModelState::Ready(model) => Ok(model.clone()),
            ModelState::Loading => Err(AppError::unavailable(format!("model `{name}` is still loading"))),
            ModelState::Failed(e) => Err(AppError::unavailable(format!("model `{name}` failed to load: {e}"))),
            ModelState::Unloaded(why) => Err(AppError::unavailable(format!("model `{name}` is not loaded: {why}"))),
        }
    }

    /// What the loaded model's batcher counted since it loaded.
    pub fn counts(&self) -> Option<&BatchCounts> {
        match self.state.get() {
            Some(Loaded::Ready { metrics, .. }) => Some(&metrics.counts),
            _ => None,
        }
    }

    /// Whether model control has replaced this entry since it was resolved.
    pub fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Whether the server's readiness waits for this model: every one but those model control took out.
    pub fn expected(&self) -> bool {
        !matches!(self.state.get(), Some(Loaded::Unloaded(_)))
    }
}

/// The served models, where they come from, and what loads them.
pub struct Registry {
    repository: Repository,
    /// The object store the repository folder mirrors, if it is a mirror: model control and poll mode mirror it
    /// again before they read the folder.
    remote: Option<RemoteRepository>,
    /// What loads build engines with.
    settings: EngineSettings,
    /// Where each loaded version reports its batches.
    metrics: Arc<Metrics>,
    /// Sorted by name, then version. Replaced whole, so a reader's snapshot never changes under it. Replaced only
    /// by model control, which holds [`Registry::control`]; the start-up load sets the entries' states.
    models: RwLock<Arc<Vec<Arc<ModelEntry>>>>,
    /// Held by the start-up load and by model control: one load or unload at a time. Owned guards, so that a
    /// load holds it on the blocking pool even when the request that asked for it has gone.
    control: Arc<tokio::sync::Mutex<()>>,
    /// Poll mode: why its last reading of the repository did not bring everything in line; `None` when it did.
    /// Written by the poller alone.
    poll_problem: RwLock<Option<String>>,
}

impl Registry {
    /// A registry of `configs` (the repository's versions, none loaded yet).
    pub fn new(
        repository: Repository,
        configs: Vec<ModelConfig>,
        settings: EngineSettings,
        metrics: Arc<Metrics>,
    ) -> Registry {
        let mut models: Vec<Arc<ModelEntry>> = configs.into_iter().map(ModelEntry::new).collect();
        models.sort_by(|a, b| (a.name(), a.version()).cmp(&(b.name(), b.version())));
        Registry {
            repository,
            remote: None,
            settings,
            metrics,
            models: RwLock::new(Arc::new(models)),
            control: Arc::new(tokio::sync::Mutex::new(())),
            poll_problem: RwLock::new(None),
        }
    }

    /// The registry, its repository folder the mirror of `remote`.
    pub fn with_remote(mut self, remote: Option<RemoteRepository>) -> Registry {
        self.remote = remote;
        self
    }

    /// Where the models come from.
    pub fn repository(&self) -> &Repository {
        &self.repository
    }

    /// The object store the repository folder mirrors, if it does.
    pub fn remote(&self) -> Option<&RemoteRepository> {
        self.remote.as_ref()
    }

    /// Poll mode: why its last reading of the repository left something as it was, if it did.
    pub fn poll_problem(&self) -> Option<String> {
        self.poll_problem.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    pub fn set_poll_problem(&self, problem: Option<String>) {
        *self.poll_problem.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = problem;
    }

    /// The server's metrics, which the loaded versions report into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Every model version, as they are now.
    pub fn snapshot(&self) -> Arc<Vec<Arc<ModelEntry>>> {
        self.models.read().map(|m| m.clone()).unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// The names of the models `keep` keeps, each once (a model's versions share it), sorted.
    pub fn names(&self, keep: impl Fn(&ModelEntry) -> bool) -> Vec<String> {
        let mut names: Vec<String> = self.snapshot().iter().filter(|m| keep(m)).map(|m| m.name().to_owned()).collect();
        names.dedup();
        names
    }

    /// The version of `name` that routes without a version serve: the newest ready one, else the newest.
    pub fn find(&self, name: &str) -> Option<Arc<ModelEntry>> {
        let models = self.snapshot();
        let mut newest = None;
        for model in models.iter().rev().filter(|m| m.name() == name) {
            if model.loaded().is_some() {
                return Some(model.clone());
            }
            newest.get_or_insert_with(|| model.clone());
        }
        newest
    }

    /// The versions of `name` there are, ascending.
    pub fn versions(&self, name: &str) -> Vec<u64> {
        self.snapshot().iter().filter(|m| m.name() == name).map(|m| m.version()).collect()
    }

    /// Model `name`, version `version` or the one routes without a version serve; a 404 that lists what there is
    /// otherwise. The one lookup a request makes.
    pub fn resolve(&self, name: &str, version: Option<u64>) -> Result<Arc<ModelEntry>, AppError> {
        let found = match version {
            None => self.find(name),
            Some(v) => self.snapshot().iter().find(|m| m.name() == name && m.version() == v).cloned(),
        };
        found.ok_or_else(|| match (version, self.versions(name).as_slice()) {
            (Some(v), versions @ [_, ..]) => {
                AppError::not_found(format!("model `{}` has no version {v} (it has {versions:?})", quoted(name)))
            }
            _ => AppError::not_found(format!(
                "no model named `{}` (this server has {})",
                quoted(name),
                quoted_list(&self.names(|_| true))
            )),
        })
    }

    /// Loads every model version of the start-up repository, one after the other, until `stop` says the server
    /// is shutting down: those left are then marked failed. Blocking: run it on the blocking pool, holding
    /// [`Registry::control`].
    pub fn load_all(&self, stop: impl Fn() -> bool) {
        for entry in self.snapshot().iter() {
            let outcome = if stop() {
                Err("the server shut down before the model loaded".to_owned())
            } else {
                self.load_version(&entry.config).map_err(|e| format!("{e:#}"))
            };
            let loaded = match outcome {
                Ok(loaded) => loaded,
                Err(e) => {
                    tracing::error!(model = %entry.name(), version = entry.version(), error = %e, "model failed to load; the other models still serve");
                    Loaded::Failed(e)
                }
            };
            let _ = entry.state.set(loaded);
        }
    }

    /// Loads one version, its batches reported to the model's metrics. Blocking.
    fn load_version(&self, config: &ModelConfig) -> anyhow::Result<Loaded> {
        let metrics = self.metrics.batch_metrics(&config.name, config.instances);
        let model = inferd_models::load(config, &self.settings, metrics.clone());
        crate::alloc::give_back_free_memory();
        Ok(Loaded::Ready { model: Arc::new(model?), metrics })
    }

    /// Replaces every version of `name` with `with`; the entries `with` keeps stay as they are, the others retire.
    fn replace(&self, name: &str, with: Vec<Arc<ModelEntry>>) {
        let mut models = self.models.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (replaced, mut next): (Vec<Arc<ModelEntry>>, Vec<Arc<ModelEntry>>) =
            models.iter().cloned().partition(|m| m.name() == name);
        let kept = |m: &Arc<ModelEntry>| with.iter().any(|w| Arc::ptr_eq(w, m));
        replaced.iter().filter(|m| !kept(m)).for_each(|m| m.retired.store(true, Ordering::Release));
        next.extend(with);
        next.sort_by(|a, b| (a.name(), a.version()).cmp(&(b.name(), b.version())));
        *models = Arc::new(next);
    }
}

/// Names as messages list them: `a`, `b`.
pub fn quoted_list(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
