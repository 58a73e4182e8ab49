//! Text models: the contract between the server's tokenizing front and an engine (token inputs in; out, what the
//! task asks for: a pooled vector, a head's scores, each token's state or scores, sparse vocabulary weights), the
//! settings read from a sentence-transformers or hub folder, and the host's own pooling.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{ModelConfig, Pooling};
use crate::error::{Error, Result};

mod vectors;

pub use vectors::{normalize, pool, splade};

/// Token ids, `INT64 [rows, seq]`.
pub const INPUT_IDS: &str = "input_ids";
/// 1 for a real token, 0 for padding, `INT64 [rows, seq]`.
pub const ATTENTION_MASK: &str = "attention_mask";
/// Segment ids (all 0 for one text), `INT64 [rows, seq]`.
pub const TOKEN_TYPE_IDS: &str = "token_type_ids";
/// The token inputs a text engine may take, in this order when it takes them all.
pub const TOKEN_INPUTS: [&str; 3] = [INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS];

/// What a text engine computes from a batch of token sequences: the output a task asks for. Every contract is one
/// FP32 tensor whose first dimension is the batch's rows; an engine serves the contracts its model has the weights
/// for, and never knows which task asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Contract {
    /// One vector per sequence, `[rows, dimensions]`: the last hidden state pooled as [`TextInfo::pooling`] says,
    /// not normalised.
    Pooled,
    /// Each token's final state, `[rows, seq, dimensions]`.
    TokenStates,
    /// The sequence-classification head's logits, `[rows, labels]`.
    SequenceScores,
    /// The token-classification head's logits for each token, `[rows, seq, labels]`.
    TokenScores,
    /// SPLADE's weight of each vocabulary entry, `[rows, vocab]`: the masked-LM head's logits through
    /// `log(1 + relu(x))`, the largest over the sequence's real tokens.
    SparseWeights,
}

impl Contract {
    pub fn as_str(self) -> &'static str {
        match self {
            Contract::Pooled => "pooled vector",
            Contract::TokenStates => "per-token states",
            Contract::SequenceScores => "per-sequence scores",
            Contract::TokenScores => "per-token scores",
            Contract::SparseWeights => "sparse vocabulary weights",
        }
    }

    /// Whether it has a value per token, `[rows, seq, width]` (a padded position's values are whatever the engine
    /// left there), rather than one row per sequence.
    pub fn per_token(self) -> bool {
        matches!(self, Contract::TokenStates | Contract::TokenScores)
    }

    /// Whether it ends in a classification head, whose outputs have labels.
    pub fn has_labels(self) -> bool {
        matches!(self, Contract::SequenceScores | Contract::TokenScores)
    }
}

/// How a model of two towers (CLIP, SigLIP) scores a picture against a text: its logit is `scale` × the cosine of
/// their embeddings, plus `bias`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Similarity {
    /// `exp(logit_scale)`.
    pub scale: f32,
    /// SigLIP's `logit_bias`. With one, each text is scored alone (a sigmoid); without, texts share one softmax.
    pub bias: Option<f32>,
}

/// What a loaded text model is, as its engine reports it in its metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct TextInfo {
    /// The `tokenizer.json` the server tokenizes with.
    pub tokenizer: PathBuf,
    /// Tokens per text at most, special tokens included.
    pub max_seq_len: usize,
    pub pooling: Pooling,
    /// Whether the folder says its embeddings are normalised to unit length (`modules.json`'s `Normalize`).
    pub normalize: bool,
    /// The length of a token's state, and of a pooled vector.
    pub dimensions: usize,
    /// Token ids are below this.
    pub vocab_size: Option<usize>,
    /// The classification head's label names, one per logit; empty where the model has no head.
    pub labels: Vec<String>,
    /// A head whose labels are independent (sigmoid per label) rather than exclusive (softmax).
    pub multi_label: bool,
    /// What the engine computes ([`crate::Engine::run_text`]), the one its metadata's output describes first.
    pub contracts: Vec<Contract>,
    /// sentence-transformers' prompts by name, put before a text (`config_sentence_transformers.json`).
    pub prompts: BTreeMap<String, String>,
    /// The prompt a text takes when its request names none.
    pub default_prompt: Option<String>,
    /// A model of two towers' text tower: how its texts score against pictures.
    pub similarity: Option<Similarity>,
}

impl TextInfo {
    /// Whether the engine computes `contract`.
    pub fn serves(&self, contract: Contract) -> bool {
        self.contracts.contains(&contract)
    }

