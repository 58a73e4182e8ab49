//! Text models: the contract between the server's tokenizing front and an engine (token inputs in, one pooled
//! vector or one row of logits per text out), the settings read from a sentence-transformers or hub folder, and
//! pooling on the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{ModelConfig, Pooling};
use crate::error::{Error, Result};

/// Token ids, `INT64 [rows, seq]`.
pub const INPUT_IDS: &str = "input_ids";
/// 1 for a real token, 0 for padding, `INT64 [rows, seq]`.
pub const ATTENTION_MASK: &str = "attention_mask";
/// Segment ids (all 0 for one text), `INT64 [rows, seq]`.
pub const TOKEN_TYPE_IDS: &str = "token_type_ids";
/// The token inputs a text engine may take, in this order when it takes them all.
pub const TOKEN_INPUTS: [&str; 3] = [INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS];
/// An embedding model's one output: `FP32 [rows, dimensions]`, pooled, not normalised.
pub const EMBEDDING_OUTPUT: &str = "embedding";
/// A scoring model's one output (rerank, classify): its head's raw logits, `FP32 [rows, labels]`.
pub const LOGITS_OUTPUT: &str = "logits";

/// What a loaded text model is, as its engine reports it in its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextInfo {
    /// The `tokenizer.json` the server tokenizes with.
    pub tokenizer: PathBuf,
    /// Tokens per text at most, special tokens included.
    pub max_seq_len: usize,
    pub pooling: Pooling,
    /// Whether embeddings are normalised to unit length unless a request says otherwise.
    pub normalize: bool,
    /// The embedding's length; a scoring model's count of labels.
    pub dimensions: usize,
    /// Token ids are below this.
    pub vocab_size: Option<usize>,
    /// A scoring model's label names, one per logit; empty for an embedding model.
    pub labels: Vec<String>,
    /// A scoring model whose labels are independent (sigmoid per label) rather than exclusive (softmax).
    pub multi_label: bool,
    /// Whether the engine gives each token's final state ([`crate::Engine::run_hidden`]): what `/embed_all`
    /// serves. Set by the engine.
    pub hidden_states: bool,
}

/// A text model's settings: `model.toml`'s keys first, then the folder's sentence-transformers files
/// (`modules.json`, the pooling module's `config.json`, `sentence_bert_config.json`), then the hub's `config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextSettings {
    pub tokenizer: PathBuf,
    pub max_seq_len: usize,
    pub pooling: Pooling,
    pub normalize: bool,
    pub vocab_size: Option<usize>,
    /// A scoring model's label names, when `model.toml` or the hub's `config.json` names them.
    pub labels: Option<Vec<String>>,
    pub multi_label: bool,
}

/// The few fields of the hub's `config.json` that matter here.
#[derive(Deserialize)]
struct HubConfig {
    max_position_embeddings: Option<usize>,
    vocab_size: Option<usize>,
    model_type: Option<String>,
    pad_token_id: Option<usize>,
    /// A classification head's label names by index (`{"0": "negative", …}`).
    id2label: Option<BTreeMap<String, String>>,
    problem_type: Option<String>,
}

impl HubConfig {
    /// The positions a text may take: RoBERTa's family numbers positions from `pad_token_id + 1`, so it takes that
    /// many fewer than its table holds.
    fn positions(&self) -> Option<usize> {
        let table = self.max_position_embeddings?;
        match self.model_type.as_deref() {
            Some(kind) if is_roberta(kind) => Some(table.saturating_sub(self.pad_token_id.unwrap_or(1) + 1)),
            _ => Some(table),
        }
    }

    /// `id2label`'s names in index order, or why they are not a list.
    fn labels(&self, path: &Path) -> Result<Option<Vec<String>>> {
        let Some(map) = &self.id2label else { return Ok(None) };
        let mut numbered = map
            .iter()
            .map(|(k, v)| k.parse::<usize>().map(|i| (i, v.clone())))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| Error::config(path, "id2label: its keys must be the label indices 0, 1, …"))?;
        numbered.sort();
        if numbered.iter().enumerate().any(|(i, (k, _))| i != *k) {
            return Err(Error::config(path, "id2label: its keys must be the label indices 0, 1, … without gaps"));
        }
        Ok(Some(numbered.into_iter().map(|(_, v)| v).collect()))
    }
}

