//! Tokenizing against a small WordPiece tokenizer made here, with the BERT-style `[CLS] … [SEP]` around each text.

use std::path::Path;

use inferd_core::text::{Contract, TextInfo, ATTENTION_MASK, INPUT_IDS, TOKEN_TYPE_IDS};
use inferd_core::{Pooling, Precision};

use super::*;
use crate::task::{Input, TextInput, Texts};

const VOCAB: [&str; 8] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "dynamic", "batching", "is", "fast"];

fn tokenizer_file(dir: &Path) -> std::path::PathBuf {
    let vocab: Vec<String> = VOCAB.iter().enumerate().map(|(i, w)| format!("\"{w}\": {i}")).collect();
    let json = format!(
        r###"{{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {{"type": "Whitespace"}},
            "post_processor": {{"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}},
            "decoder": null,
            "model": {{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": {{{}}}}}}}"###,
        vocab.join(", ")
    );
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json).expect("saved");
    path
}

fn task(dir: &Path, max_seq_len: usize) -> EmbedTask {
    task_with(dir, max_seq_len, 2, false)
}

/// An embed task of `dimensions`-long vectors whose engine gives per-token states when `hidden_states`.
fn task_with(dir: &Path, max_seq_len: usize, dimensions: usize, hidden_states: bool) -> EmbedTask {
    EmbedTask::load(&engine(dir, max_seq_len, dimensions, hidden_states)).expect("loads")
}

/// The engine metadata of [`task_with`]'s task.
fn engine(dir: &Path, max_seq_len: usize, dimensions: usize, hidden_states: bool) -> ModelMetadata {
    let spec =
        |name: &str| TensorSpec { name: name.into(), datatype: DataType::Int64, shape: vec![-1, -1], optional: false };
    ModelMetadata {
        inputs: vec![spec(INPUT_IDS), spec(ATTENTION_MASK), spec(TOKEN_TYPE_IDS)],
        outputs: vec![TensorSpec {
            name: "pooled".into(),
            datatype: DataType::Fp32,
            shape: vec![-1, 2],
            optional: false,
        }],
        device: "cpu".into(),
        precision: Precision::Fp32,
        platform: "test",
        text: Some(TextInfo {
            tokenizer: tokenizer_file(dir),
            max_seq_len,
            pooling: Pooling::Mean,
            normalize: true,
            dimensions,
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
    }
}

#[test]
fn a_length_with_no_room_beside_the_special_tokens_is_refused_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    // BertProcessing puts three special tokens around a pair: `[CLS] a [SEP] b [SEP]`.
    for max_seq_len in [1, 2, 3] {
        let refused = EmbedTask::load(&engine(dir.path(), max_seq_len, 2, false)).expect_err("no room");
        assert!(refused.to_string().contains("leaves no room for text beside the 3 special tokens"), "{refused}");
    }
    let shortest = task(dir.path(), 4);
    let sequences = shortest.prepare(texts(&["dynamic batching is fast"]), 8).expect("cut").into_sequences();
    assert_eq!(ids(&sequences.expect("sequences")[0]), [2, 4, 5, 3]);
}

fn texts(texts: &[&str]) -> Request {
    Request::new(Input::Texts(TextInput::new(Texts::Strings(texts.iter().map(|t| (*t).to_owned()).collect()))))
}

fn ids(sequence: &[Tensor]) -> Vec<i64> {
    sequence[0].to_vec::<i64>().expect("ids")
}

#[test]
fn texts_become_one_sequence_each_with_every_token_input_in_the_engines_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task(dir.path(), 16);
    assert_eq!(task.metadata().inputs[0].name, TEXT_INPUT);
    assert_eq!(task.metadata().outputs[0].name, EMBEDDING_OUTPUT);
    assert!(task.prepare_is_heavy());
    let prepared = task.prepare(texts(&["dynamic batching is fast", "fast"]), 8).expect("prepared");
    let sequences = prepared.into_sequences().expect("sequences");
    assert_eq!(sequences.len(), 2);
    assert_eq!(ids(&sequences[0]), [2, 4, 5, 6, 7, 3]);
    assert_eq!(ids(&sequences[1]), [2, 7, 3]);
    let second = &sequences[1];
    assert_eq!(second.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>(), vec![vec![1, 3]; 3]);
    assert_eq!(second[1].to_vec::<i64>().expect("mask"), [1, 1, 1]);
    assert_eq!(second[2].to_vec::<i64>().expect("types"), [0, 0, 0]);
}

#[test]
fn the_tokenizers_that_truncate_each_way_share_one_vocabulary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task(dir.path(), 16);
    let front = task.tokenizer().expect("a text task has a tokenizer");
    // The plain one, and the ones cutting the longer text or the second, from the end or the start.
    assert_eq!(front.model_holders(), 5);
    assert_eq!(front.tokenizer().get_vocab_size(true), VOCAB.len());
}

#[test]
fn long_texts_are_cut_unless_the_request_refuses_truncation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task(dir.path(), 4);
    let sequences = task.prepare(texts(&["dynamic batching is fast"]), 8).expect("cut").into_sequences();
    assert_eq!(ids(&sequences.expect("sequences")[0]), [2, 4, 5, 3]);
    let mut refused = TextInput::new(Texts::Strings(vec!["dynamic batching is fast".into()]));
    refused.truncate = false;
    let error = task.prepare(Request::new(Input::Texts(refused)), 8).expect_err("too long");
    assert_eq!(
        error,
        TaskError::Invalid(
            "text 0 is 6 tokens long; this model takes at most 4 (send \"truncate\": true to cut it)".into()
        )
    );
}

#[test]
fn truncating_on_the_left_keeps_a_texts_end_and_its_special_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task(dir.path(), 4);
    let left = |texts: Texts| {
        let input = TextInput { truncate_left: true, ..TextInput::new(texts) };
        task.prepare(Request::new(Input::Texts(input)), 8).expect("cut").into_sequences().expect("sequences")
    };
    assert_eq!(ids(&left(Texts::Strings(vec!["dynamic batching is fast".into()]))[0]), [2, 6, 7, 3]);
    assert_eq!(ids(&left(Texts::Ids(vec![vec![4, 5, 6, 7, 4]]))[0]), [5, 6, 7, 4]);
}

