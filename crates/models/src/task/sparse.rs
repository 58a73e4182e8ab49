//! The sparse embedding task (SPLADE): texts in, tokenized and batched by tokens as for dense embeddings; out, each
//! text's weight for every entry of the vocabulary (the masked-LM head's logits through `log(1 + relu(x))`, the
//! largest over the text's tokens), most of them zero. Its public face on the tensor protocols is a `BYTES` input of
//! texts and the dense `FP32 [texts, vocab]` weights; the text protocols send the non-zero ones.

use std::sync::Arc;

use inferd_batcher::InferRequest;
use inferd_core::text::Contract;
use inferd_core::{DataType, ModelConfig, ModelMetadata, TensorSpec};

use super::text::{single_texts, text_face, TextFront};
use super::{Answer, Prepared, Registration, Request, Service, Task, TaskError};

pub(super) const REGISTRATION: Registration = Registration {
    service: Service::EmbedSparse,
    contracts: &[Contract::SparseWeights],
    load: |_: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| Ok(Arc::new(SparseTask::load(engine)?)),
};

/// A sparse embedding model's output on the tensor protocols: a weight per vocabulary entry, `FP32 [texts, vocab]`.
pub const SPARSE_OUTPUT: &str = "sparse_embedding";

/// A loaded sparse embedding model.
pub struct SparseTask {
    front: TextFront,
    public: ModelMetadata,
}

impl std::fmt::Debug for SparseTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseTask").field("info", self.front.info()).finish_non_exhaustive()
    }
}

impl SparseTask {
    /// Loads the tokenizer a sparse model's engine metadata names. Blocking.
    pub fn load(engine: &ModelMetadata) -> anyhow::Result<SparseTask> {
        let front = TextFront::load(engine)?;
        let vocab = front.info().width(Contract::SparseWeights).map_or(-1, |v| v as i64);
        let weights = TensorSpec {
            name: SPARSE_OUTPUT.into(),
            datatype: DataType::Fp32,
            shape: vec![-1, vocab],
            optional: false,
        };
        let public = text_face(engine, vec![weights]);
        Ok(SparseTask { front, public })
    }
}

impl Task for SparseTask {
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
        let (sequences, tokens) = self.front.sequences(&input, max_rows, "embed")?;
        Ok(Prepared::new(
            InferRequest::sequences(sequences, Contract::SparseWeights).with_deadline(request.deadline),
            Box::new(move |tensors| Ok(Answer::tensors(tensors, tokens))),
        ))
    }

    fn tokenizer(&self) -> Option<&TextFront> {
        Some(&self.front)
    }
}
