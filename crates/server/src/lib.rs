//! inferd-server: configuration, the model repository, the HTTP routes, the GPU probe and a graceful shutdown.
//!
//! [`Server::serve`] is the whole server over a listener the caller bound, stopping when a future resolves;
//! `main` adds only the command line, telemetry and the signals.

pub mod codec;
pub mod config;
pub mod error;
pub mod gpu;
pub mod http;
pub mod metrics;
pub mod models;
mod openapi;
pub mod v2;

use std::future::{Future, IntoFuture};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use inferd_core::Backend;
use inferd_onnx::OnnxSettings;
use tokio::net::TcpListener;

pub use config::{Cli, Command, HealthcheckConfig, LogFormat, Secret, ServeConfig};
pub use gpu::{FakeGpuProbe, GpuInfo, GpuProbe, NoGpu, NvmlProbe};
pub use http::{
    app, AppState, BATCH_SIZE_HEADER, COMPUTE_TIME_HEADER, QUEUE_TIME_HEADER, REQUEST_ID_HEADER, TIMEOUT_HEADER,
};
pub use models::EngineBuilder;

use crate::gpu::GpuMonitor;
use crate::models::{EngineSettings, Model};

/// The server, built from its configuration; [`Server::serve`] runs it.
pub struct Server {
    config: ServeConfig,
    gpu_probe: Option<Arc<dyn GpuProbe>>,
    engine_builder: Option<EngineBuilder>,
}

impl Server {
    pub fn new(config: ServeConfig) -> Self {
        Server { config, gpu_probe: None, engine_builder: None }
    }

    /// Replaces the system's GPU probe (NVML where present), for tests.
    pub fn with_gpu_probe(mut self, probe: Arc<dyn GpuProbe>) -> Self {
        self.gpu_probe = Some(probe);
        self
    }

    /// Builds every model's engines with `builder` instead of its backend, for tests.
    pub fn with_engine_builder(mut self, builder: EngineBuilder) -> Self {
        self.engine_builder = Some(builder);
        self
    }

