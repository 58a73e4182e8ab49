//! The text front of a text model: texts (or token ids) in, token sequences for the batcher out, and the model's
//! public face (a `BYTES` input of texts, an `FP32` embedding output). Tokenizing is CPU work: callers run it on
//! the blocking pool, never on the async runtime's threads.

use std::sync::Arc;
use std::time::Instant;

use inferd_batcher::InferRequest;
use inferd_core::text::{TextInfo, ATTENTION_MASK, EMBEDDING_OUTPUT, INPUT_IDS};
use inferd_core::{DataType, ModelMetadata, Tensor, TensorSpec};
use tokenizers::{Tokenizer, TruncationParams};

use crate::codec::{CodecError, Limits};

/// The name of a text model's one input on the tensor protocols (KServe v2, `/predict`).
pub const TEXT_INPUT: &str = "text";

/// What a request asks to embed.
#[derive(Debug, Clone, PartialEq)]
pub enum TextInput {
    Texts(Vec<String>),
    /// Token ids as the client tokenized them (OpenAI's list of token lists): used as they are.
    Ids(Vec<Vec<u32>>),
}

impl TextInput {
    fn len(&self) -> usize {
        match self {
            TextInput::Texts(t) => t.len(),
            TextInput::Ids(i) => i.len(),
        }
    }
}

/// A text request, decoded.
#[derive(Debug)]
pub struct TextJob {
    pub input: TextInput,
    /// Cut texts longer than the model takes (`false`: refuse them).
    pub truncate: bool,
    /// Unit-length embeddings; `None`: as the model says.
    pub normalize: Option<bool>,
    pub deadline: Option<Instant>,
}

impl TextJob {
    pub fn new(input: TextInput) -> Self {
        TextJob { input, truncate: true, normalize: None, deadline: None }
    }
}

/// A text job made ready for the batcher.
#[derive(Debug)]
pub struct Prepared {
    pub request: InferRequest,
    /// Tokens over all the texts, special tokens included.
    pub tokens: usize,
    pub normalize: bool,
}

/// A loaded text model's tokenizer and public face. Shared by every request to the model.
pub struct TextModel {
    /// Neither pads nor truncates: the batcher pads, and truncation is asked per request.
    tokenizer: Tokenizer,
    /// Truncates at `max_seq_len`.
    truncating: Tokenizer,
    info: TextInfo,
    vocab_size: usize,
    /// The engine's token inputs, in its order.
    inputs: Vec<String>,
    /// What the tensor protocols show: texts in, embeddings out.
    public: ModelMetadata,
}

impl std::fmt::Debug for TextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextModel").field("info", &self.info).finish_non_exhaustive()
    }
}

