//! What every route shares: the models, the GPU snapshot, the metrics, the drain, the limits and the keys, and
//! the server's status as the probes report it.

use std::sync::Arc;
use std::time::Duration;

use inferd_core::Task;

use crate::budget::Budget;
use crate::codec::Limits;
use crate::config::{ModelControl, Secret, ServeConfig};
use crate::drain::Drain;
use crate::error::AppError;
use crate::gpu::{GpuInfo, GpuMonitor};
use crate::metrics::Metrics;
use crate::registry::{Model, ModelState, Registry};
use crate::repository::{Defaults, Endpoint, EngineSettings};

/// The app's state. Cheap to clone: one `Arc`.
#[derive(Clone)]
pub struct AppState(Arc<ServerState>);

/// Built once at start-up; after that only the models (model control), their states, the GPU snapshot, the
/// metrics and the drain phase change, each behind its own synchronisation.
struct ServerState {
    registry: Registry,
    /// The models that the routes without a model name serve: fixed at start-up.
    defaults: Defaults,
    /// What model control's loads build engines with.
    settings: EngineSettings,
    model_control: ModelControl,
    strict_readiness: bool,
    gpu: GpuMonitor,
    metrics: Metrics,
    drain: Arc<Drain>,
    require_gpu: bool,
    /// Whether NaN and infinities may pass in and out (`--allow-non-finite`).
    allow_non_finite: bool,
    /// How long a batch may run before its model counts as stalled (`--stall-timeout`).
    stall_timeout: Option<Duration>,
    /// The models reported stalled, so that the log says it once per stall. Only the watch writes it.
    stalled: std::sync::Mutex<Vec<String>>,
    max_body_bytes: usize,
    /// What inference requests hold at once (`--max-inflight-bytes`).
    budget: Budget,
    limits: Limits,
    /// Longest a request may take in all.
    request_timeout: Duration,
    /// Accepted API keys; none means the server is open.
    api_keys: Vec<Secret>,
    /// Whether /metrics needs a key too.
    protect_metrics: bool,
}

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

impl AppState {
    /// The state for `registry` under `config`; fails only where the API key file cannot be read.
    pub fn new(
        config: &ServeConfig,
        registry: Registry,
        defaults: Defaults,
        settings: EngineSettings,
        gpu: GpuMonitor,
    ) -> anyhow::Result<AppState> {
        let metrics = Metrics::new(&registry.names(|_| true));
        Ok(AppState(Arc::new(ServerState {
            defaults,
            settings,
            model_control: config.model_control,
            strict_readiness: config.strict_readiness,
            gpu,
            metrics,
            drain: Arc::new(Drain::new(config.drain_delay(), config.drain_timeout())),
            require_gpu: config.require_gpu,
            allow_non_finite: config.allow_non_finite,
            stall_timeout: config.stall_timeout(),
            stalled: std::sync::Mutex::new(Vec::new()),
            max_body_bytes: config.max_body_bytes,
            budget: Budget::new(config.max_inflight_bytes),
            limits: Limits {
                max_elements: config.max_elements,
                max_rows: config.max_rows,
                max_json_depth: config.max_json_depth,
            },
            request_timeout: config.request_timeout(),
            api_keys: config.api_keys()?,
            protect_metrics: config.protect_metrics,
            registry,
        })))
    }

    /// Every model version, as they are now.
    pub fn models(&self) -> Arc<Vec<Arc<Model>>> {
        self.0.registry.snapshot()
    }

    pub fn registry(&self) -> &Registry {
        &self.0.registry
    }

    pub fn engine_settings(&self) -> &EngineSettings {
        &self.0.settings
    }

