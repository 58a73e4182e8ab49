//! What the observer is told, the batcher's one source of counts: each request once, each engine run once with
//! its rows and tokens, whoever the caller and however the request is split.

use std::path::PathBuf;

use inferd_core::text::{Contract, TextInfo};
use inferd_core::Pooling;

use super::*;
use crate::NoObserver;

/// A text model of two token inputs, `input_ids` and `attention_mask`: its one output is each row's real tokens
/// (the ones in its mask), so padding added by batching shows if it is not zeros.
struct TokenCounter {
    metadata: ModelMetadata,
}

impl Engine for TokenCounter {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn run(&mut self, inputs: &[Tensor]) -> inferd_core::Result<Vec<Tensor>> {
        Ok(vec![self.run_text(Contract::Pooled, inputs)?])
    }

    /// Pooled: each row's count of real tokens. Per-token states: each position's mask, 1 for a real token and 0 for
    /// padding.
    fn run_text(&mut self, contract: Contract, inputs: &[Tensor]) -> inferd_core::Result<Tensor> {
        let mask = &inputs[1];
        let (rows, seq) = (mask.shape()[0], mask.shape()[1]);
        let values = mask.to_vec::<i64>()?;
        match contract {
            Contract::TokenStates => {
                let states: Vec<f32> = values.into_iter().map(|m| m as f32).collect();
                Tensor::from_slice(vec![rows, seq, 1], &states)
            }
            _ => {
                let real: Vec<f32> = values.chunks(seq).map(|row| row.iter().sum::<i64>() as f32).collect();
                Tensor::from_slice(vec![rows, 1], &real)
            }
        }
    }
}

fn text_batcher(observer: Arc<Observed>) -> Batcher {
    text_batcher_with(observer, true, &BatchingConfig::default())
}

/// A [`TokenCounter`]'s batcher; `hidden_states`: whether its metadata says it gives per-token states.
fn text_batcher_with(observer: Arc<Observed>, hidden_states: bool, config: &BatchingConfig) -> Batcher {
    let spec = |name: &str, datatype, shape: &[i64]| TensorSpec {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        optional: false,
    };
    let metadata = ModelMetadata {
        inputs: vec![spec("input_ids", DataType::Int64, &[-1, -1]), spec("attention_mask", DataType::Int64, &[-1, -1])],
        outputs: vec![spec("embedding", DataType::Fp32, &[-1, 1])],
        device: "cpu".into(),
        precision: Precision::Fp32,
        platform: "test",
        text: Some(TextInfo {
            tokenizer: PathBuf::new(),
            max_seq_len: 16,
            pooling: Pooling::Mean,
            normalize: false,
            dimensions: 1,
            vocab_size: None,
            labels: Vec::new(),
            multi_label: false,
            prompts: Default::default(),
            default_prompt: None,
            similarity: None,
            contracts: match hidden_states {
                true => vec![Contract::Pooled, Contract::TokenStates],
                false => vec![Contract::Pooled],
            },
        }),
    };
    Batcher::start("tokens", config, vec![Box::new(TokenCounter { metadata })], observer).expect("threads start")
}

/// A request for the sequences' pooled vectors, joined.
fn pooled(sequences: Vec<Vec<Tensor>>) -> InferRequest {
    InferRequest::sequences(sequences, Contract::Pooled)
}

/// A request for the sequences' per-token states, one output each.
fn per_token(sequences: Vec<Vec<Tensor>>) -> InferRequest {
    InferRequest::sequences(sequences, Contract::TokenStates).with_pieces_apart()
}

/// One sequence of one row: its token ids and a mask of ones, of `ids`' length.
fn sequence(ids: &[i64]) -> Vec<Tensor> {
    let shape = vec![1, ids.len()];
    let ones = vec![1i64; ids.len()];
    vec![Tensor::from_slice(shape.clone(), ids).expect("valid"), Tensor::from_slice(shape, &ones).expect("valid")]
}

#[tokio::test]
async fn a_split_request_is_queued_once_and_each_run_is_counted() {
    let f = fixture(batched(4), true);
    let values: Vec<f32> = (0..10).map(|v| v as f32).collect();
    f.batcher.infer(rows(&values, 1)).await.expect("answered");
    assert_eq!(*f.observed.queued.borrow(), 1, "one request, however many pieces");
    assert_eq!(*f.observed.started.lock().expect("observed"), 3, "each piece started");
    assert_eq!(f.observed.batches(), vec![(4, true), (4, true), (2, true)]);
    assert_eq!(*f.observed.tokens.lock().expect("observed"), vec![], "not a text model");
}

