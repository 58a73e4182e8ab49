//! The command line: every option has a `--flag` and an `INFERD_*` environment variable, shown by `--help`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use inferd_core::Precision;

mod repository;
pub use repository::{object_store_options, RepositoryOptions};

/// inferd: serves models over HTTP with dynamic batching, on NVIDIA GPUs or the CPU.
#[derive(Debug, Parser)]
#[command(name = "inferd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start-up: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models of a model repository.
    Serve(ServeConfig),
    /// Ask a running inferd on this machine whether it is ready; exit 0 if it is, 1 if not. For container
    /// HEALTHCHECKs: the images need no curl.
    Healthcheck(HealthcheckConfig),
}

/// `inferd healthcheck`.
#[derive(Debug, Clone, Args)]
pub struct HealthcheckConfig {
    /// The port the server listens on (on 127.0.0.1), found as `inferd serve` finds it.
    #[command(flatten)]
    pub port: Port,

    /// The route to ask; 200 means healthy.
    #[arg(long, default_value = "/health/ready")]
    pub path: String,

    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3.0, value_name = "SECONDS")]
    pub timeout: f64,
}

/// `inferd serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// The model repository: a folder of model folders (each with a model.toml), or one model folder; or one in
    /// an object store, mirrored into --model-cache: `az://CONTAINER/PREFIX` or
    /// `https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX` (Azure Blob Storage: a shared key, a SAS token, or
    /// the workload or managed identity, from the AZURE_* variables the platforms set), `s3://BUCKET/PREFIX` (the
    /// AWS_* variables; AWS_ENDPOINT for an S3-compatible store). [default: models]
    #[arg(long, env = "INFERD_MODELS")]
    pub models: Option<PathBuf>,

    #[command(flatten)]
    pub remote: RepositoryOptions,

    /// The model repository, as container images set it; used when neither --models nor AZUREML_MODEL_DIR is
    /// given.
    #[arg(long, env = "MODEL_PATH", value_name = "DIR")]
    pub model_path: Option<PathBuf>,

    /// The model folder Azure ML mounts (it sets the variable only when it mounts a model, so it wins over an
    /// image's MODEL_PATH); used when --models is not given.
    #[arg(long, env = "AZUREML_MODEL_DIR", value_name = "DIR")]
    pub azureml_model_dir: Option<PathBuf>,

    /// Address to listen on.
    #[arg(long, env = "INFERD_HOST", default_value = "0.0.0.0")]
    pub host: IpAddr,

    /// The port to listen on.
    #[command(flatten)]
    pub port: Port,

    /// Vertex AI's prediction route: served as `POST /vertex` is ({"instances": [...]} → {"predictions": [...]}).
    #[arg(long, env = "AIP_PREDICT_ROUTE", value_name = "PATH", value_parser = parse_route)]
    pub aip_predict_route: Option<String>,

    /// Vertex AI's health route: answers 200 once the server is ready, as `/health/ready` does.
    #[arg(long, env = "AIP_HEALTH_ROUTE", value_name = "PATH", value_parser = parse_route)]
    pub aip_health_route: Option<String>,

    /// Origins whose browser pages may call the API (CORS): repeat the flag, or separate them with commas; `*`
    /// allows any origin. None by default: no CORS headers are sent, and browsers keep other origins out.
    #[arg(long, env = "INFERD_CORS_ALLOW_ORIGIN", value_name = "ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,

    /// Port for KServe v2 over gRPC (Triton's gRPC clients, perf_analyzer, gRPC health probes), on the same
    /// address; 0 serves no gRPC.
    #[arg(long, env = "INFERD_GRPC_PORT", default_value_t = 8001)]
    pub grpc_port: u16,

    /// Serve HTTP on this Unix domain socket too (beside the port), for clients on the same host: a socket file of
    /// mode 0660, a stale one left at the path replaced, removed at exit.
    #[arg(long, env = "INFERD_UNIX_SOCKET", value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,

    /// Serve gRPC on this Unix domain socket too (clients dial `unix:PATH`); with `--grpc-port 0`, there alone.
    #[arg(long, env = "INFERD_GRPC_UNIX_SOCKET", value_name = "PATH")]
    pub grpc_unix_socket: Option<PathBuf>,

    /// The model that POST /predict serves; needed when the repository holds several.
    #[arg(long, env = "INFERD_DEFAULT_MODEL")]
    pub default_model: Option<String>,

    /// The text model that POST /embed serves; needed when the repository holds several and the default model
    /// does not embed text.
    #[arg(long, env = "INFERD_DEFAULT_EMBED_MODEL")]
    pub default_embed_model: Option<String>,

    /// The ONNX Runtime shared library (scripts/setup.sh puts one here).
    #[arg(long, env = "INFERD_ONNXRUNTIME_LIB", default_value = ".cache/onnxruntime/libonnxruntime.so.1.31.1")]
    pub onnxruntime_lib: PathBuf,

    /// Precision for models whose model.toml names none (fp32, fp16, bf16).
    #[arg(long, env = "INFERD_PRECISION", default_value = "fp32", value_parser = parse_precision)]
    pub precision: Precision,

    /// Same as --precision fp16 (the variable container images set).
    #[arg(long, env = "USE_FP16")]
    pub use_fp16: bool,

    /// Report `degraded` and fail readiness unless every model runs on a GPU.
    #[arg(long, env = "INFERD_REQUIRE_GPU")]
    pub require_gpu: bool,

    /// Bytes that inference requests may hold at once across every connection and model: their bodies, after
    /// decompression, and their decoded tensors. A request that would go past it is refused at once (503, with
    /// Retry-After), before the rest of its body is read.
    #[arg(long, env = "INFERD_MAX_INFLIGHT_BYTES", default_value_t = 512 * 1024 * 1024)]
    pub max_inflight_bytes: usize,

    /// Connections served at once. Past it, up to 64 more are taken that answer only the probes (and 503 with
    /// Retry-After to anything else); past those, a connection is closed as soon as it is accepted.
    #[arg(long, env = "INFERD_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// Microseconds after a request's work ends that a runtime thread with nothing to do polls the listeners and
    /// connections before it sleeps, while requests come one at a time: the next request then finds its core awake
    /// rather than waking one gone cold (on this project's test VMs, tens of microseconds a request). Nothing polls
    /// while a request's work is under way (in a batcher or on the blocking pool), nor for 20 ms after two
    /// requests' work overlapped, so under load the cores stay with the work. 0 turns it off; at most 10,000.
    #[arg(long, env = "INFERD_POLL_IDLE_US", default_value_t = 100, value_name = "MICROSECONDS",
          value_parser = clap::value_parser!(u64).range(0..=crate::idle::MAX_POLL_US))]
    pub poll_idle_us: u64,

    /// Seconds a connection has to send a complete request head: from its opening, or from the first byte of a
    /// later request on it. A client that stops part-way is closed.
    #[arg(long, env = "INFERD_HEADER_READ_TIMEOUT", default_value_t = 10.0, value_name = "SECONDS")]
    pub header_read_timeout: f64,

    /// Seconds a kept-alive connection may sit idle between requests. Keep it longer than the idle timeout of a
    /// proxy in front (nginx's upstream keepalive_timeout is 60 s), so that it never reuses a connection the
    /// server is closing.
    #[arg(long, env = "INFERD_IDLE_TIMEOUT", default_value_t = 75.0, value_name = "SECONDS")]
    pub idle_timeout: f64,

    /// Seconds a batch may run before its model is reported stalled: /health then says `degraded` and names it,
    /// the log says so once, and readiness fails until the batch ends. 0 turns the watch off.
    #[arg(long, env = "INFERD_STALL_TIMEOUT", default_value_t = 60.0, value_name = "SECONDS")]
    pub stall_timeout: f64,

    /// Take NaN and infinities in inputs (only binary tensors can carry them), and give them in outputs: as their
    /// IEEE values in binary, as the strings "NaN", "Infinity" and "-Infinity" in JSON. Off: such an input is a
    /// 400 naming the input and element, and such an output a 500 naming the output; never a silent `null`.
    #[arg(long, env = "INFERD_ALLOW_NON_FINITE")]
    pub allow_non_finite: bool,

    /// Let clients register system shared-memory regions (Triton's extension: `/v2/systemsharedmemory`), for
    /// inputs and outputs that never cross a socket. Off by default: a registered key reaches any POSIX
    /// shared-memory object this server's user may open, so turn it on for a gateway on the same host you trust.
    #[arg(long, env = "INFERD_ALLOW_CLIENT_SHM")]
    pub allow_client_shm: bool,

    /// Seconds that in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "INFERD_DRAIN_TIMEOUT", default_value_t = 30.0, value_name = "SECONDS")]
    pub drain_timeout: f64,

    /// Largest request body, in bytes (413 above).
    #[arg(long, env = "INFERD_MAX_BODY_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// MiB of workspace each cuBLAS handle gets on a GPU: each candle model instance holds one, ONNX Runtime's CUDA
    /// provider one per session (cuBLAS's own default is 64 MiB a handle on an H100). Rounded up to 4 MiB; 0 for
    /// none. Where CUBLAS_WORKSPACE_CONFIG is set, that wins.
    #[arg(long, env = "INFERD_CUBLAS_WORKSPACE_MIB", default_value_t = inferd_models::budget::DEFAULT_CUBLAS_WORKSPACE_MIB)]
    pub cublas_workspace_mib: u64,

    /// How often the GPU snapshot behind /health is refreshed, in milliseconds.
    #[arg(long, env = "INFERD_GPU_REFRESH_MS", default_value_t = 5000)]
    pub gpu_refresh_ms: u64,

    /// Threads of the one ONNX Runtime pool that every model without its own [onnx] intra_op_threads shares: a
    /// busy model uses all of them, several busy models share them. [default: the cores present]
    #[arg(long, env = "INFERD_INTRA_OP_THREADS")]
    pub intra_op_threads: Option<usize>,

    /// Log filter, as tracing's EnvFilter reads it (for example `info` or `inferd_batcher=debug,info`).
    #[arg(long, env = "INFERD_LOG", default_value = "info,ort=warn")]
    pub log: String,

    /// Log lines as plain text or as JSON objects (one per line, with the request's span and thread).
    #[arg(long, env = "INFERD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// A key that clients must send as `Authorization: Bearer <key>` on every route but the health probes,
    /// the docs and (unless --protect-metrics) /metrics. Prefer --api-key-file or the environment: a flag is
    /// visible in `ps`.
    #[arg(long, env = "INFERD_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<Secret>,

    /// A file of API keys, one per line (blank lines and lines starting with `#` are skipped); any one is
    /// accepted, so keys can be rotated without downtime.
    #[arg(long, env = "INFERD_API_KEY_FILE", value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,

    /// Require the API key on /metrics too.
    #[arg(long, env = "INFERD_PROTECT_METRICS")]
    pub protect_metrics: bool,

    /// Most tensor elements one request may carry, over all its inputs (413 above).
    #[arg(long, env = "INFERD_MAX_ELEMENTS", default_value_t = 16 * 1024 * 1024)]
    pub max_elements: usize,

    /// Most rows (the batch dimension) one request may carry (413 above); larger requests than a model's
    /// max_batch_size are split, up to this.
    #[arg(long, env = "INFERD_MAX_ROWS", default_value_t = 4096)]
    pub max_rows: usize,

    /// Deepest nesting of arrays and objects a JSON body may have (400 above).
    #[arg(long, env = "INFERD_MAX_JSON_DEPTH", default_value_t = 32)]
    pub max_json_depth: usize,

    /// Seconds a request may take in all, queue included, before it is answered 503.
    #[arg(long, env = "INFERD_REQUEST_TIMEOUT", default_value_t = 60.0, value_name = "SECONDS")]
    pub request_timeout: f64,

    /// Seconds to keep serving after SIGTERM/SIGINT, with readiness already failing, so that load balancers
    /// stop sending before the listener closes. Kubernetes and Azure need a few.
    #[arg(long, env = "INFERD_DRAIN_DELAY", default_value_t = 0.0, value_name = "SECONDS")]
    pub drain_delay: f64,

    /// Readiness (`/health/ready`, `/v2/health/ready`): `true`, only once every model is ready; `false`, once
    /// at least one is, the others' failures reported by /health and their own ready routes.
    #[arg(long, env = "INFERD_STRICT_READINESS", default_value_t = true, action = clap::ArgAction::Set,
          value_name = "BOOL")]
    pub strict_readiness: bool,

    /// `explicit`: models may be loaded, reloaded and unloaded while serving, through Triton's repository
    /// routes (`POST /v2/repository/models/{model}/load` and `/unload`), which read the repository folder again.
    /// `poll`: the repository is read again every --poll-interval; a new version or model loads and serves once
    /// warm, a removed one drains and unloads, changed files load again, and a version that fails to load leaves
    /// what served serving (/health and the repository index say why).
    /// `none`: the models found at start-up are the ones served.
    #[arg(long, env = "INFERD_MODEL_CONTROL", value_enum, default_value_t = ModelControl::None)]
    pub model_control: ModelControl,
}