    pub fn model_control(&self) -> ModelControl {
        self.0.model_control
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
        quoted_list(&self.0.registry.names(|m| m.config.task == Task::Embed))
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

    pub fn allow_non_finite(&self) -> bool {
        self.0.allow_non_finite
    }

    pub fn budget(&self) -> &Budget {
        &self.0.budget
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

    /// The model named `name` (the version routes without one serve), or a 404 that lists the models there are.
    pub fn model(&self, name: &str) -> Result<Arc<Model>, AppError> {
        self.find(name).ok_or_else(|| self.no_such_model(name))
    }

    fn no_such_model(&self, name: &str) -> AppError {
        AppError::not_found(format!(
            "no model named `{}` (this server has {})",
            crate::codec::quoted(name),
            self.model_names()
        ))
    }

    /// The model named `name`, if the server has one: the version routes without one serve.
    pub fn find(&self, name: &str) -> Option<Arc<Model>> {
        self.0.registry.find(name)
    }

    /// The models' names, quoted, for messages.
    pub fn model_names(&self) -> String {
        quoted_list(&self.0.registry.names(|_| true))
    }

    /// The model, loaded (its newest ready version), or why it is not.
    pub fn endpoint(&self, name: &str) -> Result<Endpoint, AppError> {
        self.endpoint_of(&*self.model(name)?)
    }

    /// Version `version` of the model, or the one routes without a version serve.
    pub fn model_version(&self, name: &str, version: Option<u64>) -> Result<Arc<Model>, AppError> {
        let Some(v) = version else { return self.model(name) };
        self.0.registry.find_version(name, v).ok_or_else(|| {
            let versions = self.0.registry.versions(name);
            if versions.is_empty() {
                self.no_such_model(name)
            } else {
                AppError::not_found(format!(
                    "model `{}` has no version {v} (it has {versions:?})",
                    crate::codec::quoted(name)
                ))
            }
        })
    }

    /// The model's loaded engines, or why it has none.
    pub fn endpoint_of(&self, model: &Model) -> Result<Endpoint, AppError> {
        let name = model.name();
        match model.state() {
            ModelState::Ready(endpoint) => Ok(endpoint.clone()),
            ModelState::Loading => Err(AppError::unavailable(format!("model `{name}` is still loading"))),
            ModelState::Failed(e) => Err(AppError::unavailable(format!("model `{name}` failed to load: {e}"))),
            ModelState::Unloaded(why) => Err(AppError::unavailable(format!("model `{name}` is not loaded: {why}"))),
        }
    }

    /// Why `model`'s engine counts as stalled: a batch has run past `--stall-timeout`.
    pub fn stall(&self, model: &Model) -> Option<String> {
        let limit = self.0.stall_timeout?;
        let running = model.batcher()?.longest_running().filter(|t| *t > limit)?;
        Some(format!(
            "model `{}`: a batch has run for {:.1} s (--stall-timeout {} s): its engine may be stalled",
            model.name(),
            running.as_secs_f64(),
            limit.as_secs_f64()
        ))
    }

    /// Logs each model that became stalled, once, and each that recovered. The server calls it every second.
    pub fn watch_stalls(&self) {
        let models = self.models();
        let mut reported = self.0.stalled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for model in models.iter() {
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

    /// Why the server is not ready, or `None` when it is.
    pub fn readiness(&self) -> Option<String> {
        let assessment = self.assess(&self.0.gpu.snapshot());
        (!assessment.ready).then(|| assessment.reason.unwrap_or_else(|| assessment.status.as_str().to_owned()))
    }

    /// The server's overall status, why it is not healthy, and whether it is ready. With
    /// `--strict-readiness true` it is ready when every model it is to serve is ready; with `false`, when at
    /// least one is. Models that model control unloaded do not count.
    pub fn assess(&self, gpus: &[GpuInfo]) -> Assessment {
        if self.0.drain.is_draining() {
            return Assessment {
                status: Status::Draining,
                reason: Some("the server is shutting down".into()),
                ready: false,
            };
        }
        let models = self.models();
        let (mut loading, mut failed, mut ready) = (None, None, 0usize);
        for model in models.iter().filter(|m| m.expected()) {
            match model.state() {
                ModelState::Loading => {
                    loading.get_or_insert_with(|| format!("model `{}` is still loading", model.name()));
                }
                ModelState::Failed(e) => {
                    failed.get_or_insert_with(|| format!("model `{}` failed to load: {e}", model.name()));
                }
                ModelState::Ready(_) => match self.stall(model) {
                    Some(why) => {
                        failed.get_or_insert(why);
                    }
                    None => ready += 1,
                },
                ModelState::Unloaded(_) => {}
            }
        }
        let gpu_missing = match self.0.require_gpu {
            false => None,
            true if gpus.is_empty() => Some("a GPU is required (--require-gpu), but none is visible".into()),
            true => models.iter().filter_map(|m| m.batcher()).find(|b| !b.metadata().on_gpu()).map(|b| {
                format!("a GPU is required (--require-gpu), but model `{}` runs on {}", b.name(), b.metadata().device)
            }),
        };
        let ready = if self.0.strict_readiness {
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
}

/// Names as messages list them: `a`, `b`.
fn quoted_list(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}
