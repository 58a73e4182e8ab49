//! The scoring tasks, one type for both: `rerank` (a cross-encoder: a query paired with each passage, one
//! relevance score each) and `classify` (a sequence classifier: a text, or a pair of texts, scored per label).
//! Texts are tokenized as for embeddings (pairs with the tokenizer's segment ids, the passage truncated first) and
//! batched by tokens; the engine's logits become probabilities here: the sigmoid of a single logit or of each
//! independent label, the softmax over exclusive labels, or the raw logits when asked. On the tensor protocols a
//! reranker takes `query` and `text` (`BYTES`) and gives `score` (`FP32 [texts]`); a classifier takes `text` and
//! gives `scores` (`FP32 [texts, labels]`).

use std::sync::Arc;

use inferd_batcher::InferRequest;
use inferd_core::text::Contract;
use inferd_core::{DataType, ModelConfig, ModelMetadata, Tensor, TensorSpec};

use super::text::{strings_of, TextFront};
use super::TEXT_INPUT;
use super::{
    every_input, refused, Answer, Input, Prepared, Registration, Request, Service, Task, TaskError, TextInput, Texts,
};

pub(super) const RERANK: Registration = Registration {
    service: Service::Rerank,
    contracts: &[Contract::SequenceScores],
    load: |_: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| {
        Ok(Arc::new(ScoreTask::load(engine, true)?))
    },
};

pub(super) const CLASSIFY: Registration = Registration {
    service: Service::Classify,
    contracts: &[Contract::SequenceScores],
    load: |_: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| {
        Ok(Arc::new(ScoreTask::load(engine, false)?))
    },
};

/// The head's logits as they are, rather than as probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawScores(pub bool);

/// A reranker's query on the tensor protocols: `BYTES [1]`.
pub const QUERY_INPUT: &str = "query";
/// A reranker's answer on the tensor protocols: one score per text, `FP32 [texts]`.
pub const SCORE_OUTPUT: &str = "score";
/// A classifier's answer on the tensor protocols: a score per label for each text, `FP32 [texts, labels]`.
pub const SCORES_OUTPUT: &str = "scores";

/// A loaded reranker or classifier.
pub struct ScoreTask {
    front: TextFront,
    rerank: bool,
    /// What the tensor protocols show.
    public: ModelMetadata,
}

impl std::fmt::Debug for ScoreTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScoreTask")
            .field("rerank", &self.rerank)
            .field("info", self.front.info())
            .finish_non_exhaustive()
    }
}

/// How logits become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    Raw,
    Sigmoid,
    Softmax,
}

impl ScoreTask {
    /// Loads the tokenizer a scoring engine's metadata names; `rerank` picks the task. Blocking.
    pub fn load(engine: &ModelMetadata, rerank: bool) -> anyhow::Result<ScoreTask> {
        let front = TextFront::load(engine)?;
        let labels = front.info().labels.len() as i64;
        if rerank && labels != 1 {
            anyhow::bail!(
                "task = \"rerank\" needs a head with one score; this model's gives {labels} (use task = \"classify\")"
            );
        }
        let bytes = |name: &str, shape: Vec<i64>| TensorSpec {
            name: name.into(),
            datatype: DataType::Bytes,
            shape,
            optional: false,
        };
        let (inputs, output) = match rerank {
            true => (
                vec![bytes(QUERY_INPUT, vec![1]), bytes(TEXT_INPUT, vec![-1])],
                TensorSpec { name: SCORE_OUTPUT.into(), datatype: DataType::Fp32, shape: vec![-1], optional: false },
            ),
            false => (
                vec![bytes(TEXT_INPUT, vec![-1])],
                TensorSpec {
                    name: SCORES_OUTPUT.into(),
                    datatype: DataType::Fp32,
                    shape: vec![-1, labels],
                    optional: false,
                },
            ),
        };
        let public = ModelMetadata { inputs, outputs: vec![output], ..engine.clone() };
        Ok(ScoreTask { front, rerank, public })
    }

    /// The texts of a request on a tensor protocol: a reranker's query paired with each text, or a classifier's
    /// texts.
    fn texts_of(&self, tensors: &[Tensor]) -> Result<TextInput, TaskError> {
        let texts = match (self.rerank, tensors) {
            (true, [query, texts]) => {
                let query = match strings_of(query, QUERY_INPUT)?.as_slice() {
                    [query] => query.clone(),
                    other => {
                        return Err(TaskError::Invalid(format!(
                            "input `{QUERY_INPUT}`: one query, not {}",
                            other.len()
                        )))
                    }
                };
                Texts::Pairs(strings_of(texts, TEXT_INPUT)?.into_iter().map(|t| (query.clone(), t)).collect())
            }
            (false, [texts]) => Texts::Strings(strings_of(texts, TEXT_INPUT)?),
            (true, _) => {
                return Err(TaskError::Invalid(format!(
                    "a reranker takes two inputs, `{QUERY_INPUT}` and `{TEXT_INPUT}`"
                )))
            }
            (false, _) => return Err(TaskError::Invalid(format!("a classifier takes one input, `{TEXT_INPUT}`"))),
        };
        Ok(TextInput::new(texts))
    }

