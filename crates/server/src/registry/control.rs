//! Model control (`--model-control explicit`): loading a model again from its folder, and unloading it, one
//! change at a time. A reload swaps a model's new versions in only once they are warm, so no request fails
//! across it: requests that already hold the old version finish on it, and its threads stop when the last of
//! them is answered.

use std::sync::Arc;

use inferd_core::ModelConfig;

use super::{ControlError, Loaded, ModelEntry, Registry};
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

    /// Stops serving `name`: requests already queued or running finish, later ones are refused. Holding
    /// [`Registry::control`].
    pub fn unload(&self, name: &str) -> Result<(), ControlError> {
        let current: Vec<Arc<ModelEntry>> = self.snapshot().iter().filter(|m| m.name() == name).cloned().collect();
        if current.is_empty() {
            // A model of the repository that was never loaded is unloaded already.
            return self.folder(name).map(drop);
        }
        let unloaded =
            current.iter().map(|m| ModelEntry::with(m.config.clone(), Loaded::Unloaded("unloaded".into()))).collect();
        self.replace(name, unloaded);
        tracing::info!(model = name, "model control: unloaded; its queued requests finish");
        Ok(())
    }
}