impl TextModel {
    /// Loads the tokenizer a text engine's metadata names. Blocking.
    pub fn load(engine: &ModelMetadata) -> anyhow::Result<Arc<TextModel>> {
        let info = engine.text.clone().ok_or_else(|| anyhow::anyhow!("the engine is not a text model's"))?;
        let path = &info.tokenizer;
        let mut tokenizer = Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("cannot read the tokenizer {}: {e}", path.display()))?;
        // A hub tokenizer.json may pad to a fixed length and truncate at its own: both are inferd's to decide.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| anyhow::anyhow!("tokenizer {}: {e}", path.display()))?;
        let mut truncating = tokenizer.clone();
        truncating
            .with_truncation(Some(TruncationParams { max_length: info.max_seq_len, ..TruncationParams::default() }))
            .map_err(|e| anyhow::anyhow!("tokenizer {}: {e}", path.display()))?;
        let vocab_size = info.vocab_size.unwrap_or_else(|| tokenizer.get_vocab_size(true));
        let public = ModelMetadata {
            inputs: vec![TensorSpec { name: TEXT_INPUT.into(), datatype: DataType::Bytes, shape: vec![-1] }],
            outputs: vec![TensorSpec {
                name: EMBEDDING_OUTPUT.into(),
                datatype: DataType::Fp32,
                shape: vec![-1, info.dimensions as i64],
            }],
            ..engine.clone()
        };
        Ok(Arc::new(TextModel {
            tokenizer,
            truncating,
            vocab_size,
            inputs: engine.inputs.iter().map(|s| s.name.clone()).collect(),
            public,
            info,
        }))
    }

    pub fn info(&self) -> &TextInfo {
        &self.info
    }

    /// The model as the tensor protocols show it.
    pub fn public(&self) -> &ModelMetadata {
        &self.public
    }

    /// The texts of a request on a tensor protocol: its one `BYTES` input, each element UTF-8.
    pub fn job_from_tensors(&self, request: InferRequest) -> Result<TextJob, CodecError> {
        let inferd_batcher::Inputs::Rows(inputs) = request.inputs else {
            return Err(CodecError::Invalid("a text model takes texts".into()));
        };
        let strings = match inputs.as_slice() {
            [t] => t.byte_strings().unwrap_or_default(),
            _ => return Err(CodecError::Invalid(format!("a text model takes one input, `{TEXT_INPUT}`"))),
        };
        let texts = strings
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                String::from_utf8(bytes.clone())
                    .map_err(|_| CodecError::Invalid(format!("input `{TEXT_INPUT}`: element {i} is not UTF-8 text")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TextJob { deadline: request.deadline, ..TextJob::new(TextInput::Texts(texts)) })
    }

    /// Tokenizes a job into one sequence per text, within `limits` (texts count as rows). Blocking.
    pub fn prepare(&self, job: TextJob, limits: &Limits) -> Result<Prepared, CodecError> {
        let count = job.input.len();
        if count == 0 {
            return Err(CodecError::Invalid("no texts to embed: the input is empty".into()));
        }
        if count > limits.max_rows {
            return Err(CodecError::OverLimit(format!(
                "the request has {count} texts; this server takes at most {} per request (--max-rows)",
                limits.max_rows
            )));
        }
        let max = self.info.max_seq_len;
        let mut sequences = Vec::with_capacity(count);
        let mut tokens = 0usize;
        match job.input {
            TextInput::Texts(texts) => {
                for (i, text) in texts.iter().enumerate() {
                    if text.is_empty() {
                        return Err(CodecError::Invalid(format!("text {i} is empty: there is nothing to embed")));
                    }
                    let tokenizer = if job.truncate { &self.truncating } else { &self.tokenizer };
                    let encoding = tokenizer
                        .encode_fast(text.as_str(), true)
                        .map_err(|e| CodecError::Invalid(format!("text {i} cannot be tokenized: {e}")))?;
                    let ids = encoding.get_ids();
                    if ids.len() > max {
                        return Err(CodecError::Invalid(format!(
                            "text {i} is {} tokens long; this model takes at most {max} (send \"truncate\": true to \
                             cut it)",
                            ids.len()
                        )));
                    }
                    tokens += ids.len();
                    sequences.push(self.sequence(ids, encoding.get_type_ids())?);
                }
            }
            TextInput::Ids(lists) => {
                for (i, ids) in lists.iter().enumerate() {
                    if ids.is_empty() {
                        return Err(CodecError::Invalid(format!("token list {i} is empty: there is nothing to embed")));
                    }
                    if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
                        return Err(CodecError::Invalid(format!(
                            "token list {i}: id {bad} is outside the model's vocabulary of {} tokens",
                            self.vocab_size
                        )));
                    }
                    let ids = if ids.len() > max && job.truncate { &ids[..max] } else { &ids[..] };
                    if ids.len() > max {
                        return Err(CodecError::Invalid(format!(
                            "token list {i} is {} tokens long; this model takes at most {max}",
                            ids.len()
                        )));
                    }
                    tokens += ids.len();
                    sequences.push(self.sequence(ids, &vec![0; ids.len()])?);
                }
            }
        }
        let request = InferRequest::sequences(sequences).with_deadline(job.deadline);
        Ok(Prepared { request, tokens, normalize: job.normalize.unwrap_or(self.info.normalize) })
    }

    /// One sequence's token inputs `[1, len]`, in the engine's order.
    fn sequence(&self, ids: &[u32], types: &[u32]) -> Result<Vec<Tensor>, CodecError> {
        let len = ids.len();
        self.inputs
            .iter()
            .map(|name| {
                let values: Vec<i64> = match name.as_str() {
                    INPUT_IDS => ids.iter().map(|&i| i64::from(i)).collect(),
                    ATTENTION_MASK => vec![1; len],
                    _ => types.iter().map(|&i| i64::from(i)).collect(),
                };
                Tensor::from_slice(vec![1, len], &values).map_err(|e| CodecError::Encode(e.to_string()))
            })
            .collect()
    }
}

/// Scales each row of an `FP32 [rows, dim]` tensor to unit length.
pub fn normalize_rows(t: &Tensor) -> Result<Tensor, CodecError> {
    let dim = t.shape().last().copied().unwrap_or(1).max(1);
    let mut values = t.to_vec::<f32>().map_err(|e| CodecError::Encode(e.to_string()))?;
    values.chunks_exact_mut(dim).for_each(inferd_core::text::normalize);
    Tensor::from_slice(t.shape().to_vec(), &values).map_err(|e| CodecError::Encode(e.to_string()))
}
