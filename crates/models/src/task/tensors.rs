//! The tensors task: the request's tensors go to the batcher as they are, and the engine's outputs come back as
//! the answer.

use std::sync::Arc;

use inferd_batcher::InferRequest;
use inferd_core::{ModelConfig, ModelMetadata};

use super::{every_input, refused, Answer, Input, Prepared, Registration, Request, Service, Task, TaskError};

pub(super) const REGISTRATION: Registration = Registration {
    service: Service::Tensors,
    contracts: &[],
    load: |_: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| {
        Ok(Arc::new(TensorTask::new(engine.clone())))
    },
};

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

    fn service(&self) -> Service {
        REGISTRATION.service
    }

    fn prepare(&self, request: Request, _max_rows: usize) -> Result<Prepared, TaskError> {
        // Rows are bounded by the decoder, which counts them as the body streams by.
        match request.input {
            Input::Tensors(tensors) => Ok(Prepared::new(
                InferRequest::new(every_input(tensors, &self.metadata.inputs)?).with_deadline(request.deadline),
                Box::new(|tensors| Ok(Answer::tensors(tensors, 0))),
            )),
            other => Err(refused(REGISTRATION.service, &other)),
        }
    }
}
