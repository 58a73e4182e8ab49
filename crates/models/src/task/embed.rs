//! The embed task: texts (or token ids) in, tokenized into one token sequence per text for the batcher, which
//! batches them by tokens; pooled vectors out, cut to the dimensions asked for (Matryoshka) and normalised as asked,
//! or each token's state. Its public face on the tensor protocols is a `BYTES` input of texts and an `FP32`
//! embedding output. Tokenizing is CPU work: [`Task::prepare_is_heavy`].

use std::sync::Arc;

use inferd_batcher::InferRequest;
use inferd_core::text::{Contract, TextInfo};
use inferd_core::{DataType, ModelConfig, ModelMetadata, Tensor, TensorSpec};

use super::text::{single_texts, text_face, TextFront};
use super::{Answer, Options, Prepared, Registration, Request, Service, Task, TaskError};

pub(super) const REGISTRATION: Registration = Registration {
    service: Service::Embed,
    // Each token's state where the engine gives it: what `/embed_all` serves.
    contracts: &[Contract::Pooled, Contract::TokenStates],
    load: |_: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| Ok(Arc::new(EmbedTask::load(engine)?)),
};

/// The name of a text model's texts on the tensor protocols (KServe v2, `/predict`).
pub const TEXT_INPUT: &str = "text";
/// The name of an embedding model's output on the tensor protocols.
pub const EMBEDDING_OUTPUT: &str = "embedding";

/// Unit-length embeddings (`true`) or as the model leaves them; without it, as the model's folder says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalize(pub bool);

/// The embedding's first dimensions only (a Matryoshka model's shorter embedding), renormalised when the answer is
/// normalised. At least 1, at most the model's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dimensions(pub usize);

/// Each token's vector, unpooled and as the encoder left it, rather than one per text: the answer is one FP32
/// `[tokens, dim]` tensor per text, special tokens included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerToken;

/// A loaded embedding model's tokenizer and public face.
pub struct EmbedTask {
    front: TextFront,
    /// What the tensor protocols show: texts in, embeddings out.
    public: ModelMetadata,
}

impl std::fmt::Debug for EmbedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedTask").field("info", self.front.info()).finish_non_exhaustive()
    }
}

impl EmbedTask {
    /// Loads the tokenizer a text engine's metadata names. Blocking.
    pub fn load(engine: &ModelMetadata) -> anyhow::Result<EmbedTask> {
        let front = TextFront::load(engine)?;
        let embedding = TensorSpec {
            name: EMBEDDING_OUTPUT.into(),
            datatype: DataType::Fp32,
            shape: vec![-1, front.info().dimensions as i64],
            optional: false,
        };
        let public = text_face(engine, vec![embedding]);
        Ok(EmbedTask { front, public })
    }

    /// The text model's settings, as its engine reports them.
    pub(super) fn info(&self) -> &TextInfo {
        self.front.info()
    }

    /// A request for each token's vector: every sequence's final states, cut back from its batch's padded length
    /// to its own.
    fn per_token(
        &self,
        sequences: Vec<Vec<Tensor>>,
        tokens: usize,
        deadline: Option<std::time::Instant>,
    ) -> Result<Prepared, TaskError> {
        if !self.front.info().serves(Contract::TokenStates) {
            let why = match self.public.platform {
                "candle" => "a CLIP or SigLIP text tower gives each text's projected vector only",
                _ => "an ONNX graph needs a [batch, sequence, dim] output",
            };
            return Err(TaskError::Invalid(format!(
                "it gives no vector per token: its engine has no per-token states ({why})"
            )));
        }
        let lengths: Vec<usize> =
            sequences.iter().map(|s| s.first().and_then(|t| t.shape().get(1)).copied().unwrap_or(0)).collect();
        let values = tokens.saturating_mul(self.front.info().dimensions);
        if values > PER_TOKEN_MAX_VALUES {
            return Err(TaskError::OverLimit(format!(
                "a vector per token for these texts is {values} values ({tokens} tokens of {}); a request may ask for \
                 at most {PER_TOKEN_MAX_VALUES}: send fewer or shorter texts",
                self.front.info().dimensions
            )));
        }
        Ok(Prepared::new(
            InferRequest::sequences(sequences, Contract::TokenStates).with_deadline(deadline).with_pieces_apart(),
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

    fn service(&self) -> Service {
        REGISTRATION.service
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError> {
        let input = single_texts(request.input, REGISTRATION.service)?;
        let options = &request.options;
        let info = self.front.info();
        let full = info.dimensions;
        let dimensions = dimensions(options, full)?;
        let (sequences, tokens) = self.front.sequences(&input, max_rows, "embed")?;
        if options.get::<PerToken>().is_some() {
            return self.per_token(sequences, tokens, request.deadline);
        }
        let normalize = options.get::<Normalize>().map_or(info.normalize, |n| n.0);
        Ok(Prepared::new(
            InferRequest::sequences(sequences, Contract::Pooled).with_deadline(request.deadline),
            Box::new(move |tensors| Ok(Answer::tensors(shape_vectors(tensors, dimensions, full, normalize)?, tokens))),
        ))
    }

    fn tokenizer(&self) -> Option<&TextFront> {
        Some(&self.front)
    }
}

/// The dimensions a request asks for ([`Dimensions`]) of a model's `full`-dimensional embeddings.
pub(super) fn dimensions(options: &Options, full: usize) -> Result<usize, TaskError> {
    match options.get::<Dimensions>() {
        None => Ok(full),
        Some(&Dimensions(0)) => Err(TaskError::Invalid("dimensions: must be at least 1".into())),
        Some(&Dimensions(asked)) if asked > full => Err(TaskError::Invalid(format!(
            "dimensions: this model gives {full}-dimensional embeddings and cannot lengthen them to {asked}"
        ))),
        Some(&Dimensions(asked)) => Ok(asked),
    }
}

/// Pooled vectors (`FP32 [rows, full]` tensors) cut to their first `dimensions` and normalised, as asked.
pub(super) fn shape_vectors(
    mut tensors: Vec<Tensor>,
    dimensions: usize,
    full: usize,
    normalize: bool,
) -> Result<Vec<Tensor>, TaskError> {
    if dimensions < full {
        tensors = tensors.iter().map(|t| first_columns(t, dimensions)).collect::<Result<_, _>>()?;
    }
    if normalize {
        tensors = tensors.iter().map(normalize_rows).collect::<Result<_, _>>()?;
    }
    Ok(tensors)
}

/// The first `n` columns of each row of an `FP32 [rows, dim]` tensor.
fn first_columns(t: &Tensor, n: usize) -> Result<Tensor, TaskError> {
    let internal = |e: inferd_core::Error| TaskError::Internal(e.to_string());
    let &[rows, dim] = t.shape() else {
        return Err(TaskError::Internal(format!("embeddings came back as {:?}", t.shape())));
    };
    let values = t.to_vec::<f32>().map_err(internal)?;
    let kept: Vec<f32> = values.chunks_exact(dim.max(1)).flat_map(|row| &row[..n.min(dim)]).copied().collect();
    Tensor::from_slice(vec![rows, n.min(dim)], &kept).map_err(internal)
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
