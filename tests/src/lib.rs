//! The end-to-end test harness: a real inferd serving a real model repository on a loopback port, and the
//! held-out digits the bundled models are checked against.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inferd_server::{GpuProbe, NoGpu, ServeConfig, Server};
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The workspace's root folder.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_path_buf()
}

/// The ONNX Runtime library that `scripts/setup.sh` fetches.
pub fn onnxruntime_lib() -> PathBuf {
    let lib = workspace().join(".cache/onnxruntime/libonnxruntime.so.1.31.1");
    assert!(lib.is_file(), "{} is missing: run ./scripts/test.sh (or ./scripts/setup.sh) first", lib.display());
    lib
}

/// A model repository in a temporary folder, made of the bundled models (possibly with edited `model.toml`s).
pub struct Repo {
    dir: tempfile::TempDir,
}

impl Default for Repo {
    fn default() -> Self {
        Repo::new()
    }
}

impl Repo {
    pub fn new() -> Repo {
        Repo { dir: tempfile::tempdir().expect("a temporary folder") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Adds bundled model `bundled` as `name`, with `edit` applied to its `model.toml`.
    pub fn model(self, name: &str, bundled: &str, edit: impl FnOnce(String) -> String) -> Repo {
        let from = workspace().join("models").join(bundled);
        let to = self.dir.path().join(name);
        std::fs::create_dir_all(&to).expect("mkdir");
        let mut edit = Some(edit);
        for entry in std::fs::read_dir(&from).expect("a bundled model") {
            let path = entry.expect("entry").path();
            let file = path.file_name().expect("a file name");
            if file == "model.toml" {
                let text = std::fs::read_to_string(&path).expect("model.toml");
                let edit = edit.take().expect("one model.toml per model");
                std::fs::write(to.join(file), edit(text)).expect("write model.toml");
            } else {
                std::fs::copy(&path, to.join(file)).expect("copy");
            }
        }
        self
    }

    /// Adds bundled model `name` as it is.
    pub fn bundled(self, name: &str) -> Repo {
        self.model(name, name, |t| t)
    }
}

/// Replaces `key = …` in a TOML text (the first such line), for editing bundled configs.
pub fn set_toml(text: String, key: &str, value: &str) -> String {
    let mut done = false;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if !done && line.trim_start().starts_with(&format!("{key} ")) {
                done = true;
                format!("{key} = {value}")
            } else {
                line.to_owned()
            }
        })
        .collect();
    assert!(done, "no `{key}` line to replace");
    lines.join("\n")
}

/// A running inferd on 127.0.0.1 with a free port.
pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// Serves `repo` with extra command-line `args`; reports no GPU unless `probe` says otherwise.
    pub async fn start(repo: &Path, args: &[&str], probe: Option<Arc<dyn GpuProbe>>) -> TestServer {
        let lib = onnxruntime_lib();
        let mut argv: Vec<String> = vec!["--models".into(), repo.display().to_string()];
        if !args.contains(&"--onnxruntime-lib") {
            argv.extend(["--onnxruntime-lib".into(), lib.display().to_string()]);
        }
        argv.extend(args.iter().map(|a| a.to_string()));
        let config = ServeConfig::from_args(&argv).expect("valid arguments");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        let (stop, stopped) = oneshot::channel::<()>();
        let server = Server::new(config).with_gpu_probe(probe.unwrap_or_else(|| Arc::new(NoGpu)));
        let task = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("a client");
        TestServer { base, client, stop: Some(stop), task: Some(task) }
    }

    /// Starts and waits until every model has loaded (ready, or failed).
    pub async fn ready(repo: &Path, args: &[&str], probe: Option<Arc<dyn GpuProbe>>) -> TestServer {
        let server = TestServer::start(repo, args, probe).await;
        server.wait_loaded().await;
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn health(&self) -> (u16, serde_json::Value) {
        let r = self.client.get(self.url("/health")).send().await.expect("/health answers");
        let status = r.status().as_u16();
        (status, r.json().await.expect("/health is JSON"))
    }

    /// Waits until no model is still loading.
    pub async fn wait_loaded(&self) {
        for _ in 0..600 {
            let (_, h) = self.health().await;
            if h["status"] != "starting" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("models still loading after 30 s");
    }

    pub async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client.post(self.url(path)).body(body).send().await.expect("the server answers")
    }

    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.post(path, body.to_string()).await
    }

    /// Begins shutdown, as SIGTERM does.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Shuts down and waits for the server to finish.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.begin_shutdown();
        let task = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("stops in time").expect("the task joins")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.begin_shutdown();
    }
}

/// The held-out digits (see models/README.md).
#[derive(Debug, Deserialize)]
pub struct Heldout {
    pub pixels: Vec<Vec<f32>>,
    pub labels: Vec<usize>,
    /// Float64 logits of the first rows, from numpy.
    pub reference_logits: Vec<Vec<f64>>,
}

pub fn heldout() -> Heldout {
    let path = workspace().join("tests/data/digits_heldout.json");
    serde_json::from_slice(&std::fs::read(&path).expect("the held-out set")).expect("valid JSON")
}

/// The index of the largest value.
pub fn argmax(row: &[f64]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}

/// A `/predict` answer's `prediction` as rows of numbers.
pub fn prediction_rows(body: &serde_json::Value) -> Vec<Vec<f64>> {
    body["prediction"]
        .as_array()
        .expect("prediction is an array")
        .iter()
        .map(|row| row.as_array().expect("a row").iter().map(|v| v.as_f64().expect("a number")).collect())
        .collect()
}
pub use inferd_server::{BATCH_SIZE_HEADER, COMPUTE_TIME_HEADER, QUEUE_TIME_HEADER};
