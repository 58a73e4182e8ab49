//! The models being served: one entry per version, each with its state. Every route reads a snapshot; the
//! start-up load and model control (`--model-control explicit`) change it, one change at a time. A reload swaps
//! a model's new versions in only once they are warm, so no request fails across it: requests that already
//! hold the old version finish on it, and its threads stop when the last of them is answered.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, RwLock};

use inferd_batcher::{BatchObserver, Batcher};
use inferd_core::{ModelConfig, MODEL_CONFIG_FILE};

use crate::repository::{load_model, Endpoint, EngineSettings};

/// One version of one model, and how far it got.
pub struct Model {
    pub config: ModelConfig,
    /// The name as the metrics label it, shared rather than copied per request.
    label: Arc<str>,
    /// Unset while loading; then set once.
    state: OnceLock<Loaded>,
}

enum Loaded {
    Ready(Endpoint),
    /// Loading failed at start-up: readiness waits for it.
    Failed(String),
    /// Unloaded by model control, or a load by model control failed: not served, and readiness does not wait.
    Unloaded(String),
}

/// A model's state, for routes and health.
pub enum ModelState<'a> {
    Loading,
    Ready(&'a Endpoint),
    Failed(&'a str),
    Unloaded(&'a str),
}

impl Model {
    pub fn new(config: ModelConfig) -> Arc<Model> {
        let label = Arc::from(config.name.as_str());
        Arc::new(Model { config, label, state: OnceLock::new() })
    }

    /// A model that is not served, and why.
    fn unloaded(config: ModelConfig, reason: String) -> Arc<Model> {
        let model = Model::new(config);
        let _ = model.state.set(Loaded::Unloaded(reason));
        model
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
            Some(Loaded::Ready(endpoint)) => ModelState::Ready(endpoint),
            Some(Loaded::Failed(e)) => ModelState::Failed(e),
            Some(Loaded::Unloaded(why)) => ModelState::Unloaded(why),
        }
    }

    /// Records the outcome of the start-up load (once).
    pub fn set_loaded(&self, outcome: Result<Endpoint, String>) {
        let loaded = match outcome {
            Ok(endpoint) => Loaded::Ready(endpoint),
            Err(e) => {
                tracing::error!(model = %self.name(), version = self.version(), error = %e, "model failed to load; the other models still serve");
                Loaded::Failed(e)
            }
        };
        let _ = self.state.set(loaded);
    }

    pub fn batcher(&self) -> Option<&Batcher> {
        self.endpoint().map(|e| &e.batcher)
    }

    pub fn endpoint(&self) -> Option<&Endpoint> {
        match self.state.get() {
            Some(Loaded::Ready(endpoint)) => Some(endpoint),
            _ => None,
        }
    }

    /// Whether the server's readiness waits for this model: every one but those model control took out.
    pub fn expected(&self) -> bool {
        !matches!(self.state.get(), Some(Loaded::Unloaded(_)))
    }
}

/// The served models and the repository folder they come from.
pub struct Registry {
    dir: PathBuf,
    /// Sorted by name, then version. Replaced whole, so a reader's snapshot never changes under it.
    models: RwLock<Arc<Vec<Arc<Model>>>>,
    /// Held by the start-up load and by model control: one load or unload at a time. Owned guards, so that a
    /// load holds it on the blocking pool even when the request that asked for it has gone.
    control: Arc<tokio::sync::Mutex<()>>,
}

/// Why model control could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

impl Registry {
    pub fn new(dir: PathBuf, mut models: Vec<Arc<Model>>) -> Registry {
        models.sort_by(|a, b| (a.name(), a.version()).cmp(&(b.name(), b.version())));
        Registry { dir, models: RwLock::new(Arc::new(models)), control: Arc::new(tokio::sync::Mutex::new(())) }
    }

    /// Every model version, as they are now.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Model>>> {
        self.models.read().map(|m| m.clone()).unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// The names of the models `keep` keeps, each once (a model's versions share it), sorted.
    pub fn names(&self, keep: impl Fn(&Model) -> bool) -> Vec<String> {
        let mut names: Vec<String> = self.snapshot().iter().filter(|m| keep(m)).map(|m| m.name().to_owned()).collect();
        names.dedup();
        names
    }

    /// The version of `name` that routes without a version serve: the newest ready one, else the newest.
    pub fn find(&self, name: &str) -> Option<Arc<Model>> {
        let models = self.snapshot();
        let mut newest = None;
        for model in models.iter().rev().filter(|m| m.name() == name) {
            if model.endpoint().is_some() {
                return Some(model.clone());
            }
            newest.get_or_insert_with(|| model.clone());
        }
        newest
    }

    /// Version `version` of `name`.
    pub fn find_version(&self, name: &str, version: u64) -> Option<Arc<Model>> {
        self.snapshot().iter().find(|m| m.name() == name && m.version() == version).cloned()
    }

    /// The versions of `name` there are, ascending.
    pub fn versions(&self, name: &str) -> Vec<u64> {
        self.snapshot().iter().filter(|m| m.name() == name).map(|m| m.version()).collect()
    }

    /// Replaces every version of `name` with `with`.
    fn replace(&self, name: &str, with: Vec<Arc<Model>>) {
        let mut models = self.models.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut next: Vec<Arc<Model>> = models.iter().filter(|m| m.name() != name).cloned().collect();
        next.extend(with);
        next.sort_by(|a, b| (a.name(), a.version()).cmp(&(b.name(), b.version())));
        *models = Arc::new(next);
    }

    /// Waits for model control to be free, and holds it.
    pub async fn control(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.control.clone().lock_owned().await
    }

    /// Holds model control if it is free now: the start-up load takes it before anything else can.
    pub fn try_control(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.control.clone().try_lock_owned().ok()
    }

    /// The folder of model `name` in the repository, if it has one. Names that could leave the repository
    /// (`..`, a path) are refused.
    fn folder(&self, name: &str) -> Result<PathBuf, ControlError> {
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        let dir = self.dir.join(name);
        if plain && dir.join(MODEL_CONFIG_FILE).is_file() {
            Ok(dir)
        } else {
            Err(ControlError::NotFound(format!(
                "no model `{}` in the repository {} (a folder holding a model.toml)",
                crate::codec::quoted(name),
                self.dir.display()
            )))
        }
    }

    /// The repository's model folders whose names this registry does not know.
    pub fn unknown_folders(&self) -> Vec<String> {
        let known = self.snapshot();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join(MODEL_CONFIG_FILE).is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !known.iter().any(|m| m.name() == name))
            .collect();
        names.sort();
        names
    }

    /// Reads `name`'s folder again and loads every version its policy serves. Once all are warm they replace
    /// what was served; if one fails, what was served stays as it was (a model that served nothing is then
    /// unavailable, with the reason). Returns the versions now served. Blocking: call it on the blocking pool,
    /// holding [`Registry::control`].
    pub fn load(
        &self,
        name: &str,
        settings: &EngineSettings,
        observer: &dyn Fn(&str) -> Arc<dyn BatchObserver>,
    ) -> Result<Vec<u64>, ControlError> {
        let dir = self.folder(name)?;
        let configs = ModelConfig::load_versions(&dir).map_err(|e| ControlError::Failed(e.to_string()))?;
        let serving = self.snapshot().iter().any(|m| m.name() == name && m.endpoint().is_some());
        if !serving {
            // A model that serves nothing shows as loading while it loads.
            self.replace(name, configs.iter().cloned().map(Model::new).collect());
        }
        let mut loaded = Vec::with_capacity(configs.len());
        for config in &configs {
            match load_model(config, settings, observer(name)) {
                Ok(endpoint) => loaded.push(endpoint),
                Err(e) => {
                    let error = format!("model `{name}` version {}: {e:#}", config.version);
                    tracing::error!(model = name, version = config.version, error = %e, "model control: load failed");
                    if !serving {
                        let reason = format!("the last load failed: {error}");
                        self.replace(name, configs.into_iter().map(|c| Model::unloaded(c, reason.clone())).collect());
                    }
                    return Err(ControlError::Failed(error));
                }
            }
        }
        let versions: Vec<u64> = configs.iter().map(|c| c.version).collect();
        let models = configs
            .into_iter()
            .zip(loaded)
            .map(|(config, endpoint)| {
                let model = Model::new(config);
                let _ = model.state.set(Loaded::Ready(endpoint));
                model
            })
            .collect();
        self.replace(name, models);
        tracing::info!(model = name, ?versions, "model control: loaded; the new versions serve from now on");
        Ok(versions)
    }

    /// Stops serving `name`: requests already queued or running finish, later ones are refused. Holding
    /// [`Registry::control`].
    pub fn unload(&self, name: &str) -> Result<(), ControlError> {
        let current: Vec<Arc<Model>> = self.snapshot().iter().filter(|m| m.name() == name).cloned().collect();
        if current.is_empty() {
            // A model of the repository that was never loaded is unloaded already.
            return self.folder(name).map(drop);
        }
        let unloaded = current.iter().map(|m| Model::unloaded(m.config.clone(), "unloaded".into())).collect();
        self.replace(name, unloaded);
        tracing::info!(model = name, "model control: unloaded; its queued requests finish");
        Ok(())
    }
}