/// Whether a hub `model_type` is of RoBERTa's family (positions offset past the padding id, one token type).
pub fn is_roberta(model_type: &str) -> bool {
    matches!(model_type, "roberta" | "xlm-roberta" | "camembert")
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type", default)]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

/// Reads `dir/name` as JSON, if the file is there.
fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<Option<T>> {
    let path = dir.join(name);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::config(&path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map(Some).map_err(|e| Error::config(&path, format!("not the JSON expected: {e}")))
}

impl TextSettings {
    /// Resolves a text model's settings from `model.toml` and its folder.
    pub fn resolve(config: &ModelConfig) -> Result<TextSettings> {
        let dir = &config.dir;
        let toml = config.config_file.as_path();
        let overrides = &config.text;
        let hub: Option<HubConfig> = read_json(dir, "config.json")?;
        let scores = config.task.scores();
        let modules: Vec<Module> = read_json(dir, "modules.json")?.unwrap_or_default();
        let pooling = match overrides.pooling {
            Some(p) => p,
            // A classification head reads the first token's state.
            None if scores => Pooling::Cls,
            None => match modules.iter().find(|m| m.kind.ends_with(".Pooling")) {
                Some(m) => folder_pooling(dir, &m.path)?,
                None => Pooling::Mean,
            },
        };
        let normalize = overrides.normalize.unwrap_or_else(|| modules.iter().any(|m| m.kind.ends_with(".Normalize")));
        let positions = hub.as_ref().and_then(HubConfig::positions);
        let max_seq_len = match overrides.max_seq_len {
            Some(n) => n,
            None => read_json::<SentenceBertConfig>(dir, "sentence_bert_config.json")?
                .and_then(|s| s.max_seq_length)
                .or(positions)
                .ok_or_else(|| {
                    Error::config(
                        toml,
                        "max_seq_len: the folder does not say how long a text may be (no sentence_bert_config.json \
                         or config.json): set max_seq_len",
                    )
                })?,
        };
        if let Some(positions) = positions.filter(|&p| max_seq_len > p) {
            return Err(Error::config(
                toml,
                format!("max_seq_len: {max_seq_len} is more than the model's {positions} positions (config.json)"),
            ));
        }
        let tokenizer = overrides.tokenizer.clone().unwrap_or_else(|| dir.join("tokenizer.json"));
        if !tokenizer.is_file() {
            return Err(Error::config(
                toml,
                format!(
                    "tokenizer: {} does not exist; a text model needs a tokenizer.json in its folder or a `tokenizer` \
                     path in model.toml",
                    tokenizer.display()
                ),
            ));
        }
        let hub_path = dir.join("config.json");
        let labels = match (&overrides.labels, &hub) {
            (Some(labels), _) => Some(labels.clone()),
            (None, Some(hub)) if scores => hub.labels(&hub_path)?,
            (None, _) => None,
        };
        let multi_label = hub.as_ref().and_then(|h| h.problem_type.as_deref()) == Some("multi_label_classification");
        Ok(TextSettings {
            tokenizer,
            max_seq_len,
            pooling,
            normalize: normalize && !scores,
            vocab_size: hub.and_then(|h| h.vocab_size),
            labels: labels.filter(|_| scores),
            multi_label: multi_label && scores,
        })
    }

    /// The metadata of a model with these settings whose engine gives `dimensions` values per text. A scoring
    /// model's labels must be as many as its logits; unnamed ones are `LABEL_i`, as the hub names them.
    pub fn info(&self, config: &ModelConfig, dimensions: usize) -> Result<TextInfo> {
        let labels = match (&self.labels, config.task.scores()) {
            (_, false) => Vec::new(),
            (Some(labels), true) if labels.len() != dimensions => {
                return Err(Error::config(
                    &config.config_file,
                    format!("labels: {} are named, but the model's head gives {dimensions} scores", labels.len()),
                ))
            }
            (Some(labels), true) => labels.clone(),
            (None, true) => (0..dimensions).map(|i| format!("LABEL_{i}")).collect(),
        };
        if config.task == crate::config::Task::Rerank && dimensions != 1 {
            return Err(Error::config(
                &config.config_file,
                format!("task = \"rerank\" needs a head with one score; this model's gives {dimensions} (use task = \"classify\")"),
            ));
        }
        Ok(TextInfo {
            tokenizer: self.tokenizer.clone(),
            max_seq_len: self.max_seq_len,
            pooling: self.pooling,
            normalize: self.normalize,
            dimensions,
            vocab_size: self.vocab_size,
            labels,
            multi_label: self.multi_label,
            hidden_states: false,
        })
    }
}

/// The pooling that a sentence-transformers pooling module's `config.json` names.
fn folder_pooling(dir: &Path, module: &str) -> Result<Pooling> {
    let path = dir.join(module).join("config.json");
    let Some(c) = read_json::<PoolingConfig>(&dir.join(module), "config.json")? else {
        return Ok(Pooling::Mean);
    };
    match (
        c.pooling_mode_cls_token,
        c.pooling_mode_mean_tokens,
        c.pooling_mode_max_tokens || c.pooling_mode_mean_sqrt_len_tokens,
    ) {
        (true, false, false) => Ok(Pooling::Cls),
        (false, true, false) => Ok(Pooling::Mean),
        _ => Err(Error::config(
            path,
            "inferd pools by `mean` or `cls` alone; set pooling in model.toml to use this model with one of them",
        )),
    }
}

/// Pools a last hidden state `[rows, seq, dim]` (row-major) into `[rows, dim]`, counting only the tokens whose
/// `mask` is non-zero.
pub fn pool(hidden: &[f32], mask: &[i64], rows: usize, seq: usize, dim: usize, pooling: Pooling) -> Result<Vec<f32>> {
    if hidden.len() != rows * seq * dim || mask.len() != rows * seq {
        return Err(Error::Engine(format!(
            "cannot pool a hidden state of {} values with a mask of {} as [{rows}, {seq}, {dim}]",
            hidden.len(),
            mask.len()
        )));
    }
    let mut out = vec![0f32; rows * dim];
    for (r, pooled) in out.chunks_exact_mut(dim).enumerate() {
        let states = &hidden[r * seq * dim..(r + 1) * seq * dim];
        match pooling {
            Pooling::Cls => pooled.copy_from_slice(&states[..dim]),
            Pooling::Mean => {
                let row_mask = &mask[r * seq..(r + 1) * seq];
                let mut count = 0f32;
                for (state, _) in states.chunks_exact(dim).zip(row_mask).filter(|(_, &m)| m != 0) {
                    count += 1.0;
                    for (p, s) in pooled.iter_mut().zip(state) {
                        *p += s;
                    }
                }
                let count = count.max(1.0);
                pooled.iter_mut().for_each(|p| *p /= count);
            }
        }
    }
    Ok(out)
}

/// Scales `vector` to unit length (a zero vector stays zero).
pub fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|v| *v = (f64::from(*v) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pooling_skips_padding_and_cls_takes_the_first_token() {
        // Two rows of three tokens, dim 2; row 1 has one padding token carrying garbage.
        let hidden = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 20.0, 30.0, 40.0, 1e6, -1e6];
        let mask = [1, 1, 1, 1, 1, 0];
        let mean = pool(&hidden, &mask, 2, 3, 2, Pooling::Mean).expect("pool");
        assert_eq!(mean, vec![3.0, 4.0, 20.0, 30.0]);
        let cls = pool(&hidden, &mask, 2, 3, 2, Pooling::Cls).expect("pool");
        assert_eq!(cls, vec![1.0, 2.0, 10.0, 20.0]);
        assert!(pool(&hidden, &mask, 2, 2, 2, Pooling::Mean).is_err());
    }

    #[test]
    fn normalize_gives_unit_length() {
        let mut v = [3.0f32, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0f32; 3];
        normalize(&mut zero);
        assert_eq!(zero, [0.0; 3]);
    }

    fn folder(files: &[(&str, &str)]) -> (tempfile::TempDir, ModelConfig) {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m");
        for (name, text) in files {
            let path = model.join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
        let config = ModelConfig::load(&model).expect("model.toml");
        (dir, config)
    }

    const HUB: &str = r#"{"max_position_embeddings": 512, "vocab_size": 30522}"#;
    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn a_sentence_transformers_folder_says_everything() {
        let (_dir, config) = folder(&[
            ("model.toml", "backend = \"candle\"\ntask = \"embed\"\n"),
            ("config.json", HUB),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", r#"{"pooling_mode_cls_token": true}"#),
            ("sentence_bert_config.json", r#"{"max_seq_length": 256}"#),
            ("tokenizer.json", "{}"),
        ]);
        let s = TextSettings::resolve(&config).expect("resolves");
        assert_eq!((s.pooling, s.normalize, s.max_seq_len, s.vocab_size), (Pooling::Cls, true, 256, Some(30522)));
        assert_eq!(s.tokenizer, config.dir.join("tokenizer.json"));
    }

    #[test]
    fn model_toml_overrides_the_folder() {
        let (_dir, config) = folder(&[
            ("model.toml", "backend = \"candle\"\ntask = \"embed\"\npooling = \"mean\"\nnormalize = false\nmax_seq_len = 64\ntokenizer = \"t/tok.json\"\n"),
            ("config.json", HUB),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", r#"{"pooling_mode_cls_token": true}"#),
            ("t/tok.json", "{}"),
        ]);
        let s = TextSettings::resolve(&config).expect("resolves");
        assert_eq!((s.pooling, s.normalize, s.max_seq_len), (Pooling::Mean, false, 64));
        assert_eq!(s.tokenizer, config.dir.join("t/tok.json"));
    }

    #[test]
    fn what_cannot_be_served_is_refused_with_the_reason() {
        let (_dir, config) = folder(&[
            ("model.toml", "backend = \"candle\"\ntask = \"embed\"\nmax_seq_len = 1024\n"),
            ("config.json", HUB),
            ("tokenizer.json", "{}"),
        ]);
        let err = TextSettings::resolve(&config).expect_err("too long").to_string();
        assert!(err.contains("more than the model's 512 positions"), "{err}");
        let (_dir, config) =
            folder(&[("model.toml", "backend = \"onnx\"\nfile = \"m.onnx\"\ntask = \"embed\"\nmax_seq_len = 8\n")]);
        let err = TextSettings::resolve(&config).expect_err("no tokenizer").to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
        let (_dir, config) = folder(&[
            ("model.toml", "backend = \"onnx\"\nfile = \"m.onnx\"\ntask = \"embed\"\nmax_seq_len = 8\n"),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", r#"{"pooling_mode_max_tokens": true}"#),
        ]);
        let err = TextSettings::resolve(&config).expect_err("max pooling").to_string();
        assert!(err.contains("`mean` or `cls`"), "{err}");
    }
}
