//! The command line: every option has a `--flag` and an `INFERD_*` environment variable, shown by `--help`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use inferd_core::Precision;

/// inferd: serves models over HTTP with dynamic batching, on NVIDIA GPUs or the CPU.
#[derive(Debug, Parser)]
#[command(name = "inferd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models of a model repository.
    Serve(ServeConfig),
}

/// `inferd serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// The model repository: a folder of model folders (each with a model.toml), or one model folder.
    /// [default: models]
    #[arg(long, env = "INFERD_MODELS")]
    pub models: Option<PathBuf>,

    /// The model repository, as container images set it; used when --models is not given.
    #[arg(long, env = "MODEL_PATH", value_name = "DIR")]
    pub model_path: Option<PathBuf>,

    /// The model folder Azure ML mounts; used when neither --models nor MODEL_PATH is given.
    #[arg(long, env = "AZUREML_MODEL_DIR", value_name = "DIR")]
    pub azureml_model_dir: Option<PathBuf>,

    /// Address to listen on.
    #[arg(long, env = "INFERD_HOST", default_value = "0.0.0.0")]
    pub host: IpAddr,

    /// Port to listen on (0 picks a free one; the log says which).
    #[arg(long, env = "INFERD_PORT", default_value_t = 8080)]
    pub port: u16,

    /// The model that POST /predict serves; needed when the repository holds several.
    #[arg(long, env = "INFERD_DEFAULT_MODEL")]
    pub default_model: Option<String>,

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

    /// Seconds that in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "INFERD_DRAIN_TIMEOUT", default_value_t = 30.0, value_name = "SECONDS")]
    pub drain_timeout: f64,

    /// Largest request body, in bytes (413 above).
    #[arg(long, env = "INFERD_MAX_BODY_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// How often the GPU snapshot behind /health is refreshed, in milliseconds.
    #[arg(long, env = "INFERD_GPU_REFRESH_MS", default_value_t = 5000)]
    pub gpu_refresh_ms: u64,

    /// ONNX Runtime intra-op threads for models whose [onnx] table names none. [default: the cores present
    /// shared among the ONNX model instances]
    #[arg(long, env = "INFERD_INTRA_OP_THREADS")]
    pub intra_op_threads: Option<usize>,

    /// Log filter, as tracing's EnvFilter reads it (for example `info` or `inferd_batcher=trace,info`).
    #[arg(long, env = "INFERD_LOG", default_value = "info,ort=warn")]
    pub log: String,
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
}

impl ServeConfig {
    /// The repository folder: --models, else MODEL_PATH, else AZUREML_MODEL_DIR, else `models`.
    pub fn repository(&self) -> PathBuf {
        self.models
            .clone()
            .or_else(|| self.model_path.clone())
            .or_else(|| self.azureml_model_dir.clone())
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

    pub fn drain_timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.drain_timeout).unwrap_or(Duration::from_secs(30))
    }

    /// Parses `inferd serve ARGS…` (environment variables included), for tests and embedders.
    pub fn from_args<I, S>(args: I) -> Result<ServeConfig, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let argv = ["inferd".into(), "serve".into()].into_iter().chain(args.into_iter().map(Into::into));
        let Cli { command: Command::Serve(config) } = Cli::try_parse_from(argv)?;
        Ok(config)
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
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
