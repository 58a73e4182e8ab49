//! inferd-server: configuration, the model repository, the HTTP routes, the GPU probe and a graceful shutdown.
//!
//! [`Server::serve`] is the whole server over a listener the caller bound, stopping when a future resolves;
//! `main` adds only the command line, telemetry and the signals. Inside, by job: [`app`] assembles the routes of
//! each protocol ([`routes`]) behind one checkpoint, which resolves each request's model once ([`request`]); a
//! route decodes its wire format ([`codec`]), calls the operation it serves ([`ops`]: inference through the
//! model's task and batcher, metadata, the repository), and encodes the answer. The [`registry`] alone owns the
//! models' states; [`inferd_models`] finds, loads and runs them below HTTP.

mod alloc;
pub mod app;
pub mod budget;
pub mod config;
pub mod connections;
pub mod drain;
pub mod error;
pub mod gpu;
pub mod grpc;
mod healthcheck;
pub mod idle;
pub mod layers;
pub mod logging;
pub mod metrics;
pub mod ops;
pub(crate) mod poll;
pub mod registry;
mod repoll;
pub mod request;
pub mod routes;
pub mod shm;
pub mod socket;
pub mod state;
#[cfg(test)]
mod testing;
pub mod trace;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use inferd_models::OnnxSettings;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use app::app;
pub use config::{Cli, Command, HealthcheckConfig, LogFormat, Secret, ServeConfig};
pub use gpu::{FakeGpuProbe, GpuInfo, GpuProbe, NoGpu, NvmlProbe};
pub use healthcheck::healthcheck;
/// The wire formats, from their own crate (so that fuzzing them builds none of the server).
pub use inferd_codec as codec;
pub use inferd_models::EngineBuilder;
pub use layers::REQUEST_ID_HEADER;
pub use ops::infer::{BATCH_SIZE_HEADER, COMPUTE_TIME_HEADER, QUEUE_TIME_HEADER};
pub use routes::predict::TIMEOUT_HEADER;
pub use state::AppState;

use inferd_models::{Defaults, EngineSettings, GpuMemoryReader, Repository};

use crate::config::ModelControl;
use crate::gpu::GpuMonitor;
use crate::metrics::Metrics;
use crate::registry::{ModelEntry, Registry};
use crate::socket::{Listener, UnixSocket};

/// The server, built from its configuration; [`Server::serve`] runs it.
pub struct Server {
    config: ServeConfig,
    gpu_probe: Option<Arc<dyn GpuProbe>>,
    engine_builder: Option<EngineBuilder>,
    /// HTTP's listeners besides [`Server::serve`]'s (a Unix socket).
    http_listeners: Vec<Listener>,
    grpc_listeners: Vec<Listener>,
}

impl Server {
    pub fn new(config: ServeConfig) -> Self {
        Server { config, gpu_probe: None, engine_builder: None, http_listeners: Vec::new(), grpc_listeners: Vec::new() }
    }

    /// Serves HTTP on `listener` too (a Unix socket), with the same connection limit.
    pub fn with_listener(mut self, listener: impl Into<Listener>) -> Self {
        self.http_listeners.push(listener.into());
        self
    }

    /// Serves KServe v2 over gRPC on `listener` too (a port, a Unix socket), beside HTTP.
    pub fn with_grpc_listener(mut self, listener: impl Into<Listener>) -> Self {
        self.grpc_listeners.push(listener.into());
        self
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

    /// Serves on `listener` until `shutdown` resolves, then drains ([`drain::Phase`]): readiness fails at once;
    /// requests are still served for `--drain-delay`, so that load balancers notice; then no new connections are
    /// taken, and what is in flight or queued gets `--drain-timeout` to finish; whatever is left after that is
    /// answered 503. Models load in the background, so the probes answer (`starting`) from the first moment.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let config = self.config;
        let open_files = connections::raise_open_files_limit();
        let listeners = if self.grpc_listeners.is_empty() { 1 } else { 2 };
        let connection_settings = connections::ConnectionSettings::new(&config, open_files, listeners);
        let (location, remote) = poll::open(&config).await?;
        let repository = Repository::new(location);
        let configs = repository.discover()?;
        // Poll mode compares its readings with what the start-up load reads; no other mode reads the folders again.
        let stamps = (config.model_control == ModelControl::Poll).then(|| repository.stamps());
        let defaults = Defaults::choose(
            &configs,
            config.default_model.as_deref(),
            config.default_embed_model.as_deref(),
            &repository,
        )?;
        let probe = self.gpu_probe.unwrap_or_else(gpu::system_probe);
        let settings = engine_settings(
            &config,
            self.engine_builder,
            gpu::memory_reader(&probe, std::env::var("CUDA_VISIBLE_DEVICES").ok()),
        );
        let gpu = GpuMonitor::new(probe);
        gpu.refresh().await;
        let count = configs.len();
        let mut names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
        names.dedup();
        let metrics = Arc::new(Metrics::new(&names));
        let repository_dir = repository.dir().to_path_buf();
        let registry = Registry::new(repository, configs, settings, metrics).with_remote(remote);
        let state = AppState::new(&config, registry, defaults, gpu.clone())?;
        let mut background = Background::start(&state, gpu, Duration::from_millis(config.gpu_refresh_ms));
        load_in_background(&state);
        if let Some(stamps) = stamps {
            background.0.push(poll::start(state.clone(), config.remote.poll_interval(), stamps));
        }

        let addr = listener.local_addr()?;
        let http_listeners: Vec<Listener> = std::iter::once(listener.into()).chain(self.http_listeners).collect();
        let also: Vec<String> = http_listeners[1..].iter().map(Listener::describe).collect();
        tracing::info!(
            %addr,
            also = %also.join(", "),
            repository = %repository_dir.display(),
            models = count,
            max_connections = connection_settings.max_connections,
            open_files,
            "listening"
        );
        let drain = state.drain().clone();
        let flush = {
            let state = state.clone();
            move || state.models().iter().filter_map(|m| m.loaded()).for_each(|m| m.batchers().for_each(|b| b.flush()))
        };
        let closing = drain.clone().until_closing(shutdown, flush);
        let http = connections::serve(http_listeners, app(state.clone()), connection_settings, drain.clone(), closing);
        let grpc = match self.grpc_listeners.is_empty() {
            false => {
                let at: Vec<String> = self.grpc_listeners.iter().map(Listener::describe).collect();
                tracing::info!(grpc_addr = %at.join(", "), "serving gRPC");
                Some(grpc::serve(self.grpc_listeners, grpc::app(state.clone()), connection_settings, drain.clone()))
            }
            true => None,
        };
        // One task for both listeners: the drain bounds them together, and aborting it stops both.
        let server = tokio::spawn(async move {
            let grpc = async move {
                match grpc {
                    Some(served) => served.await,
                    None => Ok(()),
                }
            };
            let (http, grpc) = tokio::join!(http, grpc);
            http.and(grpc)
        });
        let served = drain.finish(server).await;
        drop(background);
        // Model control may have loaded models since start-up: stop the ones there are now.
        let models = state.models().to_vec();
        drop(state);
        stop_batchers(models).await;
        tracing::info!("stopped");
        served
    }
}

