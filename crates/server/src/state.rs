//! What every route shares: the models, the GPU snapshot, the metrics, the drain, the limits and the keys, and
//! the server's status as the probes report it.

use std::sync::Arc;
use std::time::Duration;

use inferd_core::Task;

use crate::codec::Limits;
use crate::config::{Secret, ServeConfig};
use crate::drain::Drain;
use crate::error::AppError;
use crate::gpu::{GpuInfo, GpuMonitor};
use crate::metrics::Metrics;
use crate::repository::{Defaults, Endpoint, Model, ModelState};

/// The app's state. Cheap to clone: one `Arc`.
#[derive(Clone)]
pub struct AppState(Arc<ServerState>);

/// Built once at start-up; after that only the models' states, the GPU snapshot, the metrics and the drain
/// phase change, each behind its own synchronisation.
struct ServerState {
    /// Sorted by name.
    models: Vec<Arc<Model>>,
    /// The model `/predict` serves, if it is determined.
    defaults: Defaults,
    gpu: GpuMonitor,
    metrics: Metrics,
    drain: Arc<Drain>,
    require_gpu: bool,
    max_body_bytes: usize,
    limits: Limits,
    /// Longest a request may take in all.
    request_timeout: Duration,
    /// Accepted API keys; none means the server is open.
    api_keys: Vec<Secret>,
    /// Whether /metrics needs a key too.
    protect_metrics: bool,
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

impl AppState {
    /// The state for `models` under `config`; fails only where the API key file cannot be read.
    pub fn new(
        config: &ServeConfig,
        models: Vec<Arc<Model>>,
        defaults: Defaults,
        gpu: GpuMonitor,
    ) -> anyhow::Result<AppState> {
        let names: Vec<&str> = models.iter().map(|m| m.name()).collect();
        let metrics = Metrics::new(&names);
        Ok(AppState(Arc::new(ServerState {
            defaults,
            gpu,
            metrics,
            drain: Arc::new(Drain::new(config.drain_delay(), config.drain_timeout())),
            require_gpu: config.require_gpu,
            max_body_bytes: config.max_body_bytes,
            limits: Limits {
                max_elements: config.max_elements,
                max_rows: config.max_rows,
                max_json_depth: config.max_json_depth,
            },
            request_timeout: config.request_timeout(),
            api_keys: config.api_keys()?,
            protect_metrics: config.protect_metrics,
            models,
        })))
    }

    pub fn models(&self) -> &[Arc<Model>] {
        &self.0.models
    }

    pub fn default_model(&self) -> Option<&str> {
        self.0.defaults.model.as_deref()
    }

    /// The model that `/embed` serves, if there is one.
    pub fn default_embed_model(&self) -> Option<&str> {
        self.0.defaults.embed.as_deref()
    }

    /// The names of the models that embed text, quoted.
    pub fn text_model_names(&self) -> String {
        let names = self.0.models.iter().filter(|m| m.config.task == Task::Embed).map(|m| format!("`{}`", m.name()));
        names.collect::<Vec<_>>().join(", ")
    }

    pub fn gpu(&self) -> &GpuMonitor {
        &self.0.gpu
    }

    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub fn drain(&self) -> &Arc<Drain> {
        &self.0.drain
    }

    pub fn max_body_bytes(&self) -> usize {
        self.0.max_body_bytes
    }

    pub fn limits(&self) -> &Limits {
        &self.0.limits
    }

    pub fn request_timeout(&self) -> Duration {
        self.0.request_timeout
    }

    pub fn api_keys(&self) -> &[Secret] {
        &self.0.api_keys
    }

    pub fn protect_metrics(&self) -> bool {
        self.0.protect_metrics
    }

    /// The model named `name`, or a 404 that lists the models there are.
    pub fn model(&self, name: &str) -> Result<&Arc<Model>, AppError> {
        self.find(name).ok_or_else(|| {
            AppError::not_found(format!(
                "no model named `{}` (this server has {})",
                crate::codec::quoted(name),
                self.model_names()
            ))
        })
    }

    /// The model named `name`, if the server has one.
    pub fn find(&self, name: &str) -> Option<&Arc<Model>> {
        self.0.models.iter().find(|m| m.name() == name)
    }

    /// The models' names, quoted, for messages.
    pub fn model_names(&self) -> String {
        self.0.models.iter().map(|m| format!("`{}`", m.name())).collect::<Vec<_>>().join(", ")
    }

    /// The model, loaded, or why it is not.
    pub fn endpoint(&self, name: &str) -> Result<Endpoint, AppError> {
        match self.model(name)?.state() {
            ModelState::Ready(endpoint) => Ok(endpoint.clone()),
            ModelState::Loading => Err(AppError::unavailable(format!("model `{name}` is still loading"))),
            ModelState::Failed(e) => Err(AppError::unavailable(format!("model `{name}` failed to load: {e}"))),
        }
    }

    /// Why the server is not ready, or `None` when it is.
    pub fn readiness(&self) -> Option<String> {
        match self.assess(&self.0.gpu.snapshot()) {
            (Status::Healthy, _) => None,
            (status, reason) => Some(reason.unwrap_or_else(|| status.as_str().to_owned())),
        }
    }

    /// The server's overall status and, when not ready, why.
    pub fn assess(&self, gpus: &[GpuInfo]) -> (Status, Option<String>) {
        if self.0.drain.is_draining() {
            return (Status::Draining, Some("the server is shutting down".into()));
        }
        let mut degraded = None;
        for model in &self.0.models {
            match model.state() {
                ModelState::Loading => {
                    return (Status::Starting, Some(format!("model `{}` is still loading", model.name())))
                }
                ModelState::Failed(e) => {
                    degraded.get_or_insert_with(|| format!("model `{}` failed to load: {e}", model.name()));
                }
                ModelState::Ready(_) => {}
            }
        }
        if degraded.is_none() && self.0.require_gpu {
            degraded = if gpus.is_empty() {
                Some("a GPU is required (--require-gpu), but none is visible".into())
            } else {
                self.0.models.iter().filter_map(|m| m.batcher()).find(|b| !b.metadata().on_gpu()).map(|b| {
                    format!(
                        "a GPU is required (--require-gpu), but model `{}` runs on {}",
                        b.name(),
                        b.metadata().device
                    )
                })
            };
        }
        match degraded {
            Some(reason) => (Status::Degraded, Some(reason)),
            None => (Status::Healthy, None),
        }
    }
}
