//! The repository's index and model control, in Triton's terms: every model version with its state, and loading
//! or unloading a model while the server runs (`--model-control explicit`).

use crate::codec::quoted;
use crate::codec::v2::models::V2IndexEntry;
use crate::config::ModelControl;
use crate::error::AppError;
use crate::registry::{ControlError, ModelState};
use crate::state::AppState;

/// Every model version with its state and, under `--model-control explicit`, the model folders added since
/// start-up (`UNAVAILABLE`, not loaded); only the ready ones with `ready_only`.
pub async fn index(state: &AppState, ready_only: bool) -> Result<Vec<V2IndexEntry>, AppError> {
    let models = state.registry().snapshot();
    let mut index: Vec<V2IndexEntry> = models
        .iter()
        .map(|m| {
            let (state, reason) = match m.state() {
                ModelState::Ready(_) => ("READY", ""),
                ModelState::Loading => ("LOADING", ""),
                ModelState::Failed(e) | ModelState::Unloaded(e) => ("UNAVAILABLE", e),
            };
            V2IndexEntry { name: m.name().into(), version: m.version().to_string(), state, reason: reason.into() }
        })
        .collect();
    if state.model_control() == ModelControl::Explicit {
        // Reads the repository folder: on the blocking pool.
        let reader = state.clone();
        let unknown = tokio::task::spawn_blocking(move || reader.registry().unknown_folders())
            .await
            .map_err(|e| AppError::internal(format!("reading the repository failed: {e}")))?;
        index.extend(unknown.into_iter().map(|name| V2IndexEntry {
            name,
            version: String::new(),
            state: "UNAVAILABLE",
            reason: "not loaded".into(),
        }));
    }
    index.retain(|e| !ready_only || e.state == "READY");
    Ok(index)
}

/// Model control answers only under `--model-control explicit`, and not while the server drains.
pub fn control_allowed(state: &AppState) -> Result<(), AppError> {
    match state.model_control() {
        ModelControl::Explicit => {}
        ModelControl::Poll => {
            return Err(AppError::bad_request(
                "model control is `poll`: what the repository holds is what serves; start inferd with \
                 --model-control explicit to load and unload models by request",
            ))
        }
        ModelControl::None => {
            return Err(AppError::bad_request(
                "model control is off: start inferd with --model-control explicit to load and unload models",
            ))
        }
    }
    if state.drain().is_draining() {
        return Err(AppError::unavailable("the server is shutting down"));
    }
    Ok(())
}

fn control_error(e: ControlError) -> AppError {
    match e {
        ControlError::NotFound(m) => AppError::not_found(m),
        ControlError::Failed(m) => AppError::bad_request(format!("failed to load: {m}")),
    }
}

/// Loads model `name`, or loads it again, from its folder (see [`crate::registry::Registry::load`]); returns
/// once it is ready. The client's `parameter`s, a configuration or files sent with the request, are refused: the
/// folder is the truth.
pub async fn load<'a>(
    state: &AppState,
    name: String,
    mut parameters: impl Iterator<Item = &'a str>,
) -> Result<(), AppError> {
    control_allowed(state)?;
    if let Some(key) = parameters.next() {
        return Err(AppError::bad_request(format!(
            "load parameter `{}` is not supported: inferd loads what the model's folder holds",
            quoted(key)
        )));
    }
    let control = state.registry().control().await;
    let worker = state.clone();
    // A task of its own, holding model control until the load ends, even if the request is dropped first (its client
    // gone, its timeout): a remote repository is mirrored again, then the folder loads on the blocking pool.
    let loading = tokio::spawn(async move {
        let _control = control;
        crate::poll::mirror_again(&worker).await.map_err(|e| AppError::unavailable(format!("failed to load: {e}")))?;
        tokio::task::spawn_blocking(move || worker.registry().load(&name))
            .await
            .map_err(|e| AppError::internal(format!("the load task failed: {e}")))?
            .map(drop)
            .map_err(control_error)
    });
    loading.await.map_err(|e| AppError::internal(format!("the load task failed: {e}")))?
}

/// Unloads model `name`: requests already queued finish; later ones are refused (503) until it is loaded again.
pub async fn unload(state: &AppState, name: &str) -> Result<(), AppError> {
    control_allowed(state)?;
    let _control = state.registry().control().await;
    state.registry().unload(name).map_err(control_error)
}
