//! What the models' states make of the server: its status and readiness as the probes say them, and the watch
//! for engines stalled on a batch. Pure readings of a snapshot, so each rule is tested on its own.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{ModelEntry, ModelState};
use crate::gpu::GpuInfo;

/// The server's status and readiness, as the probes say them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub status: Status,
    /// Why the status is not `healthy`.
    pub reason: Option<String>,
    /// Whether the server takes traffic: `/health/ready` answers 200.
    pub ready: bool,
}

/// The server's overall status, as `/health` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Healthy,
    Starting,
    Degraded,
    Draining,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Healthy => "healthy",
            Status::Starting => "starting",
            Status::Degraded => "degraded",
            Status::Draining => "draining",
        }
    }
}

/// What readiness asks of the models (`--strict-readiness`, `--require-gpu`).
#[derive(Debug, Clone, Copy)]
pub struct ReadinessPolicy {
    /// Ready when every model to serve is ready; otherwise when at least one is.
    pub strict: bool,
    /// A model that runs on the CPU, or no GPU at all, degrades the server.
    pub require_gpu: bool,
}

/// The server's overall status, why it is not healthy, and whether it is ready, from the models' states. Models
/// that model control unloaded do not count.
pub fn assess(
    models: &[Arc<ModelEntry>],
    policy: ReadinessPolicy,
    draining: bool,
    gpus: &[GpuInfo],
    stalls: &StallWatch,
) -> Assessment {
    if draining {
        return Assessment {
            status: Status::Draining,
            reason: Some("the server is shutting down".into()),
            ready: false,
        };
    }
    let (mut loading, mut failed, mut ready) = (None, None, 0usize);
    for model in models.iter().filter(|m| m.expected()) {
        match model.state() {
            ModelState::Loading => {
                loading.get_or_insert_with(|| format!("model `{}` is still loading", model.name()));
            }
            ModelState::Failed(e) => {
                failed.get_or_insert_with(|| format!("model `{}` failed to load: {e}", model.name()));
            }
            ModelState::Ready(_) => match stalls.stall(model) {
                Some(why) => {
                    failed.get_or_insert(why);
                }
                None => ready += 1,
            },
            ModelState::Unloaded(_) => {}
        }
    }
    let gpu_missing = match policy.require_gpu {
        false => None,
        true if gpus.is_empty() => Some("a GPU is required (--require-gpu), but none is visible".into()),
        true => models.iter().filter_map(|m| m.loaded()).find(|m| !m.engine_metadata().on_gpu()).map(|m| {
            format!(
                "a GPU is required (--require-gpu), but model `{}` runs on {}",
                m.name(),
                m.engine_metadata().device
            )
        }),
    };
    let ready = if policy.strict {
        loading.is_none() && failed.is_none() && gpu_missing.is_none()
    } else {
        ready > 0 && gpu_missing.is_none()
    };
    let (status, reason) = match (loading, failed.or(gpu_missing)) {
        (Some(loading), _) => (Status::Starting, Some(loading)),
        (None, Some(degraded)) => (Status::Degraded, Some(degraded)),
        (None, None) => (Status::Healthy, None),
    };
    Assessment { status, reason, ready }
}

/// The watch for stalled engines (`--stall-timeout`): a model whose batch has run longer counts as stalled.
pub struct StallWatch {
    timeout: Option<Duration>,
    /// The model versions reported stalled, so that the log says it once per stall. Only [`StallWatch::watch`]
    /// writes it.
    reported: Mutex<Vec<String>>,
}

impl StallWatch {
    /// No watch where `timeout` is `None`.
    pub fn new(timeout: Option<Duration>) -> Self {
        StallWatch { timeout, reported: Mutex::new(Vec::new()) }
    }

    /// Why `model`'s engine counts as stalled: a batch has run past the timeout.
    pub fn stall(&self, model: &ModelEntry) -> Option<String> {
        let limit = self.timeout?;
        let running = model.loaded()?.batchers().filter_map(|b| b.longest_running()).max().filter(|t| *t > limit)?;
        Some(format!(
            "model `{}`: a batch has run for {:.1} s (--stall-timeout {} s): its engine may be stalled",
            model.name(),
            running.as_secs_f64(),
            limit.as_secs_f64()
        ))
    }

    /// Logs each model that became stalled, once, and each that recovered. The server calls it every second.
    pub fn watch(&self, models: &[Arc<ModelEntry>]) {
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        for model in models {
            let key = format!("{}/{}", model.name(), model.version());
            let known = reported.contains(&key);
            match self.stall(model) {
                Some(why) if !known => {
                    tracing::error!(model = model.name(), version = model.version(), reason = %why, "model stalled: readiness fails until its batch ends");
                    reported.push(key);
                }
                None if known => {
                    tracing::info!(model = model.name(), version = model.version(), "model no longer stalled");
                    reported.retain(|k| *k != key);
                }
                _ => {}
            }
        }
    }
}
