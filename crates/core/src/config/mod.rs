//! `model.toml`: one model's backend, weights, device, precision, batching and tensors. This module holds the
//! whole configuration and reads it; each section's types live in their own file.

mod batching;
mod image;
mod kinds;
mod options;
mod processor;
mod tensor_spec;
mod versions;
mod warmup;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

pub use batching::{BatchingConfig, DEFAULT_MAX_BATCH_TOKENS, MAX_BATCH_SIZE_LIMIT, MAX_RUN_INLINE_UNDER_US};
pub use image::{
    Anchor, Channels, Filter, ImageConfig, Labels, Layout, OutputConfig, OutputKind, Resize, Rounding,
    DEFAULT_MAX_PIXELS, MAX_IMAGE_SIDE,
};
pub use kinds::{Backend, DeviceSpec, Pooling, Precision, Task};
pub use options::{CandleOptions, MemoryOptions, OnnxOptions, TextOverrides, DEFAULT_TEXT_WEIGHTS};
pub use processor::PROCESSOR_CONFIG_FILE;
pub use tensor_spec::TensorSpec;
pub use versions::VersionPolicy;
pub use warmup::{WarmupConfig, WarmupInput, MAX_WARMUP_ELEMENTS};

use versions::version_folders;

/// The file name of a model's configuration inside its folder.
pub const MODEL_CONFIG_FILE: &str = "model.toml";

/// Largest `instances` accepted.
pub const MAX_INSTANCES: usize = 64;

/// One version of a model, as configured by its `model.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model's name: its folder's name.
    pub name: String,
    /// 1 in a model folder without numbered version folders; otherwise the version folder's number.
    pub version: u64,
    /// The folder that holds the version's files (`file`, a text model's tokenizer and hub files): the model's
    /// folder, or its version folder.
    pub dir: PathBuf,
    /// The `model.toml` this came from, which errors name.
    pub config_file: PathBuf,
    /// Which numbered version folders are served.
    pub version_policy: VersionPolicy,
    pub backend: Backend,
    /// The weights file, resolved against `dir`.
    pub file: PathBuf,
    pub device: DeviceSpec,
    /// `None` when `model.toml` does not say; the server's default then applies.
    pub precision: Option<Precision>,
    pub instances: usize,
    pub batching: BatchingConfig,
    /// Declared inputs; may be empty for ONNX models, whose graph names them.
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub onnx: OnnxOptions,
    pub candle: Option<CandleOptions>,
    pub memory: MemoryOptions,
    pub task: Task,
    /// A text model's settings from `model.toml`; the folder's own files fill in what they leave out.
    pub text: TextOverrides,
    pub warmup: WarmupConfig,
    /// A vision model's preprocessing: it takes encoded pictures.
    pub image: Option<ImageConfig>,
    /// A vision model's post-processing, by output name (`[output.NAME]`); a labels file is resolved against `dir`.
    pub postprocess: Vec<(String, OutputConfig)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelConfig {
    backend: Backend,
    file: Option<PathBuf>,
    #[serde(default)]
    device: DeviceSpec,
    precision: Option<Precision>,
    #[serde(default = "one")]
    instances: usize,
    #[serde(default)]
    batching: BatchingConfig,
    #[serde(default)]
    input: Vec<TensorSpec>,
    /// `[[output]]` tensors, or `[output.NAME]` post-processing tables.
    output: Option<toml::Value>,
    #[serde(default)]
    onnx: OnnxOptions,
    candle: Option<CandleOptions>,
    #[serde(default)]
    memory: MemoryOptions,
    #[serde(default)]
    task: Task,
    tokenizer: Option<PathBuf>,
    pooling: Option<Pooling>,
    normalize: Option<bool>,
    max_seq_len: Option<usize>,
    labels: Option<Vec<String>>,
    #[serde(default)]
    warmup: WarmupConfig,
    #[serde(default)]
    version_policy: VersionPolicy,
    image: Option<ImageConfig>,
}

fn one() -> usize {
    1
}

