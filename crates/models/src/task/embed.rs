//! The embed task: texts (or token ids) in, tokenized into one token sequence per text for the batcher, which
//! batches them by tokens; pooled vectors out, normalised when asked. Its public face on the tensor protocols is
//! a `BYTES` input of texts and an `FP32` embedding output. Tokenizing is CPU work: [`Task::prepare_is_heavy`].

use inferd_batcher::InferRequest;
use inferd_core::text::{TextInfo, ATTENTION_MASK, EMBEDDING_OUTPUT, INPUT_IDS};
use inferd_core::{DataType, ModelMetadata, Tensor, TensorSpec};
use tokenizers::{Tokenizer, TruncationParams};

use super::{Answer, Input, Prepared, Request, Task, TaskError, TextInput, Texts};

/// The name of a text model's one input on the tensor protocols (KServe v2, `/predict`).
pub const TEXT_INPUT: &str = "text";

/// A loaded text model's tokenizer and public face.
pub struct EmbedTask {
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

impl std::fmt::Debug for EmbedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedTask").field("info", &self.info).finish_non_exhaustive()
    }
}

impl EmbedTask {
    /// Loads the tokenizer a text engine's metadata names. Blocking.
    pub fn load(engine: &ModelMetadata) -> anyhow::Result<EmbedTask> {
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
        Ok(EmbedTask {
            tokenizer,
            truncating,
            vocab_size,
            inputs: engine.inputs.iter().map(|s| s.name.clone()).collect(),
            public,
            info,
        })
    }

    /// The texts of a request on a tensor protocol: its one `BYTES` input, each element UTF-8.
    fn texts_of(tensors: &[Tensor]) -> Result<TextInput, TaskError> {
        let strings = match tensors {
            [t] => t.byte_strings().unwrap_or_default(),
            _ => return Err(TaskError::Invalid(format!("a text model takes one input, `{TEXT_INPUT}`"))),
        };
        let texts = strings
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                String::from_utf8(bytes.clone())
                    .map_err(|_| TaskError::Invalid(format!("input `{TEXT_INPUT}`: element {i} is not UTF-8 text")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TextInput::new(Texts::Strings(texts)))
    }

    /// One token sequence per text, and the tokens they hold, within `max_rows` texts. Blocking.
    fn tokenize(&self, input: &TextInput, max_rows: usize) -> Result<(Vec<Vec<Tensor>>, usize), TaskError> {
        let count = input.texts.len();
        if count == 0 {
            return Err(TaskError::Invalid("no texts to embed: the input is empty".into()));
        }
        if count > max_rows {
            return Err(TaskError::OverLimit(format!(
                "the request has {count} texts; this server takes at most {max_rows} per request (--max-rows)"
            )));
        }
        let max = self.info.max_seq_len;
        let mut sequences = Vec::with_capacity(count);
        let mut tokens = 0usize;
        match &input.texts {
            Texts::Strings(texts) => {
                let tokenizer = if input.truncate { &self.truncating } else { &self.tokenizer };
                for (i, text) in texts.iter().enumerate() {
                    if text.is_empty() {
                        return Err(TaskError::Invalid(format!("text {i} is empty: there is nothing to embed")));
                    }
                    let encoding = tokenizer
                        .encode_fast(text.as_str(), true)
                        .map_err(|e| TaskError::Invalid(format!("text {i} cannot be tokenized: {e}")))?;
                    let ids = encoding.get_ids();
                    if ids.len() > max {
                        return Err(TaskError::Invalid(format!(
                            "text {i} is {} tokens long; this model takes at most {max} (send \"truncate\": true to \
                             cut it)",
                            ids.len()
                        )));
                    }
                    tokens += ids.len();
                    sequences.push(self.sequence(ids, encoding.get_type_ids())?);
                }
            }
            Texts::Ids(lists) => {
                for (i, ids) in lists.iter().enumerate() {
                    if ids.is_empty() {
                        return Err(TaskError::Invalid(format!("token list {i} is empty: there is nothing to embed")));
                    }
                    if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
                        return Err(TaskError::Invalid(format!(
                            "token list {i}: id {bad} is outside the model's vocabulary of {} tokens",
                            self.vocab_size
                        )));
                    }
                    let ids = if ids.len() > max && input.truncate { &ids[..max] } else { &ids[..] };
                    if ids.len() > max {
                        return Err(TaskError::Invalid(format!(
                            "token list {i} is {} tokens long; this model takes at most {max}",
                            ids.len()
                        )));
                    }
                    tokens += ids.len();
                    sequences.push(self.sequence(ids, &vec![0; ids.len()])?);
                }
            }
        }
        Ok((sequences, tokens))
    }

    /// One sequence's token inputs `[1, len]`, in the engine's order.
    fn sequence(&self, ids: &[u32], types: &[u32]) -> Result<Vec<Tensor>, TaskError> {
        let len = ids.len();
        self.inputs
            .iter()
            .map(|name| {
                let values: Vec<i64> = match name.as_str() {
                    INPUT_IDS => ids.iter().map(|&i| i64::from(i)).collect(),
                    ATTENTION_MASK => vec![1; len],
                    _ => types.iter().map(|&i| i64::from(i)).collect(),
                };
                Tensor::from_slice(vec![1, len], &values).map_err(|e| TaskError::Internal(e.to_string()))
            })
            .collect()
    }
}

impl Task for EmbedTask {
    fn metadata(&self) -> &ModelMetadata {
        &self.public
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError> {
        let input = match request.input {
            Input::Text(input) => input,
            Input::Tensors(tensors) => Self::texts_of(&tensors)?,
        };
        if let Some(asked) = input.dimensions.filter(|&asked| asked != self.info.dimensions) {
            return Err(TaskError::Invalid(format!(
                "dimensions: this model gives {}-dimensional embeddings and cannot shorten them to {asked}",
                self.info.dimensions
            )));
        }
        let (sequences, tokens) = self.tokenize(&input, max_rows)?;
        let normalize = input.normalize.unwrap_or(self.info.normalize);
        Ok(Prepared {
            request: InferRequest::sequences(sequences).with_deadline(request.deadline),
            finish: Box::new(move |mut tensors| {
                if normalize {
                    tensors = tensors.iter().map(normalize_rows).collect::<Result<_, _>>()?;
                }
                Ok(Answer { tensors, tokens })
            }),
        })
    }
}

/// Scales each row of an `FP32 [rows, dim]` tensor to unit length.
fn normalize_rows(t: &Tensor) -> Result<Tensor, TaskError> {
    let dim = t.shape().last().copied().unwrap_or(1).max(1);
    let mut values = t.to_vec::<f32>().map_err(|e| TaskError::Internal(e.to_string()))?;
    values.chunks_exact_mut(dim).for_each(inferd_core::text::normalize);
    Tensor::from_slice(t.shape().to_vec(), &values).map_err(|e| TaskError::Internal(e.to_string()))
}

#[cfg(test)]
#[path = "embed_tests.rs"]
mod tests;