/// What the engines need from the configuration: the ONNX Runtime library, the threads of the pool its sessions
/// share (every core unless `--intra-op-threads` says), the default precision.
fn engine_settings(
    config: &ServeConfig,
    builder: Option<EngineBuilder>,
    gpu_memory: GpuMemoryReader,
) -> EngineSettings {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    EngineSettings {
        onnx: OnnxSettings {
            library: config.onnxruntime_lib.clone(),
            shared_threads: config.intra_op_threads.unwrap_or(cores).max(1),
        },
        default_precision: config.default_precision(),
        builder,
        gpu_memory: Some(gpu_memory),
    }
}

/// Loads the models on the blocking pool, one after the other; loading cannot be cancelled midway, but once
/// shutdown begins no more models load.
fn load_in_background(state: &AppState) {
    let state = state.clone();
    // Model control waits for the start-up load, which would otherwise build engines for entries a load or an
    // unload had already replaced.
    let control = state.registry().try_control();
    tokio::task::spawn_blocking(move || {
        let _control = control;
        state.registry().load_all(|| state.drain().is_draining());
    });
}

/// The server's background tasks: the GPU snapshot's refresh, and every second the metrics' upkeep and the stall
/// watch. Stopped when dropped.
struct Background(Vec<JoinHandle<()>>);

impl Background {
    fn start(state: &AppState, gpu: GpuMonitor, gpu_refresh: Duration) -> Background {
        let refresher = tokio::spawn(gpu.refresh_every(gpu_refresh));
        let state = state.clone();
        let upkeep = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(metrics::UPKEEP_PERIOD);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                state.metrics().upkeep();
                state.stalls().watch(&state.models());
            }
        });
        Background(vec![refresher, upkeep])
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// Stops every model's batcher: what is still queued was abandoned by its handlers (or answered 503).
async fn stop_batchers(models: Vec<Arc<ModelEntry>>) {
    let stopped = tokio::task::spawn_blocking(move || {
        for model in &models {
            if let Some(loaded) = model.loaded() {
                // Every batcher is stopped, whether or not one before it finished in time.
                let finished: Vec<bool> = loaded.batchers().map(|b| b.stop(Duration::from_secs(1))).collect();
                if finished.contains(&false) {
                    tracing::warn!(model = model.name(), "a worker is still busy at exit");
                }
            }
        }
    });
    let _ = stopped.await;
}

/// Binds `--host:--port` (and `--grpc-port` unless 0, and the Unix sockets asked for) and serves until `shutdown`
/// resolves.
pub async fn run(config: ServeConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let addr = std::net::SocketAddr::new(config.host, config.port.get());
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let mut grpc = Vec::new();
    if config.grpc_port != 0 {
        let addr = std::net::SocketAddr::new(config.host, config.grpc_port);
        grpc.push(TcpListener::bind(addr).await.with_context(|| format!("cannot listen for gRPC on {addr}"))?.into());
    }
    if let Some(path) = &config.grpc_unix_socket {
        grpc.push(Listener::Unix(UnixSocket::bind(path).await.context("--grpc-unix-socket")?));
    }
    let unix = match &config.unix_socket {
        Some(path) => Some(Listener::Unix(UnixSocket::bind(path).await.context("--unix-socket")?)),
        None => None,
    };
    let server = unix.into_iter().fold(Server::new(config), Server::with_listener);
    grpc.into_iter().fold(server, Server::with_grpc_listener).serve(listener, shutdown).await
}
