//! The end-to-end test harness: a real inferd serving a real model repository on a loopback port, and the
//! held-out digits the bundled models are checked against.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use inferd_core::{DataType, Engine, ModelMetadata, Precision, Tensor, TensorSpec};
use inferd_server::{EngineBuilder, GpuInfo, GpuProbe, NoGpu, ServeConfig, Server};
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
        self.copy(name, &workspace().join("models").join(bundled), edit)
    }

    /// Adds the test model `tests/data/models/<name>`, made for a test rather than bundled.
    pub fn test_model(self, name: &str) -> Repo {
        self.copy_test_model(name, |t| t)
    }

    /// Adds the test model `tests/data/models/<name>`, with `edit` applied to its `model.toml`.
    pub fn copy_test_model(self, name: &str, edit: impl FnOnce(String) -> String) -> Repo {
        self.copy(name, &workspace().join("tests/data/models").join(name), edit)
    }

    /// Adds the model folder `from` as `name`, with `edit` applied to its `model.toml`.
    fn copy(self, name: &str, from: &Path, edit: impl FnOnce(String) -> String) -> Repo {
        copy_model(self.dir.path(), name, from, edit);
        self
    }

    /// Adds bundled model `name` as it is.
    pub fn bundled(self, name: &str) -> Repo {
        self.model(name, name, |t| t)
    }
}

/// Copies the model folder `from` into the repository `repo` as `name`, with `edit` applied to its `model.toml`:
/// also to add a model to the repository of a running server.
pub fn copy_model(repo: &Path, name: &str, from: &Path, edit: impl FnOnce(String) -> String) {
    let to = repo.join(name);
    std::fs::create_dir_all(&to).expect("mkdir");
    let mut edit = Some(edit);
    for entry in std::fs::read_dir(from).expect("a model folder") {
        let path = entry.expect("entry").path();
        let file = path.file_name().expect("a file name");
        if file == "model.toml" {
            let text = std::fs::read_to_string(&path).expect("model.toml");
            let edit = edit.take().expect("one model.toml per model");
            std::fs::write(to.join(file), edit(text)).expect("write model.toml");
        } else {
            copy_tree(&path, &to.join(file));
        }
    }
}

/// Copies a file, or a folder and everything in it (a text model's `1_Pooling/`). A file is hard-linked where it can
/// be (the weights of a test's repository are read, never written: `add_to_tensor` replaces the file it changes), so
/// that tests running side by side hold one copy of each model on disk, not one each.
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("a folder") {
            let path = entry.expect("entry").path();
            copy_tree(&path, &to.join(path.file_name().expect("a file name")));
        }
    } else if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
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
        TestServer::launch(repo, args, probe, None).await
    }

    /// Serves `repo`'s models with engines from `engines` in place of their backends, and waits for them to load.
    pub async fn with_engines(repo: &Path, args: &[&str], engines: EngineBuilder) -> TestServer {
        let server = TestServer::launch(repo, args, None, Some(engines)).await;
        server.wait_loaded().await;
        server
    }

    async fn launch(
        repo: &Path,
        args: &[&str],
        probe: Option<Arc<dyn GpuProbe>>,
        engines: Option<EngineBuilder>,
    ) -> TestServer {
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
        let mut server = Server::new(config).with_gpu_probe(probe.unwrap_or_else(|| Arc::new(NoGpu)));
        if let Some(engines) = engines {
            server = server.with_engine_builder(engines);
        }
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

    /// `/metrics`, parsed.
    pub async fn metrics(&self) -> Metrics {
        let r = self.client.get(self.url("/metrics")).send().await.expect("/metrics answers");
        assert_eq!(r.status(), 200);
        Metrics::parse(&r.text().await.expect("text"))
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
pub use inferd_server::{BATCH_SIZE_HEADER, COMPUTE_TIME_HEADER, QUEUE_TIME_HEADER, REQUEST_ID_HEADER, TIMEOUT_HEADER};

/// A GPU as NVML would report an H100, for the fake probe.
pub fn h100() -> GpuInfo {
    GpuInfo {
        index: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: "GPU-5c1d7e0a-0000-4000-8000-000000000000".into(),
        memory_total_bytes: 85_520_809_984,
        memory_used_bytes: 1_073_741_824,
        memory_free_bytes: 84_447_068_160,
        utilization_percent: Some(37),
        temperature_celsius: Some(41),
        compute_capability: Some("9.0".into()),
        driver_version: Some("580.65.06".into()),
    }
}

/// One sample line: its name, labels and value.
type Sample = (String, Vec<(String, String)>, f64);

/// Samples of a Prometheus exposition.
#[derive(Debug)]
pub struct Metrics(Vec<Sample>);

impl Metrics {
    /// Parses the text format (no escaped quotes in label values, which inferd never writes).
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {line}"));
                let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
                let (name, labels) = match series.split_once('{') {
                    None => (series.to_owned(), Vec::new()),
                    Some((name, rest)) => {
                        let labels = rest
                            .trim_end_matches('}')
                            .split("\",")
                            .filter(|p| !p.is_empty())
                            .map(|pair| {
                                let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("a label: {line}"));
                                (k.to_owned(), v.trim_end_matches('"').to_owned())
                            })
                            .collect();
                        (name.to_owned(), labels)
                    }
                };
                (name, labels, value)
            })
            .collect();
        Metrics(samples)
    }

    /// The value of the series `name` with exactly `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.len() == labels.len()
                    && labels.iter().all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.2)
    }

    /// Like [`Metrics::get`], for a series that must exist.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or_else(|| panic!("no series {name}{labels:?} in {self:#?}"))
    }
}

