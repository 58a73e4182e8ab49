//! The tensors task: the request's tensors go to the batcher as they are, and the engine's outputs come back as
//! the answer.

use inferd_batcher::InferRequest;
use inferd_core::ModelMetadata;

use super::{Answer, Input, Prepared, Request, Task, TaskError};

/// A model that takes and gives tensors.
#[derive(Debug)]
pub struct TensorTask {
    metadata: ModelMetadata,
}

impl TensorTask {
    pub fn new(metadata: ModelMetadata) -> Self {
        TensorTask { metadata }
    }
}

impl Task for TensorTask {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn prepare(&self, request: Request, _max_rows: usize) -> Result<Prepared, TaskError> {
        // Rows are bounded by the decoder, which counts them as the body streams by.
        match request.input {
            Input::Tensors(tensors) => Ok(Prepared::new(
                InferRequest::new(tensors).with_deadline(request.deadline),
                Box::new(|tensors| Ok(Answer::tensors(tensors, 0))),
            )),
            Input::Text(_) => {
                Err(TaskError::Invalid("it does not embed text: it takes tensors (its task is not `embed`)".into()))
            }
            Input::Score(_) => Err(TaskError::Invalid(
                "it does not score text: it takes tensors (its task is not `rerank` or `classify`)".into(),
            )),
            Input::Images(_) => Err(TaskError::Invalid(
                "it takes tensors, not pictures: it has no [image] table in its model.toml".into(),
            )),
        }
    }
}