/// `--model-control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelControl {
    None,
    Explicit,
    Poll,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A secret: its `Debug` and `Display` print `***`, so that logging a configuration never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::str::FromStr for Secret {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err("an API key cannot be empty".into());
        }
        Ok(Secret(s.to_owned()))
    }
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
}

/// A duration in seconds from the command line; negative or not finite falls back to `otherwise`.
fn seconds(value: f64, otherwise: Duration) -> Duration {
    Duration::try_from_secs_f64(value).unwrap_or(otherwise)
}

/// The server's HTTP port, as `inferd serve` listens on it and `inferd healthcheck` asks it: the platforms that host
/// containers name it in their own variables.
#[derive(Debug, Clone, Copy, Args)]
pub struct Port {
    /// The HTTP port (`serve`: 0 picks a free one; the log says which). [default: SAGEMAKER_BIND_TO_PORT, else
    /// AIP_HTTP_PORT, else 8080]
    #[arg(long, env = "INFERD_PORT")]
    pub port: Option<u16>,

    /// The port SageMaker tells its containers to listen on; used when --port is not given.
    #[arg(long, env = "SAGEMAKER_BIND_TO_PORT", value_name = "PORT")]
    pub sagemaker_bind_to_port: Option<u16>,

    /// The port Vertex AI tells its containers to listen on; used when neither --port nor SAGEMAKER_BIND_TO_PORT
    /// is given.
    #[arg(long, env = "AIP_HTTP_PORT", value_name = "PORT")]
    pub aip_http_port: Option<u16>,
}