    /// The length of `contract`'s last dimension: the state's length, the head's labels, or the vocabulary's size.
    pub fn width(&self, contract: Contract) -> Option<usize> {
        match contract {
            Contract::Pooled | Contract::TokenStates => Some(self.dimensions),
            Contract::SequenceScores | Contract::TokenScores => Some(self.labels.len()),
            Contract::SparseWeights => self.vocab_size,
        }
    }
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
    pub prompts: BTreeMap<String, String>,
    pub default_prompt: Option<String>,
}

/// The few fields of the hub's `config.json` that matter here.
#[derive(Deserialize)]
struct HubConfig {
    max_position_embeddings: Option<usize>,
    /// NomicBERT's GPT-2-style name for it.
    n_positions: Option<usize>,
    vocab_size: Option<usize>,
    model_type: Option<String>,
    pad_token_id: Option<usize>,
    /// A classification head's label names by index (`{"0": "negative", …}`).
    id2label: Option<BTreeMap<String, String>>,
    problem_type: Option<String>,
    /// A model of two towers' (CLIP's, SigLIP's) text tower, where its positions and vocabulary are.
    text_config: Option<Box<HubConfig>>,
}

impl HubConfig {
    /// The positions a text may take: RoBERTa's family and MPNet number positions from `pad_token_id + 1`, so they
    /// take that many fewer than their table holds.
    fn positions(&self) -> Option<usize> {
        if let Some(text) = &self.text_config {
            return text.positions();
        }
        let table = self.max_position_embeddings.or(self.n_positions)?;
        match self.model_type.as_deref() {
            Some(kind) if is_roberta(kind) || kind == "mpnet" => {
                Some(table.saturating_sub(self.pad_token_id.unwrap_or(1) + 1))
            }
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
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    /// Whether a prompt's tokens are pooled with the text's.
    #[serde(default = "yes")]
    include_prompt: bool,
}

fn yes() -> bool {
    true
}

/// `config_sentence_transformers.json`: the prompts a model was trained with.
#[derive(Deserialize)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
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
    /// Resolves a text model's settings from `model.toml` and its folder, for an engine asked for `wants` (a
    /// head's labels are read only where a contract has them).
    pub fn resolve(config: &ModelConfig, wants: &[Contract]) -> Result<TextSettings> {
        let dir = &config.dir;
        let toml = config.config_file.as_path();
        let overrides = &config.text;
        let hub: Option<HubConfig> = read_json(dir, "config.json")?;
        let headed = wants.iter().any(|c| c.has_labels());
        let modules: Vec<Module> = read_json(dir, "modules.json")?.unwrap_or_default();
        let pooling = match overrides.pooling {
            Some(p) => p,
            // Only a pooled vector is pooled: the rest read what their heads read, whatever this says.
            None if !wants.contains(&Contract::Pooled) => Pooling::Cls,
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
            (None, Some(hub)) if headed => hub.labels(&hub_path)?,
            (None, _) => None,
        };
        let multi_label = hub.as_ref().and_then(|h| h.problem_type.as_deref()) == Some("multi_label_classification");
        let (prompts, default_prompt) = read_prompts(dir, &modules)?;
        Ok(TextSettings {
            tokenizer,
            max_seq_len,
            pooling,
            normalize,
            vocab_size: hub.and_then(|h| h.text_config.as_ref().map_or(h.vocab_size, |t| t.vocab_size)),
            labels: labels.filter(|_| headed),
            multi_label: multi_label && headed,
            prompts,
            default_prompt,
        })
    }

    /// The metadata of a model with these settings whose engine computes `contracts` (the first is what its
    /// metadata's output describes), with `dimensions`-long states and a head of `head` labels (none without a
    /// head). The head's labels must be as many as its logits; unnamed ones are `LABEL_i`, as the hub names them.
    pub fn info(
        &self,
        config: &ModelConfig,
        contracts: Vec<Contract>,
        dimensions: usize,
        head: Option<usize>,
    ) -> Result<TextInfo> {
        let labels = match (&self.labels, head) {
            (_, None) => Vec::new(),
            (Some(labels), Some(n)) if labels.len() != n => {
                return Err(Error::config(
                    &config.config_file,
                    format!("labels: {} are named, but the model's head gives {n} scores", labels.len()),
                ))
            }
            (Some(labels), Some(_)) => labels.clone(),
            (None, Some(n)) => (0..n).map(|i| format!("LABEL_{i}")).collect(),
        };
        Ok(TextInfo {
            tokenizer: self.tokenizer.clone(),
            max_seq_len: self.max_seq_len,
            pooling: self.pooling,
            normalize: self.normalize,
            dimensions,
            vocab_size: self.vocab_size,
            labels,
            multi_label: self.multi_label,
            contracts,
            prompts: self.prompts.clone(),
            default_prompt: self.default_prompt.clone(),
            similarity: None,
        })
    }
}

/// How a text engine names its output for `contract` in its metadata (the tensor protocols show the task's own).
pub fn contract_output(contract: Contract, width: usize) -> crate::TensorSpec {
    let (name, mut shape) = match contract {
        Contract::Pooled => ("pooled", vec![-1]),
        Contract::TokenStates => ("token_states", vec![-1, -1]),
        Contract::SequenceScores => ("sequence_scores", vec![-1]),
        Contract::TokenScores => ("token_scores", vec![-1, -1]),
        Contract::SparseWeights => ("sparse_weights", vec![-1]),
    };
    shape.push(i64::try_from(width).unwrap_or(-1));
    crate::TensorSpec { name: name.into(), datatype: crate::DataType::Fp32, shape, optional: false }
}

/// The prompts of `config_sentence_transformers.json`, and the default one. A default that names no prompt, or
/// prompts whose tokens the pooling module leaves out (`include_prompt: false`, which inferd does not do), are
/// refused.
fn read_prompts(dir: &Path, modules: &[Module]) -> Result<(BTreeMap<String, String>, Option<String>)> {
    const FILE: &str = "config_sentence_transformers.json";
    let Some(c) = read_json::<SentenceTransformersConfig>(dir, FILE)? else { return Ok((BTreeMap::new(), None)) };
    let path = dir.join(FILE);
    let default = c.default_prompt_name.filter(|name| !name.is_empty());
    if let Some(name) = default.as_ref().filter(|name| !c.prompts.contains_key(*name)) {
        return Err(Error::config(path, format!("default_prompt_name: `{name}` is not one of its prompts")));
    }
    let pooling = modules.iter().find(|m| m.kind.ends_with(".Pooling"));
    let pooled = pooling.map(|m| read_json::<PoolingConfig>(&dir.join(&m.path), "config.json")).transpose()?.flatten();
    if pooled.is_some_and(|p| !p.include_prompt) && c.prompts.values().any(|p| !p.is_empty()) {
        return Err(Error::config(
            path,
            "prompts: the pooling module leaves the prompt's tokens out (include_prompt: false), which inferd does not \
             do; remove the prompts to serve the model without them",
        ));
    }
    Ok((c.prompts, default))
}

/// The pooling that a sentence-transformers pooling module's `config.json` names.
fn folder_pooling(dir: &Path, module: &str) -> Result<Pooling> {
    let path = dir.join(module).join("config.json");
    let Some(c) = read_json::<PoolingConfig>(&dir.join(module), "config.json")? else {
        return Ok(Pooling::Mean);
    };
    let modes = [
        (c.pooling_mode_cls_token, Pooling::Cls),
        (c.pooling_mode_mean_tokens, Pooling::Mean),
        (c.pooling_mode_max_tokens, Pooling::Max),
        (c.pooling_mode_mean_sqrt_len_tokens, Pooling::MeanSqrtLen),
        (c.pooling_mode_weightedmean_tokens, Pooling::WeightedMean),
        (c.pooling_mode_lasttoken, Pooling::LastToken),
    ];
    let named: Vec<Pooling> = modes.iter().filter(|(on, _)| *on).map(|(_, p)| *p).collect();
    match named[..] {
        [] => Ok(Pooling::Mean),
        [one] => Ok(one),
        _ => Err(Error::config(
            path,
            format!(
                "the pooling modes {} are named together, which concatenates their vectors; inferd pools by one: set \
                 pooling in model.toml to one of them",
                named.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = TextSettings::resolve(&config, &[Contract::Pooled]).expect("resolves");
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
        let s = TextSettings::resolve(&config, &[Contract::Pooled]).expect("resolves");
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
        let err = TextSettings::resolve(&config, &[Contract::Pooled]).expect_err("too long").to_string();
        assert!(err.contains("more than the model's 512 positions"), "{err}");
        let (_dir, config) =
            folder(&[("model.toml", "backend = \"onnx\"\nfile = \"m.onnx\"\ntask = \"embed\"\nmax_seq_len = 8\n")]);
        let err = TextSettings::resolve(&config, &[Contract::Pooled]).expect_err("no tokenizer").to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
        let (_dir, config) = folder(&[
            ("model.toml", "backend = \"onnx\"\nfile = \"m.onnx\"\ntask = \"embed\"\nmax_seq_len = 8\n"),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", r#"{"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": true}"#),
        ]);
        let err = TextSettings::resolve(&config, &[Contract::Pooled]).expect_err("two modes").to_string();
        assert!(err.contains("the pooling modes mean, max are named together"), "{err}");
    }
}
