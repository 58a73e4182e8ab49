//! The embed task: texts (or token ids) in, tokenized into one token sequence per text for the batcher, which
//! batches them by tokens; pooled vectors out, normalised when asked. Its public face on the tensor protocols is
//! a `BYTES` input of texts and an `FP32` embedding output. Tokenizing is CPU work: [`Task::prepare_is_heavy`].

use inferd_batcher::InferRequest;
use inferd_core::text::EMBEDDING_OUTPUT;
use inferd_core::{DataType, ModelMetadata, Tensor, TensorSpec};

use super::text::{strings_of, TextFront};
use super::{Answer, Input, Prepared, Request, Task, TaskError, TextInput, Texts, Token};

/// The name of a text model's one input on the tensor protocols (KServe v2, `/predict`).
pub const TEXT_INPUT: &str = "text";

/// A loaded embedding model's tokenizer and public face.
pub struct EmbedTask {
    front: TextFront,
    /// What the tensor protocols show: texts in, embeddings out.
    public: ModelMetadata,
}

impl std::fmt::Debug for EmbedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedTask").field("info", &self.front.info).finish_non_exhaustive()
    }
}

impl EmbedTask {
    /// Loads the tokenizer a text engine's metadata names. Blocking.
    pub fn load(engine: &ModelMetadata) -> anyhow::Result<EmbedTask> {
        let front = TextFront::load(engine)?;
        let public = ModelMetadata {
            inputs: vec![TensorSpec { name: TEXT_INPUT.into(), datatype: DataType::Bytes, shape: vec![-1] }],
            outputs: vec![TensorSpec {
                name: EMBEDDING_OUTPUT.into(),
                datatype: DataType::Fp32,
                shape: vec![-1, front.info.dimensions as i64],
            }],
            ..engine.clone()
        };
        Ok(EmbedTask { front, public })
    }

    /// The texts of a request on a tensor protocol: its one `BYTES` input, each element UTF-8.
    fn texts_of(tensors: &[Tensor]) -> Result<TextInput, TaskError> {
        match tensors {
            [t] => Ok(TextInput::new(Texts::Strings(strings_of(t, TEXT_INPUT)?))),
            _ => Err(TaskError::Invalid(format!("a text model takes one input, `{TEXT_INPUT}`"))),
        }
    }
}

impl EmbedTask {
    /// A request for each token's vector: every sequence's final states, cut back from its batch's padded length
    /// to its own.
    fn per_token(
        &self,
        sequences: Vec<Vec<Tensor>>,
        tokens: usize,
        deadline: Option<std::time::Instant>,
    ) -> Result<Prepared, TaskError> {
        if !self.front.info.hidden_states {
            return Err(TaskError::Invalid(
                "it gives no vector per token: its engine has no per-token states (an ONNX graph needs a \
                 [batch, sequence, dim] output)"
                    .into(),
            ));
        }
        let lengths: Vec<usize> =
            sequences.iter().map(|s| s.first().and_then(|t| t.shape().get(1)).copied().unwrap_or(0)).collect();
        let values = tokens.saturating_mul(self.front.info.dimensions);
        if values > PER_TOKEN_MAX_VALUES {
            return Err(TaskError::OverLimit(format!(
                "a vector per token for these texts is {values} values ({tokens} tokens of {}); a request may ask for \
                 at most {PER_TOKEN_MAX_VALUES}: send fewer or shorter texts",
                self.front.info.dimensions
            )));
        }
        Ok(Prepared::new(
            InferRequest::sequences(sequences).with_deadline(deadline).with_hidden_states(),
            Box::new(move |states| {
                if states.len() != lengths.len() {
                    return Err(TaskError::Internal(format!(
                        "{} per-token answers for {} texts",
                        states.len(),
                        lengths.len()
                    )));
                }
                let tensors = states.iter().zip(&lengths).map(|(t, &len)| first_positions(t, len));
                Ok(Answer::tensors(tensors.collect::<Result<_, _>>()?, tokens))
            }),
        ))
    }
}

/// The most values a per-token answer may hold: 16 Mi (64 MiB as FP32, some 200 MB as JSON). Each text's states
/// are up to `max_seq_len × dim` values, so a request of many long texts could otherwise ask for gigabytes.
pub const PER_TOKEN_MAX_VALUES: usize = 1 << 24;

/// The first `len` positions of one sequence's states `FP32 [1, seq, dim]`, as `[len, dim]`.
fn first_positions(states: &Tensor, len: usize) -> Result<Tensor, TaskError> {
    let internal = |e: inferd_core::Error| TaskError::Internal(e.to_string());
    let &[1, seq, dim] = states.shape() else {
        return Err(TaskError::Internal(format!("per-token states came back as {:?}", states.shape())));
    };
    if len > seq {
        return Err(TaskError::Internal(format!("{len} tokens, but states for only {seq}")));
    }
    let values = states.to_vec::<f32>().map_err(internal)?;
    Tensor::from_slice(vec![len, dim], &values[..len * dim]).map_err(internal)
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
            Input::Score(_) => {
                return Err(TaskError::Invalid(
                    "it embeds text (its task is `embed`): it does not rerank or classify".into(),
                ))
            }
            Input::Images(_) => {
                return Err(TaskError::Invalid("it embeds text (its task is `embed`): it takes no pictures".into()))
            }
        };
        if matches!(input.texts, Texts::Pairs(_)) {
            return Err(TaskError::Invalid("it embeds single texts: it takes no pairs of texts".into()));
        }
        let info = &self.front.info;
        if let Some(asked) = input.dimensions.filter(|&asked| asked != info.dimensions) {
            return Err(TaskError::Invalid(format!(
                "dimensions: this model gives {}-dimensional embeddings and cannot shorten them to {asked}",
                info.dimensions
            )));
        }
        let (sequences, tokens) = self.front.sequences(&input, max_rows, "embed")?;
        if input.per_token {
            return self.per_token(sequences, tokens, request.deadline);
        }
        let normalize = input.normalize.unwrap_or(info.normalize);
        Ok(Prepared::new(
            InferRequest::sequences(sequences).with_deadline(request.deadline),
            Box::new(move |mut tensors| {
                if normalize {
                    tensors = tensors.iter().map(normalize_rows).collect::<Result<_, _>>()?;
                }
                Ok(Answer::tensors(tensors, tokens))
            }),
        ))
    }

    fn tokenize(&self, texts: &[String], special: bool) -> Result<Vec<Vec<Token>>, TaskError> {
        self.front.tokens(texts, special)
    }

    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TaskError> {
        self.front.decode(ids, skip_special)
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