impl Port {
    /// --port, else SAGEMAKER_BIND_TO_PORT, else AIP_HTTP_PORT, else 8080.
    pub fn get(self) -> u16 {
        self.port.or(self.sagemaker_bind_to_port).or(self.aip_http_port).unwrap_or(8080)
    }
}

/// A route an environment names: a path from the root, which a router can serve as it is.
fn parse_route(value: &str) -> Result<String, String> {
    let ok = value.starts_with('/')
        && value.len() > 1
        && !value.contains(['{', '}', '*', ' ', '?', '#'])
        && !value.split('/').any(|segment| segment.starts_with(':'));
    match ok {
        true => Ok(value.to_owned()),
        false => Err(format!(
            "`{value}` is not a route: a path from the root, without `{{`, `}}`, `*`, `?`, `#` or a part starting with `:`"
        )),
    }
}

impl ServeConfig {
    /// The repository folder: --models, else AZUREML_MODEL_DIR, else MODEL_PATH, else `models`.
    pub fn repository(&self) -> PathBuf {
        self.models
            .clone()
            .or_else(|| self.azureml_model_dir.clone())
            .or_else(|| self.model_path.clone())
            .unwrap_or_else(|| PathBuf::from("models"))
    }

    /// The precision for models that name none.
    pub fn default_precision(&self) -> Precision {
        if self.use_fp16 {
            Precision::Fp16
        } else {
            self.precision
        }
    }