impl ModelConfig {
    /// Reads the model folder `dir` (named after it) and returns the newest version it serves.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        let mut versions = ModelConfig::load_versions(dir)?;
        versions.pop().ok_or_else(|| Error::config(dir.join(MODEL_CONFIG_FILE), "no version to serve"))
    }

    /// Reads the model folder `dir`, named after it, and returns each version it serves, oldest first. A folder
    /// with numbered subfolders (`1/`, `2/`, … Triton's layout) keeps `model.toml` in the model's folder and each
    /// version's files in its own; `version_policy` chooses the versions served (the newest, by default). A
    /// folder without is version 1, its files beside `model.toml`.
    pub fn load_versions(dir: &Path) -> Result<Vec<ModelConfig>> {
        let path = dir.join(MODEL_CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::config(&path, format!("cannot read: {e}")))?;
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::config(&path, "the model folder's name is not valid UTF-8"))?;
        let available =
            version_folders(dir).map_err(|e| Error::config(&path, format!("cannot list the folder: {e}")))?;
        if available.is_empty() {
            return Ok(vec![ModelConfig::parse(name, dir, &text)?]);
        }
        let first = ModelConfig::parse_version(name, dir, available[0], &text)?;
        let served = first.version_policy.select(&available);
        if served.is_empty() {
            return Err(Error::config(
                &path,
                format!("version_policy: none of the version folders {available:?} is selected"),
            ));
        }
        served.into_iter().map(|v| ModelConfig::parse_version(name, dir, v, &text)).collect()
    }

    /// Parses the text of `<dir>/model.toml` for the model `name`, version 1, its files in `dir`.
    pub fn parse(name: &str, dir: &Path, text: &str) -> Result<ModelConfig> {
        ModelConfig::parse_in(name, dir, dir, 1, text)
    }

    /// Parses `<dir>/model.toml` for version `version`, whose files are in `<dir>/<version>/`.
    fn parse_version(name: &str, dir: &Path, version: u64, text: &str) -> Result<ModelConfig> {
        ModelConfig::parse_in(name, dir, &dir.join(version.to_string()), version, text)
    }

    fn parse_in(name: &str, model_dir: &Path, dir: &Path, version: u64, text: &str) -> Result<ModelConfig> {
        let path = model_dir.join(MODEL_CONFIG_FILE);
        let fail = |message: String| Error::config(&path, message);
        let raw: RawModelConfig = toml::from_str(text).map_err(|e| fail(one_line(&e.to_string())))?;
        let file = match (raw.file, raw.backend, raw.task) {
            (Some(file), _, _) => file,
            (None, Backend::Candle, task) if task.is_text() => PathBuf::from(DEFAULT_TEXT_WEIGHTS),
            (None, _, _) => return Err(fail("missing field `file`".into())),
        };
        let candle = match (raw.candle, raw.backend, raw.task) {
            (None, Backend::Candle, task) if task.is_text() => {
                Some(CandleOptions { architecture: "transformer".into(), layers: Vec::new(), activations: Vec::new() })
            }
            (candle, _, _) => candle,
        };
        let (outputs, postprocess) = match raw.output {
            None => (Vec::new(), Vec::new()),
            Some(toml::Value::Array(specs)) => {
                let specs = toml::Value::Array(specs)
                    .try_into()
                    .map_err(|e| fail(format!("output: {}", one_line(&e.to_string()))))?;
                (specs, Vec::new())
            }
            Some(toml::Value::Table(tables)) => {
                let mut postprocess = Vec::with_capacity(tables.len());
                for (name, table) in tables {
                    let mut output: OutputConfig =
                        table.try_into().map_err(|e| fail(format!("output.{name}: {}", one_line(&e.to_string()))))?;
                    if let Some(Labels::File(file)) = &output.labels {
                        output.labels = Some(Labels::File(dir.join(file)));
                    }
                    postprocess.push((name, output));
                }
                (Vec::new(), postprocess)
            }
            Some(_) => return Err(fail("output: [[output]] tensors, or [output.NAME] tables".into())),
        };
        let config = ModelConfig {
            name: name.to_owned(),
            version,
            dir: dir.to_path_buf(),
            config_file: path.clone(),
            version_policy: raw.version_policy,
            backend: raw.backend,
            file: dir.join(file),
            device: raw.device,
            precision: raw.precision,
            instances: raw.instances,
            batching: raw.batching,
            inputs: raw.input,
            outputs,
            onnx: raw.onnx,
            candle,
            memory: raw.memory,
            task: raw.task,
            text: TextOverrides {
                tokenizer: raw.tokenizer.map(|t| dir.join(t)),
                pooling: raw.pooling,
                normalize: raw.normalize,
                max_seq_len: raw.max_seq_len,
                labels: raw.labels,
            },
            warmup: WarmupConfig {
                inputs: raw
                    .warmup
                    .inputs
                    .into_iter()
                    .map(|(name, input)| {
                        let file = input.file.map(|f| dir.join(f));
                        (name, WarmupInput { file, ..input })
                    })
                    .collect(),
                ..raw.warmup
            },
            image: raw.image,
            postprocess,
        };
        config.validate().map_err(fail)?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!(
                "model name `{}` (the folder's name) may hold only letters, digits, '-', '_' and '.'",
                self.name
            ));
        }
        if !(1..=MAX_INSTANCES).contains(&self.instances) {
            return Err(format!("instances: must be between 1 and {MAX_INSTANCES}, got {}", self.instances));
        }
        let b = &self.batching;
        if b.max_batch_size > MAX_BATCH_SIZE_LIMIT {
            return Err(format!(
                "batching.max_batch_size: must be between 0 (no batching) and {MAX_BATCH_SIZE_LIMIT}, got {}",
                b.max_batch_size
            ));
        }
        if b.max_batch_size == 0 && self.task.is_text() {
            return Err("batching.max_batch_size: a text model batches its texts; 0 is for tensor models".into());
        }
        if b.max_queue_size == 0 {
            return Err("batching.max_queue_size: must be at least 1".into());
        }
        if let Some(bad) = b.preferred_batch_sizes.iter().find(|&&p| p == 0 || p > b.max_batch_size) {
            return Err(format!(
                "batching.preferred_batch_sizes: {bad} is not between 1 and max_batch_size ({})",
                b.max_batch_size
            ));
        }
        if b.max_batch_tokens == 0 {
            return Err("batching.max_batch_tokens: must be at least 1".into());
        }
        if !self.task.is_text() && self.text != TextOverrides::default() {
            return Err(format!(
                "tokenizer, pooling, normalize, max_seq_len and labels belong to text models: set `task` to one that \
                 takes text ({})",
                Task::names(Task::is_text)
            ));
        }
        if self.text.labels.is_some() && !self.task.has_labels() {
            return Err(format!(
                "labels: a model whose task is `{}` has none; only a classification head's have ({})",
                self.task.as_str(),
                Task::names(Task::has_labels)
            ));
        }
        if self.text.labels.as_ref().is_some_and(|l| l.is_empty() || l.iter().any(String::is_empty)) {
            return Err("labels: a list of non-empty names, one per output of the classification head".into());
        }
        if self.task == Task::Rerank && self.text.labels.as_ref().is_some_and(|l| l.len() != 1) {
            return Err("labels: a reranker scores with one label".into());
        }
        if self.text.max_seq_len == Some(0) {
            return Err("max_seq_len: must be at least 1".into());
        }
        if b.max_queue_delay_us > 60_000_000 {
            return Err("batching.max_queue_delay_us: at most 60 s (60000000)".into());
        }
        if b.run_inline_under_us > MAX_RUN_INLINE_UNDER_US {
            return Err(format!(
                "batching.run_inline_under_us: at most {MAX_RUN_INLINE_UNDER_US} (a millisecond), got {}",
                b.run_inline_under_us
            ));
        }
        for (table, specs) in [("input", &self.inputs), ("output", &self.outputs)] {
            for (i, spec) in specs.iter().enumerate() {
                if spec.name.is_empty() {
                    return Err(format!("{table}[{i}].name: must not be empty"));
                }
                if specs[..i].iter().any(|s| s.name == spec.name) {
                    return Err(format!("{table}[{i}].name: `{}` is declared twice", spec.name));
                }
                if spec.shape.first() != Some(&-1) && b.max_batch_size > 0 {
                    return Err(format!(
                        "{table}[{i}].shape: must start with -1, the batch dimension (or set batching.max_batch_size \
                         = 0 for a model without one)"
                    ));
                }
                if let Some(bad) = spec.shape.iter().find(|&&d| d == 0 || d < -1) {
                    return Err(format!("{table}[{i}].shape: {bad} is not a dimension (use -1 for a variable one)"));
                }
            }
        }
        match (self.backend, &self.candle) {
            (Backend::Candle, None) => {
                return Err("candle: a candle model needs a [candle] table naming its architecture".into())
            }
            (Backend::Onnx, Some(_)) => return Err("candle: only a candle model takes a [candle] table".into()),
            _ => {}
        }
        if self.onnx != OnnxOptions::default() && self.backend != Backend::Onnx {
            return Err("onnx: only an onnx model takes an [onnx] table".into());
        }
        self.onnx.validate()?;
        if self.task.is_text() && !self.warmup.inputs.is_empty() {
            return Err(
                "warmup.inputs: a text model warms with texts of its longest length; only `skip` applies".into()
            );
        }
        if let Some(image) = &self.image {
            image.validate()?;
            if self.task != Task::Tensors {
                return Err("image: a vision model's task is the default, `tensors`".into());
            }
        }
        if !self.postprocess.is_empty() && self.image.is_none() {
            return Err("output.NAME tables (post-processing) belong to vision models: add an [image] table".into());
        }
        for (name, output) in &self.postprocess {
            output.validate(name)?;
        }
        for (name, input) in &self.warmup.inputs {
            let count = input.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if input.shape.contains(&0) || count.is_none_or(|n| n > MAX_WARMUP_ELEMENTS) {
                return Err(format!(
                    "warmup.inputs.{name}.shape: {:?} is not a shape of 1 to {MAX_WARMUP_ELEMENTS} elements",
                    input.shape
                ));
            }
        }
        Ok(())
    }
}

/// toml's messages span several lines (a snippet of the file); logs and errors want one.
fn one_line(message: &str) -> String {
    message.split('\n').map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('|')).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests;