#[tokio::test]
async fn a_text_request_is_queued_once_and_its_tokens_counted_per_run() {
    let observed = Arc::new(Observed::default());
    let batcher = text_batcher(observed.clone());
    // Three tokens and four: close enough to share a batch, the first padded by one.
    let answer = batcher.infer(pooled(vec![sequence(&[5, 6, 7]), sequence(&[5, 6, 7, 8])])).await;
    let answer = answer.expect("answered");
    assert_eq!(answer.outputs[0].shape(), &[2, 1]);
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![3.0, 4.0], "padding is masked out");
    assert_eq!(*observed.queued.borrow(), 1);
    assert_eq!(*observed.started.lock().expect("observed"), 2, "each sequence started");
    assert_eq!(observed.batches(), vec![(2, true)]);
    assert_eq!(*observed.tokens.lock().expect("observed"), vec![(7, 8)]);
}

#[tokio::test]
async fn hidden_states_come_back_one_per_sequence_and_never_share_a_run_with_outputs() {
    let observed = Arc::new(Observed::default());
    // A long queue delay gathers all three sequences: only their keys keep them apart.
    let gathering = BatchingConfig { max_queue_delay_us: 200_000, ..batched(8) };
    let batcher = text_batcher_with(observed.clone(), true, &gathering);
    let hidden = per_token(vec![sequence(&[5, 6, 7]), sequence(&[5, 6, 7, 8])]);
    let plain = pooled(vec![sequence(&[5, 6, 7])]);
    let (hidden, plain) = tokio::join!(batcher.infer(hidden), batcher.infer(plain));
    let hidden = hidden.expect("answered");
    // Padded to the batch's longest, the padding masked: the task cuts each back to its own length.
    let states: Vec<Vec<f32>> = hidden.outputs.iter().map(|t| t.to_vec::<f32>().expect("fp32")).collect();
    assert_eq!(hidden.outputs.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>(), vec![vec![1, 4, 1]; 2]);
    assert_eq!(states, vec![vec![1.0, 1.0, 1.0, 0.0], vec![1.0; 4]]);
    assert_eq!(plain.expect("answered").outputs[0].to_vec::<f32>().expect("fp32"), vec![3.0]);
    let mut runs = observed.batches();
    runs.sort_unstable();
    assert_eq!(runs, vec![(1, true), (2, true)], "per-token and pooled sequences run apart");

    let without = text_batcher_with(Arc::new(Observed::default()), false, &BatchingConfig::default());
    let err = without.infer(per_token(vec![sequence(&[5])])).await;
    assert!(matches!(&err, Err(BatchError::InvalidInput(m)) if m.contains("per-token")), "{err:?}");
}

#[tokio::test]
async fn sequences_the_batcher_cannot_pad_are_refused_before_they_queue() {
    let observed = Arc::new(Observed::default());
    let batcher = text_batcher(observed.clone());
    let flat = vec![Tensor::from_slice(vec![3], &[5i64, 6, 7]).expect("valid"); 2];
    let mut uneven = sequence(&[5, 6, 7]);
    uneven[1] = Tensor::from_slice(vec![1, 4], &[1i64; 4]).expect("valid");
    let empty = vec![Tensor::from_slice::<i64>(vec![1, 0], &[]).expect("valid"); 2];
    for (what, inputs) in [("rank 1", flat), ("unequal lengths", uneven), ("no tokens", empty)] {
        let err = batcher.infer(pooled(vec![inputs])).await.expect_err(what);
        assert!(matches!(&err, BatchError::InvalidInput(m) if m.contains("[rows, seq]")), "{what}: {err}");
    }
    let err = batcher.infer(pooled(vec![])).await.expect_err("no sequences");
    assert!(matches!(&err, BatchError::InvalidInput(m) if m.contains("no sequences")), "{err}");
    assert_eq!(*observed.queued.borrow(), 0);
    assert_eq!(observed.batches(), vec![]);
}

#[tokio::test]
async fn a_batcher_that_counts_nothing_serves_all_the_same() {
    let f = fixture(batched(8), true);
    let metadata = f.batcher.metadata().clone();
    let engine = Doubler { metadata, seen: f.seen.clone(), gate: f.gate.clone() };
    let batcher =
        Batcher::start("quiet", &batched(8), vec![Box::new(engine)], Arc::new(NoObserver)).expect("threads start");
    let answer = batcher.infer(rows(&[1.0, 2.0], 1)).await.expect("answered");
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0, 4.0]);
}