#[test]
fn bad_texts_and_ids_are_the_clients_fault_and_too_many_are_over_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task(dir.path(), 16);
    let invalid = |request| match task.prepare(request, 2) {
        Err(TaskError::Invalid(message)) => message,
        other => panic!("expected a 400, got {other:?}"),
    };
    assert!(invalid(texts(&[])).contains("the input is empty"));
    assert!(invalid(texts(&["fast", ""])).contains("text 1 is empty"));
    let ids_request = |lists: Vec<Vec<u32>>| Request::new(Input::Texts(TextInput::new(Texts::Ids(lists))));
    assert!(invalid(ids_request(vec![vec![2, 99, 3]])).contains("id 99 is outside the model's vocabulary of 8"));
    assert!(invalid(ids_request(vec![vec![]])).contains("token list 0 is empty"));
    let bytes = Tensor::from_byte_strings(vec![1], vec![vec![0xff, 0xfe]]).expect("bytes");
    assert!(invalid(Request::new(Input::Tensors(vec![Some(bytes)]))).contains("element 0 is not UTF-8"));
    assert!(matches!(task.prepare(texts(&["is", "is", "is"]), 2), Err(TaskError::OverLimit(_))));
    let asking = |n| texts(&["fast"]).with(Dimensions(n));
    assert_eq!(invalid(asking(0)), "dimensions: must be at least 1");
    assert_eq!(
        invalid(asking(3)),
        "dimensions: this model gives 2-dimensional embeddings and cannot lengthen them to 3"
    );
    assert!(task.prepare(asking(2), 2).is_ok(), "its own length is fine");
    assert!(task.prepare(asking(1), 2).is_ok(), "a shorter one is fine");
    // Client-tokenized ids are used as they are.
    let sequences = task.prepare(ids_request(vec![vec![2, 7, 3]]), 2).expect("ids").into_sequences();
    assert_eq!(ids(&sequences.expect("sequences")[0]), [2, 7, 3]);
}