    fn activation(&self, raw: bool) -> Activation {
        let info = self.front.info();
        match (raw, info.multi_label || info.labels.len() == 1) {
            (true, _) => Activation::Raw,
            (false, true) => Activation::Sigmoid,
            (false, false) => Activation::Softmax,
        }
    }
}

impl ScoreTask {
    fn registration(&self) -> Registration {
        if self.rerank {
            RERANK
        } else {
            CLASSIFY
        }
    }
}

impl Task for ScoreTask {
    fn metadata(&self) -> &ModelMetadata {
        &self.public
    }

    fn service(&self) -> Service {
        self.registration().service
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError> {
        let input = match request.input {
            Input::Texts(input) => input,
            Input::Tensors(tensors) => self.texts_of(&every_input(tensors, &self.public.inputs)?)?,
            other => return Err(refused(self.service(), &other)),
        };
        if self.rerank && !matches!(input.texts, Texts::Pairs(_)) {
            return Err(TaskError::Invalid("it reranks pairs of a query and a text: it takes no single texts".into()));
        }
        let (sequences, tokens) =
            self.front.sequences(&input, max_rows, if self.rerank { "rerank" } else { "classify" })?;
        let activation = self.activation(request.options.get::<RawScores>().is_some_and(|r| r.0));
        let rerank = self.rerank;
        Ok(Prepared::new(
            InferRequest::sequences(sequences, Contract::SequenceScores).with_deadline(request.deadline),
            Box::new(move |tensors| {
                let logits = tensors.first().ok_or_else(|| TaskError::Internal("the engine gave no logits".into()))?;
                Ok(Answer::tensors(vec![scores(logits, activation, rerank)?], tokens))
            }),
        ))
    }

    fn tokenizer(&self) -> Option<&TextFront> {
        Some(&self.front)
    }
}

/// Logits `FP32 [rows, labels]` as scores: `[rows]` for a reranker, `[rows, labels]` for a classifier.
fn scores(logits: &Tensor, activation: Activation, rerank: bool) -> Result<Tensor, TaskError> {
    let internal = |e: inferd_core::Error| TaskError::Internal(e.to_string());
    let (rows, labels) = match *logits.shape() {
        [rows, labels] if labels > 0 => (rows, labels),
        ref other => return Err(TaskError::Internal(format!("the engine's logits came back as {other:?}"))),
    };
    let mut values: Vec<f64> = logits.to_vec::<f32>().map_err(internal)?.into_iter().map(f64::from).collect();
    for row in values.chunks_exact_mut(labels) {
        match activation {
            Activation::Raw => {}
            Activation::Sigmoid => row.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
            Activation::Softmax => {
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                row.iter_mut().for_each(|v| *v = (*v - max).exp());
                let sum: f64 = row.iter().sum();
                row.iter_mut().for_each(|v| *v /= sum);
            }
        }
    }
    let values: Vec<f32> = values.into_iter().map(|v| v as f32).collect();
    let shape = if rerank { vec![rows] } else { vec![rows, labels] };
    Tensor::from_slice(shape, &values).map_err(internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_become_sigmoid_softmax_or_raw_scores() {
        let logits = Tensor::from_slice(vec![2, 2], &[0.0f32, 0.0, 2.0, 0.0]).expect("tensor");
        let soft = scores(&logits, Activation::Softmax, false).expect("softmax").to_vec::<f32>().expect("f32");
        let e2 = 2f64.exp();
        let want = [0.5, 0.5, e2 / (e2 + 1.0), 1.0 / (e2 + 1.0)];
        assert!(soft.iter().zip(want).all(|(g, w)| (f64::from(*g) - w).abs() < 1e-7), "{soft:?}");
        let one = Tensor::from_slice(vec![2, 1], &[0.0f32, 2.0]).expect("tensor");
        let sig = scores(&one, Activation::Sigmoid, true).expect("sigmoid");
        assert_eq!(sig.shape(), [2]);
        let sig = sig.to_vec::<f32>().expect("f32");
        assert!((f64::from(sig[1]) - 1.0 / (1.0 + (-2f64).exp())).abs() < 1e-7 && sig[0] == 0.5, "{sig:?}");
        let raw = scores(&logits, Activation::Raw, false).expect("raw").to_vec::<f32>().expect("f32");
        assert_eq!(raw, [0.0, 0.0, 2.0, 0.0]);
    }
}