    /// How long a batch may run before its model counts as stalled; `None` when the watch is off.
    pub fn stall_timeout(&self) -> Option<Duration> {
        Some(seconds(self.stall_timeout, Duration::ZERO)).filter(|t| !t.is_zero())
    }

    /// From a connection's acceptance, or the first byte of a later request, to the end of that request's head.
    pub fn header_read_timeout(&self) -> Duration {
        seconds(self.header_read_timeout, Duration::from_secs(10))
    }

    /// Between the end of one answer and the first byte of the next request on a kept-alive connection.
    pub fn idle_timeout(&self) -> Duration {
        seconds(self.idle_timeout, Duration::from_secs(75))
    }

    pub fn drain_timeout(&self) -> Duration {
        seconds(self.drain_timeout, Duration::from_secs(30))
    }

    pub fn drain_delay(&self) -> Duration {
        seconds(self.drain_delay, Duration::ZERO)
    }

    pub fn request_timeout(&self) -> Duration {
        seconds(self.request_timeout, Duration::from_secs(60))
    }

    /// Every accepted API key: --api-key and the lines of --api-key-file. Empty when the server is open.
    pub fn api_keys(&self) -> anyhow::Result<Vec<Secret>> {
        let mut keys: Vec<Secret> = self.api_key.iter().cloned().collect();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read the API key file {}: {e}", path.display()))?;
            let before = keys.len();
            keys.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(Secret::new));
            if keys.len() == before {
                anyhow::bail!("the API key file {} holds no key", path.display());
            }
        }
        Ok(keys)
    }

    /// Parses `inferd serve ARGS…` (environment variables included), for tests and embedders.
    pub fn from_args<I, S>(args: I) -> Result<ServeConfig, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let argv = ["inferd".into(), "serve".into()].into_iter().chain(args.into_iter().map(Into::into));
        match Cli::try_parse_from(argv)?.command {
            Command::Serve(config) => Ok(config),
            Command::Healthcheck(_) => unreachable!("the arguments start with `serve`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_falls_back_through_the_container_variables() {
        let c = ServeConfig::from_args(["--model-path", "/mnt/models"]).expect("parses");
        assert_eq!(c.repository(), PathBuf::from("/mnt/models"));
        let c =
            ServeConfig::from_args(["--models", "a", "--model-path", "b", "--azureml-model-dir", "c"]).expect("parses");
        assert_eq!(c.repository(), PathBuf::from("a"));
        let c = ServeConfig::from_args(["--azureml-model-dir", "c"]).expect("parses");
        assert_eq!(c.repository(), PathBuf::from("c"));
        // Azure ML sets its variable only when it mounts a model: that wins over an image's MODEL_PATH.
        let c = ServeConfig::from_args(["--model-path", "/models", "--azureml-model-dir", "c"]).expect("parses");
        assert_eq!(c.repository(), PathBuf::from("c"));
    }

    #[test]
    fn the_idle_poll_is_bounded() {
        assert_eq!(ServeConfig::from_args(Vec::<String>::new()).expect("parses").poll_idle_us, 100);
        assert_eq!(ServeConfig::from_args(["--poll-idle-us", "0"]).expect("parses").poll_idle_us, 0);
        assert_eq!(ServeConfig::from_args(["--poll-idle-us", "10000"]).expect("parses").poll_idle_us, 10_000);
        assert!(ServeConfig::from_args(["--poll-idle-us", "10001"]).is_err());
        assert!(ServeConfig::from_args(["--poll-idle-us", "-1"]).is_err());
    }

    #[test]
    fn use_fp16_sets_the_default_precision() {
        assert_eq!(ServeConfig::from_args(["--use-fp16"]).expect("parses").default_precision(), Precision::Fp16);
        assert_eq!(
            ServeConfig::from_args(["--precision", "bf16"]).expect("parses").default_precision(),
            Precision::Bf16
        );
        assert!(ServeConfig::from_args(["--precision", "fp8"]).is_err());
    }

    #[test]
    fn api_keys_never_show_in_debug_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("keys");
        std::fs::write(&file, "# rotated monthly\nfile-key-1\n\n  file-key-2  \n").expect("write");
        let c = ServeConfig::from_args(["--api-key", "flag-key-0", "--api-key-file", file.to_str().expect("utf-8")])
            .expect("parses");
        let shown = format!("{c:?}");
        assert!(!shown.contains("key-0"), "{shown}");
        assert!(shown.contains("api_key: Some(***)"), "{shown}");
        let keys: Vec<String> = c.api_keys().expect("keys").iter().map(|k| k.expose().to_owned()).collect();
        assert_eq!(keys, ["flag-key-0", "file-key-1", "file-key-2"]);
        assert!(ServeConfig::from_args(["--api-key", " "]).is_err());
        std::fs::write(&file, "# nothing here\n").expect("write");
        let c = ServeConfig::from_args(["--api-key-file", file.to_str().expect("utf-8")]).expect("parses");
        assert!(c.api_keys().expect_err("no key").to_string().contains("holds no key"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
