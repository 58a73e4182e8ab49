//! The options of a repository in an object store (Azure Blob Storage, S3), and of poll mode.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use inferd_models::RemoteLimits;

/// Where a remote repository is mirrored, its bounds, and how often poll mode reads the repository again.
#[derive(Debug, Clone, Args)]
pub struct RepositoryOptions {
    /// The folder a repository in an object store is mirrored into (`--models az://…`, `https://…`, `s3://…`).
    /// A restart that finds it holding the same files downloads none of them again: on AKS, keep it on a volume
    /// that outlives the container. [default: inferd-model-cache/<a digest of the URL> in the system's temporary
    /// folder]
    #[arg(long, env = "INFERD_MODEL_CACHE", value_name = "DIR")]
    pub model_cache: Option<PathBuf>,

    /// A remote repository holding more bytes than this is refused, before anything downloads.
    #[arg(long, env = "INFERD_MAX_REPOSITORY_BYTES", default_value_t = 64 << 30, value_name = "BYTES")]
    pub max_repository_bytes: u64,

    /// A remote repository holding more files than this is refused, before anything downloads.
    #[arg(long, env = "INFERD_MAX_REPOSITORY_FILES", default_value_t = 10_000, value_name = "COUNT")]
    pub max_repository_files: usize,

    /// Files of a remote repository downloaded at once.
    #[arg(long, env = "INFERD_DOWNLOADS", default_value_t = 8, value_name = "COUNT",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub downloads: u16,

    /// `--model-control poll`: seconds between two readings of the repository (a remote one mirrored again).
    #[arg(long, env = "INFERD_POLL_INTERVAL", default_value_t = 15.0, value_name = "SECONDS")]
    pub poll_interval: f64,
}

impl RepositoryOptions {
    /// The cache folder of the repository at `url`: --model-cache, else one of its own in the temporary folder (so
    /// that servers of different repositories never share one).
    pub fn model_cache(&self, url: &str) -> PathBuf {
        self.model_cache.clone().unwrap_or_else(|| {
            let mut digest = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(url, &mut digest);
            let digest = std::hash::Hasher::finish(&digest);
            std::env::temp_dir().join("inferd-model-cache").join(format!("{digest:016x}"))
        })
    }

    pub fn limits(&self) -> RemoteLimits {
        RemoteLimits {
            max_bytes: self.max_repository_bytes,
            max_files: self.max_repository_files,
            parallel: usize::from(self.downloads),
        }
    }

    pub fn poll_interval(&self) -> Duration {
        super::seconds(self.poll_interval, Duration::from_secs(15)).max(Duration::from_millis(100))
    }
}

/// The object store's settings from the environment the platforms set: every `AZURE_*` and `AWS_*` variable
/// (account, key, SAS token, workload identity's token file and client, endpoint), named as the `object_store`
/// crate reads them. Read here, at start-up, so that nothing deeper reads the environment.
pub fn object_store_options() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(key, _)| key.starts_with("AZURE_") || key.starts_with("AWS_"))
        .map(|(key, value)| (key.to_ascii_lowercase(), value))
        .collect()
}
