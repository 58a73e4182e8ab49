//! What every route shares: the registry of models, the GPU snapshot, the metrics, the drain, the limits and the
//! keys. Built once at start-up; after that only the models (the registry's), the GPU snapshot, the metrics and
//! the drain phase change, each behind its own synchronisation.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use inferd_models::Defaults;
use subtle::ConstantTimeEq;

use crate::budget::Budget;
use crate::codec::Limits;
use crate::config::{ModelControl, Secret, ServeConfig};
use crate::drain::Drain;
use crate::error::{AppError, ErrorKind};
use crate::gpu::{GpuInfo, GpuMonitor};
use crate::metrics::Metrics;
use crate::registry::readiness::{self, Assessment, ReadinessPolicy, StallWatch};
use crate::registry::{ModelEntry, Registry};
use crate::shm::SharedMemory;
use crate::trace::Traces;

/// The app's state. Cheap to clone: one `Arc`.
#[derive(Clone)]
pub struct AppState(Arc<ServerState>);

struct ServerState {
    registry: Registry,
    /// The models that the routes without a model name serve: fixed at start-up.
    defaults: Defaults,
    model_control: ModelControl,
    readiness: ReadinessPolicy,
    stalls: StallWatch,
    gpu: GpuMonitor,
    metrics: Arc<Metrics>,
    drain: Arc<Drain>,
    /// Whether NaN and infinities may pass in and out (`--allow-non-finite`).
    allow_non_finite: bool,
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
    /// The origins whose pages may call the API (CORS); none: no CORS headers.
    cors_allow_origin: Vec<String>,
    /// Vertex AI's prediction and health routes, where its environment names them.
    vertex_routes: (Option<String>, Option<String>),
    /// The system shared-memory regions clients registered.
    shared_memory: Arc<SharedMemory>,
    /// Which requests are traced (the trace extension's settings).
    traces: Traces,
}

impl AppState {
    /// The state for `registry` under `config`; fails only where the API key file cannot be read.
    pub fn new(
        config: &ServeConfig,
        registry: Registry,
        defaults: Defaults,
        gpu: GpuMonitor,
    ) -> anyhow::Result<AppState> {
        // One set of metrics: the one the registry's models report into.
        let metrics = registry.metrics().clone();
        Ok(AppState(Arc::new(ServerState {
            registry,
            defaults,
            model_control: config.model_control,
            readiness: ReadinessPolicy { strict: config.strict_readiness, require_gpu: config.require_gpu },
            stalls: StallWatch::new(config.stall_timeout()),
            gpu,
            metrics: metrics.clone(),
            drain: Arc::new(Drain::new(config.drain_delay(), config.drain_timeout())),
            allow_non_finite: config.allow_non_finite,
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
            cors_allow_origin: config.cors_allow_origin.clone(),
            vertex_routes: (config.aip_predict_route.clone(), config.aip_health_route.clone()),
            shared_memory: Arc::new(SharedMemory::new(config.allow_client_shm, metrics.clone())),
            traces: Traces::default(),
        })))
    }

    pub fn registry(&self) -> &Registry {
        &self.0.registry
    }

    /// Every model version, as they are now.
    pub fn models(&self) -> Arc<Vec<Arc<ModelEntry>>> {
        self.0.registry.snapshot()
    }

    pub fn defaults(&self) -> &Defaults {
        &self.0.defaults
    }

    pub fn model_control(&self) -> ModelControl {
        self.0.model_control
    }

    pub fn stalls(&self) -> &StallWatch {
        &self.0.stalls
    }

    pub fn gpu(&self) -> &GpuMonitor {
        &self.0.gpu
    }

    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub fn shared_memory(&self) -> &Arc<SharedMemory> {
        &self.0.shared_memory
    }

    pub fn traces(&self) -> &Traces {
        &self.0.traces
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

    /// `work`'s outcome, or `refuse`'s answer to the error that ends it first: `--request-timeout`, or the end of
    /// the drain. Every protocol's requests pass through this once.
    pub async fn bounded<T>(&self, work: impl Future<Output = T>, refuse: impl FnOnce(AppError) -> T) -> T {
        let timeout = self.0.request_timeout;
        tokio::select! {
            done = work => done,
            () = tokio::time::sleep(timeout) => refuse(AppError::unavailable(format!(
                "the request took longer than {} s (--request-timeout)", timeout.as_secs_f64()
            ))),
            () = self.0.drain.expired() => refuse(AppError::unavailable(
                "the server shut down before the request finished (--drain-timeout)"
            )),
        }
    }

    pub fn api_keys(&self) -> &[Secret] {
        &self.0.api_keys
    }

    /// The origins whose pages may call the API (`--cors-allow-origin`).
    pub fn cors_allow_origin(&self) -> &[String] {
        &self.0.cors_allow_origin
    }

    /// Vertex AI's prediction and health routes (`AIP_PREDICT_ROUTE`, `AIP_HEALTH_ROUTE`), where given.
    pub fn vertex_routes(&self) -> (Option<&str>, Option<&str>) {
        (self.0.vertex_routes.0.as_deref(), self.0.vertex_routes.1.as_deref())
    }

    /// Lets a request through when no key is configured or it carries one of the keys. Keys are compared in
    /// constant time, every key every time. gRPC sends the key the same way, in its metadata.
    pub fn authorize(&self, headers: &axum::http::HeaderMap) -> Result<(), AppError> {
        let keys = self.api_keys();
        if keys.is_empty() {
            return Ok(());
        }
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim().as_bytes());
        let Some(given) = given else {
            return Err(AppError::new(
                ErrorKind::Unauthorized,
                "this route needs an API key: send `Authorization: Bearer <key>`",
            ));
        };
        let accepted = keys.iter().fold(subtle::Choice::from(0), |ok, key| ok | key.expose().as_bytes().ct_eq(given));
        if bool::from(accepted) {
            Ok(())
        } else {
            Err(AppError::new(ErrorKind::Unauthorized, "the API key is not valid"))
        }
    }

    pub fn protect_metrics(&self) -> bool {
        self.0.protect_metrics
    }

    /// The server's status and readiness now, given the GPUs seen (see [`readiness::assess`]).
    pub fn assess(&self, gpus: &[GpuInfo]) -> Assessment {
        readiness::assess(&self.models(), self.0.readiness, self.0.drain.is_draining(), gpus, &self.0.stalls)
    }

    /// Why the server is not ready, or `None` when it is.
    pub fn readiness(&self) -> Option<String> {
        let assessment = self.assess(&self.0.gpu.snapshot());
        (!assessment.ready).then(|| assessment.reason.unwrap_or_else(|| assessment.status.as_str().to_owned()))
    }
}