/// Where a [`HeldEngine`] is held, and what it saw.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    /// Batches held at the gate now.
    pub held: AtomicUsize,
    /// The first value of every row that reached the engine.
    pub seen: Mutex<Vec<f32>>,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }

    /// Waits until `n` batches are held.
    pub async fn wait_held(&self, n: usize) {
        for _ in 0..1000 {
            if self.held.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no batch reached the engine");
    }
}

/// The value that, first in a row, holds the engine at its gate.
pub const HOLD: f32 = -7.0;

/// A stand-in engine of the digits model's shape (FP32 `[-1, 64]` → `[-1, 10]`, each output row ten copies of the
/// input row's first value) that waits at its gate whenever a row starts with [`HOLD`]: a slow engine whose
/// slowness the test controls.
pub struct HeldEngine {
    metadata: ModelMetadata,
    gate: Arc<Gate>,
}

impl HeldEngine {
    /// An [`EngineBuilder`] whose every engine shares `gate`.
    pub fn builder(gate: Arc<Gate>) -> EngineBuilder {
        Arc::new(move |_config| {
            let spec = |name: &str, width| TensorSpec {
                name: name.into(),
                datatype: DataType::Fp32,
                shape: vec![-1, width],
                optional: false,
            };
            let metadata = ModelMetadata {
                inputs: vec![spec("input", 64)],
                outputs: vec![spec("logits", 10)],
                device: "cpu".into(),
                precision: Precision::Fp32,
                platform: "held",
                text: None,
            };
            Ok(Box::new(HeldEngine { metadata, gate: gate.clone() }) as Box<dyn Engine>)
        })
    }
}

impl Engine for HeldEngine {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn run(&mut self, inputs: &[Tensor]) -> inferd_core::Result<Vec<Tensor>> {
        let values = inputs[0].to_vec::<f32>()?;
        let firsts: Vec<f32> = values.chunks(64).map(|row| row[0]).collect();
        self.gate.seen.lock().expect("seen").extend(&firsts);
        if firsts.contains(&HOLD) {
            self.gate.held.fetch_add(1, Ordering::SeqCst);
            let mut open = self.gate.open.lock().expect("gate");
            while !*open {
                open = self.gate.opened.wait(open).expect("gate");
            }
            drop(open);
            self.gate.held.fetch_sub(1, Ordering::SeqCst);
        }
        let out: Vec<f32> = firsts.iter().flat_map(|&v| [v; 10]).collect();
        Ok(vec![Tensor::from_slice(vec![firsts.len(), 10], &out)?])
    }
}

/// A `/predict` body of one digits-shaped row starting with `first`.
pub fn row_body(first: f32) -> String {
    let mut row = vec![0.0f32; 64];
    row[0] = first;
    serde_json::json!({ "input": [row] }).to_string()
}

/// Adds `delta` to every element of the FP32 tensor `name` in the safetensors file `file`: a model whose
/// outputs differ from the original's by a known amount (through a bias, say).
pub fn add_to_tensor(file: &Path, name: &str, delta: f32) {
    let mut bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).expect("a safetensors header");
    let entry = &header[name];
    assert_eq!(entry["dtype"], "F32", "{name} is FP32");
    let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().expect("offsets") as usize + 8 + header_len);
    for chunk in bytes[start..end].chunks_exact_mut(4) {
        let value = f32::from_le_bytes(chunk.try_into().expect("4 bytes")) + delta;
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    // A new file renamed over the old one: the old may be a hard link to a bundled model's weights (`copy_tree`),
    // and a server reloading sees either file whole.
    let new = file.with_extension("new");
    std::fs::write(&new, bytes).expect("write the weights");
    std::fs::rename(&new, file).expect("replace the weights");
}
