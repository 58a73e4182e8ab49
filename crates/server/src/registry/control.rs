//! Model control (`--model-control explicit`): loading a model again from its folder, and unloading it, one
//! change at a time. A reload swaps a model's new versions in only once they are warm, so no request fails
//! across it: requests that already hold the old version finish on it, and its threads stop when the last of
//! them is answered.

use std::sync::Arc;

use inferd_core::ModelConfig;

use super::{ControlError, Loaded, ModelEntry, ModelState, Registry};
use crate::codec::quoted;

impl Registry {
    /// Waits for model control to be free, and holds it.
    pub async fn control(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.control.clone().lock_owned().await
    }

    /// Holds model control if it is free now: the start-up load takes it before anything else can.
    pub fn try_control(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.control.clone().try_lock_owned().ok()
    }

    /// Model `name`'s folder in the repository.
    fn folder(&self, name: &str) -> Result<std::path::PathBuf, ControlError> {
        self.repository.model_folder(name).ok_or_else(|| {
            ControlError::NotFound(format!(
                "no model `{}` in the repository {} (a folder holding a model.toml)",
                quoted(name),
                self.repository.dir().display()
            ))
        })
    }

    /// The repository's model folders whose names this registry does not know. Reads the folder: blocking.
    pub fn unknown_folders(&self) -> Vec<String> {
        let known = self.snapshot();
        let mut names = self.repository.model_folders();
        names.retain(|name| !known.iter().any(|m| m.name() == name));
        names
    }

    /// Reads `name`'s folder again and loads every version its policy serves. Once all are warm they replace
    /// what was served; if one fails, what was served stays as it was (a model that served nothing is then
    /// unavailable, with the reason). Returns the versions now served. Blocking: call it on the blocking pool,
    /// holding [`Registry::control`].
    pub fn load(&self, name: &str) -> Result<Vec<u64>, ControlError> {
        let configs =
            ModelConfig::load_versions(&self.folder(name)?).map_err(|e| ControlError::Failed(e.to_string()))?;
        let serving = self.snapshot().iter().any(|m| m.name() == name && m.loaded().is_some());
        if !serving {
            // A model that serves nothing shows as loading while it loads.
            self.replace(name, configs.iter().cloned().map(ModelEntry::new).collect());
        }
        let mut loaded = Vec::with_capacity(configs.len());
        for config in &configs {
            match self.load_version(config) {
                Ok(version) => loaded.push(version),
                Err(e) => {
                    let error = format!("model `{name}` version {}: {e:#}", config.version);
                    tracing::error!(model = name, version = config.version, error = %e, "model control: load failed");
                    if !serving {
                        let reason = format!("the last load failed: {error}");
                        let failed = configs.into_iter().map(|c| ModelEntry::with(c, Loaded::Unloaded(reason.clone())));
                        self.replace(name, failed.collect());
                    }
                    return Err(ControlError::Failed(error));
                }
            }
        }
        let versions: Vec<u64> = configs.iter().map(|c| c.version).collect();
        let entries = configs.into_iter().zip(loaded).map(|(config, loaded)| ModelEntry::with(config, loaded));
        self.replace(name, entries.collect());
        tracing::info!(model = name, ?versions, "model control: loaded; the new versions serve from now on");
        Ok(versions)
    }

    /// Poll mode: makes `name`'s versions what its folder holds now. A version that serves and whose files did not
    /// change (`changed` says no) serves on untouched; the others load, and replace what served once all are warm.
    /// A version that fails to load leaves what served serving, and shows as unavailable with the reason (the
    /// error returned too). A model whose folder is gone is unloaded. Blocking: call it on the blocking pool,
    /// holding [`Registry::control`].
    pub fn refresh(&self, name: &str, changed: &dyn Fn(u64) -> bool) -> Result<(), ControlError> {
        let current: Vec<Arc<ModelEntry>> = self.snapshot().iter().filter(|m| m.name() == name).cloned().collect();
        let Some(folder) = self.repository.model_folder(name) else {
            self.replace(name, current.iter().map(|m| m.unloaded("its folder left the repository")).collect());
            tracing::info!(model = name, "poll: its folder left the repository; unloaded, its queued requests finish");
            return Ok(());
        };
        // A model new to the registry shows once it is loaded: were it listed as loading first, a strict readiness would
        // fail on every replica at once while it loads.
        let configs = ModelConfig::load_versions(&folder).map_err(|e| ControlError::Failed(e.to_string()))?;
        let serving = |version| current.iter().find(|m| m.version() == version && m.loaded().is_some());
        let mut next: Vec<Arc<ModelEntry>> = Vec::with_capacity(configs.len());
        let mut failed = Vec::new();
        for config in configs {
            if let Some(old) = serving(config.version).filter(|_| !changed(config.version)) {
                next.push(old.clone());
                continue;
            }
            match self.load_version(&config) {
                Ok(loaded) => next.push(ModelEntry::with(config, loaded)),
                Err(e) => {
                    tracing::error!(model = name, version = config.version, error = %e, "poll: load failed");
                    failed.push((config, format!("{e:#}")));
                }
            }
        }
        let has = |next: &[Arc<ModelEntry>], version| next.iter().any(|m| m.version() == version);
        let mut errors = Vec::with_capacity(failed.len());
        if !failed.is_empty() {
            // What served, and was not loaded anew, serves on.
            for old in current.iter().filter(|m| m.loaded().is_some()) {
                if !has(&next, old.version()) {
                    next.push(old.clone());
                }
            }
            for (config, error) in failed {
                let error = format!("model `{name}` version {} failed to load: {error}", config.version);
                if !has(&next, config.version) {
                    next.push(ModelEntry::with(config, Loaded::Unloaded(error.clone())));
                }
                errors.push(error);
            }
        }
        // A version no longer in the folder (or left out by its policy) shows as unloaded, as Triton's index shows it.
        for old in &current {
            if !has(&next, old.version()) {
                let why = match old.state() {
                    ModelState::Unloaded(why) => why.to_owned(),
                    _ => "its version folder left the repository, or its version_policy leaves it out".to_owned(),
                };
                next.push(old.unloaded(why));
            }
        }
        let versions: Vec<u64> = next.iter().filter(|m| m.loaded().is_some()).map(|m| m.version()).collect();
        self.replace(name, next);
        tracing::info!(model = name, serving = ?versions, "poll: the model's folder changed; brought in line");
        match errors.is_empty() {
            true => Ok(()),
            false => Err(ControlError::Failed(errors.join("; "))),
        }
    }

    /// Stops serving `name`: requests already queued or running finish, later ones are refused. Holding
    /// [`Registry::control`].
    pub fn unload(&self, name: &str) -> Result<(), ControlError> {
        let current: Vec<Arc<ModelEntry>> = self.snapshot().iter().filter(|m| m.name() == name).cloned().collect();
        if current.is_empty() {
            // A model of the repository that was never loaded is unloaded already.
            return self.folder(name).map(drop);
        }
        self.replace(name, current.iter().map(|m| m.unloaded("unloaded")).collect());
        tracing::info!(model = name, "model control: unloaded; its queued requests finish");
        Ok(())
    }
}