#[test]
fn the_answer_is_normalised_unless_the_request_says_not_and_counts_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task(dir.path(), 16);
    let raw = || vec![Tensor::from_slice(vec![2, 2], &[3.0f32, 4.0, 0.0, 2.0]).expect("tensor")];
    let prepared = task.prepare(texts(&["is fast", "fast"]), 8).expect("prepared");
    let answer = (prepared.finish)(raw()).expect("answer");
    assert_eq!(answer.tokens, 7);
    assert_eq!(answer.tensors[0].to_vec::<f32>().expect("values"), [0.6, 0.8, 0.0, 1.0]);
    let plain = texts(&["fast", "is"]).with(Normalize(false));
    let prepared = task.prepare(plain, 8).expect("prepared");
    assert_eq!((prepared.finish)(raw()).expect("answer").tensors[0].to_vec::<f32>().expect("v"), [3.0, 4.0, 0.0, 2.0]);
}

#[test]
fn fewer_dimensions_keep_the_first_ones_renormalised_when_the_answer_is_normalised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = task_with(dir.path(), 16, 3, false);
    let raw = || vec![Tensor::from_slice(vec![2, 3], &[3.0f32, 4.0, 12.0, 0.0, -2.0, 5.0]).expect("tensor")];
    let answer = |request| (task.prepare(request, 8).expect("prepared").finish)(raw()).expect("answer");
    let normalised = answer(texts(&["is fast", "fast"]).with(Dimensions(2)));
    assert_eq!(normalised.tensors[0].shape(), [2, 2]);
    assert_eq!(normalised.tensors[0].to_vec::<f32>().expect("values"), [0.6, 0.8, 0.0, -1.0]);
    let plain = answer(texts(&["is fast", "fast"]).with(Dimensions(2)).with(Normalize(false)));
    assert_eq!(plain.tensors[0].to_vec::<f32>().expect("values"), [3.0, 4.0, 0.0, -2.0]);
}

#[test]
fn a_per_token_answer_is_cut_to_each_texts_tokens_and_bounded_in_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let per_token = |texts: &[&str]| {
        let strings = Texts::Strings(texts.iter().map(|t| (*t).to_owned()).collect());
        Request::new(Input::Texts(TextInput::new(strings))).with(PerToken)
    };
    let refused = task(dir.path(), 16).prepare(per_token(&["fast"]), 8).expect_err("no states");
    assert!(matches!(&refused, TaskError::Invalid(m) if m.contains("no vector per token")), "{refused}");

    let task = task_with(dir.path(), 16, 2, true);
    let prepared = task.prepare(per_token(&["is fast", "fast"]), 8).expect("prepared");
    // Both sequences came back padded to 4 positions; each is cut to its own tokens.
    let padded = |first: f32| Tensor::from_slice(vec![1, 4, 2], &[first, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 9.0]);
    let answer = (prepared.finish)(vec![padded(0.0).expect("tensor"), padded(7.0).expect("tensor")]).expect("answer");
    let shapes: Vec<Vec<usize>> = answer.tensors.iter().map(|t| t.shape().to_vec()).collect();
    assert_eq!(shapes, vec![vec![4, 2], vec![3, 2]]);
    assert_eq!(answer.tensors[1].to_vec::<f32>().expect("values"), [7.0, 1.0, 2.0, 3.0, 4.0, 5.0]);

    // 3 tokens of 4 Mi values fit under the 16 Mi cap; 6 do not.
    let wide = task_with(dir.path(), 16, 1 << 22, true);
    assert!(wide.prepare(per_token(&["fast"]), 8).is_ok());
    let refused = wide.prepare(per_token(&["dynamic batching is fast"]), 8).expect_err("too large");
    assert!(matches!(&refused, TaskError::OverLimit(m) if m.contains("at most 16777216")), "{refused}");
}