    /// Serves on `listener` until `shutdown` resolves, then drains: readiness fails at once; requests are still
    /// served for `--drain-delay`, so that load balancers notice; then no new connections are taken, and what is
    /// in flight or queued gets `--drain-timeout` to finish; whatever is left after that is answered 503. Models
    /// load in the background, so the probes answer (`starting`) from the first moment.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let config = self.config;
        let repository = config.repository();
        let configs = models::discover(&repository)?;
        let default_model = match (&config.default_model, configs.as_slice()) {
            (Some(name), _) if !configs.iter().any(|c| &c.name == name) => {
                anyhow::bail!("--default-model `{name}` is not a model in {}", repository.display())
            }
            (Some(name), _) => Some(name.clone()),
            (None, [only]) => Some(only.name.clone()),
            (None, _) => None,
        };
        let onnx_instances: usize =
            configs.iter().filter(|c| c.backend == Backend::Onnx).map(|c| c.instances).sum::<usize>().max(1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let settings = EngineSettings {
            onnx: OnnxSettings {
                library: config.onnxruntime_lib.clone(),
                default_intra_op_threads: config.intra_op_threads.unwrap_or((cores / onnx_instances).max(1)),
            },
            default_precision: config.default_precision(),
            builder: self.engine_builder,
        };
        let models: Vec<Arc<Model>> = configs.into_iter().map(Model::new).collect();
        let gpu = GpuMonitor::new(self.gpu_probe.unwrap_or_else(gpu::system_probe));
        gpu.refresh().await;
        let state = AppState::new(http::Shared::new(&config, models.clone(), default_model, gpu.clone())?);

        let refresher = tokio::spawn(gpu.refresh_every(Duration::from_millis(config.gpu_refresh_ms)));
        let upkeep = {
            let state = state.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(metrics::UPKEEP_PERIOD);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticks.tick().await;
                    state.shared().metrics.upkeep();
                }
            })
        };
        // Loading runs on the blocking pool and cannot be cancelled midway; once shutdown begins it loads no more.
        {
            let state = state.clone();
            tokio::task::spawn_blocking(move || {
                for model in &state.shared().models {
                    if state.shared().draining.load(Ordering::SeqCst) {
                        model.set_loaded(Err("the server shut down before the model loaded".into()));
                    } else {
                        let observer = state.shared().metrics.batch_observer(model.name());
                        model.set_loaded(models::load_model(&model.config, &settings, observer));
                    }
                }
            });
        }

        let addr = listener.local_addr()?;
        tracing::info!(%addr, repository = %repository.display(), models = models.len(), "listening");
        let (drain_started_tx, drain_started) = tokio::sync::oneshot::channel::<Instant>();
        let drain_delay = config.drain_delay();
        let signal = {
            let state = state.clone();
            async move {
                shutdown.await;
                state.shared().draining.store(true, Ordering::SeqCst);
                if !drain_delay.is_zero() {
                    tracing::info!(
                        delay_s = drain_delay.as_secs_f64(),
                        "shutting down: readiness fails; still serving"
                    );
                    tokio::time::sleep(drain_delay).await;
                }
                for model in &state.shared().models {
                    if let Some(b) = model.batcher() {
                        b.flush();
                    }
                }
                tracing::info!("shutting down: no new connections; finishing in-flight and queued requests");
                let _ = drain_started_tx.send(Instant::now());
            }
        };
        let mut server =
            tokio::spawn(axum::serve(listener, app(state.clone())).with_graceful_shutdown(signal).into_future());
        let drain_timeout = config.drain_timeout();
        let served = tokio::select! {
            served = &mut server => served,
            Ok(started) = drain_started => {
                let left = drain_timeout.saturating_sub(started.elapsed());
                match tokio::time::timeout(left, &mut server).await {
                    Ok(served) => served,
                    Err(_) => {
                        tracing::warn!(timeout_s = drain_timeout.as_secs_f64(), "drain timed out; answering what is left with 503");
                        state.shared().drain_expired.send_replace(true);
                        // The handlers answer at once; give the answers a moment to be written, then close.
                        match tokio::time::timeout(Duration::from_secs(2), &mut server).await {
                            Ok(served) => served,
                            Err(_) => {
                                server.abort();
                                Ok(Ok(()))
                            }
                        }
                    }
                }
            }
        };
        refresher.abort();
        upkeep.abort();
        // Stop the batchers: what is still queued was abandoned by its handlers (or is answered 503).
        let stopped = tokio::task::spawn_blocking(move || {
            for model in &models {
                if let Some(b) = model.batcher() {
                    if !b.stop(Duration::from_secs(1)) {
                        tracing::warn!(model = model.name(), "a worker is still busy at exit");
                    }
                }
            }
        });
        let _ = stopped.await;
        tracing::info!("stopped");
        served.context("the HTTP server task failed")?.context("the HTTP server failed")
    }
}

/// Binds `--host:--port` and serves until `shutdown` resolves.
pub async fn run(config: ServeConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let addr = std::net::SocketAddr::new(config.host, config.port);
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    Server::new(config).serve(listener, shutdown).await
}

/// `inferd healthcheck`: one plain HTTP/1.1 GET to 127.0.0.1; `Ok` when the answer is 200.
pub async fn healthcheck(config: &HealthcheckConfig) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = Duration::try_from_secs_f64(config.timeout).unwrap_or(Duration::from_secs(3));
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", config.port))
            .await
            .with_context(|| format!("nothing answers on 127.0.0.1:{}", config.port))?;
        let request = format!("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", config.path);
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(64 * 1024).read_to_end(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from 127.0.0.1:{} within {timeout:?}", config.port))??;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).unwrap_or("none");
    if status == "200" {
        Ok(())
    } else {
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
        anyhow::bail!("{} answered {status}: {body}", config.path)
    }
}
