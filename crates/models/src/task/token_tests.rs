//! Entities checked against transformers' own `TokenClassificationPipeline`: `tests/data/ner/synthetic.json` holds
//! seeded logits for two texts, tokenized by a word-aware WordPiece tokenizer and by a byte-level BPE (whose words are
//! found by the text's spaces), and the pipeline's answer for each strategy, with and without `O` left out
//! (`tests/data/ner/make_synthetic.py` made it).

use std::sync::Arc;

use serde_json::Value;
use tokenizers::decoders::wordpiece::WordPiece;
use tokenizers::{Decoder, DecoderWrapper};

use super::*;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/ner/synthetic.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).expect("JSON")
}

fn words(case: &str) -> Words {
    let decoder: DecoderWrapper = match case {
        "wordpiece" => WordPiece::new("##".into(), true).into(),
        _ => {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/ner/tiny_bytelevel_bpe_tokenizer.json");
            let tokenizer = tokenizers::Tokenizer::from_file(path).expect("the BPE tokenizer");
            tokenizer.get_decoder().cloned().expect("a decoder")
        }
    };
    Words {
        prefix: (case == "wordpiece").then(|| "##".to_owned()),
        unk: (case == "wordpiece").then_some(100),
        decode: Arc::new(move |tokens| decoder.decode(tokens).expect("decodes")),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect()
}

#[test]
fn entities_are_the_pipelines_for_every_strategy_and_tokenizer() {
    let fixture = fixture();
    let labels: Vec<String> =
        (0..6).map(|i| fixture["id2label"][i.to_string()].as_str().expect("label").into()).collect();
    let mut checked = 0;
    for (case, texts) in fixture["cases"].as_object().expect("cases") {
        let words = words(case);
        for text in texts.as_array().expect("texts") {
            let tokens = strings(&text["tokens"]);
            let ids: Vec<u32> =
                text["input_ids"].as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect();
            let offsets: Vec<(usize, usize)> = text["offsets_char"]
                .as_array()
                .expect("offsets")
                .iter()
                .map(|o| (o[0].as_u64().expect("start") as usize, o[1].as_u64().expect("end") as usize))
                .collect();
            let special: Vec<u32> = text["special_tokens_mask"]
                .as_array()
                .expect("mask")
                .iter()
                .map(|v| v.as_u64().expect("0/1") as u32)
                .collect();
            let logits: Vec<f32> = text["logits"]
                .as_array()
                .expect("logits")
                .iter()
                .flat_map(|row| row.as_array().expect("row").iter().map(|v| v.as_f64().expect("number") as f32))
                .collect();
            let logits = Tensor::from_slice(vec![1, tokens.len(), labels.len()], &logits).expect("tensor");
            let scores = softmax_rows(&logits, tokens.len(), labels.len()).expect("softmax");
            let sentence = text["text"].as_str().expect("text");
            let read = Tokens {
                text: sentence.chars().collect(),
                tokens: &tokens,
                ids: &ids,
                offsets: &offsets,
                special: &special,
                scores: &scores,
                labels: labels.len(),
            };
            for strategy in Aggregation::NAMES {
                for (ignore, key) in
                    [(vec!["O".to_owned()], strategy.to_owned()), (vec![], format!("{strategy}_ignore_none"))]
                {
                    let aggregation: Aggregation = strategy.parse().expect("a strategy");
                    let got = read.entities(&words, &labels, aggregation, &ignore);
                    let want = text["expected"][&key].as_array().expect("expected");
                    assert_eq!(got.len(), want.len(), "{case} {key}: {sentence}\n{got:#?}");
                    for (g, w) in got.iter().zip(want) {
                        let field = if aggregation.groups() { "entity_group" } else { "entity" };
                        assert_eq!(g.label, w[field].as_str().expect("label"), "{case} {key}: {g:?} {w}");
                        assert_eq!(g.word, w["word"].as_str().expect("word"), "{case} {key}: {g:?} {w}");
                        assert_eq!(
                            (g.start as u64, g.end as u64),
                            (w["start"].as_u64().expect("start"), w["end"].as_u64().expect("end")),
                            "{case} {key}"
                        );
                        assert_eq!(g.index.map(|i| i as u64), w.get("index").and_then(Value::as_u64), "{case} {key}");
                        let score = w["score"].as_f64().expect("score");
                        assert!((f64::from(g.score) - score).abs() < 1e-6, "{case} {key}: {} against {score}", g.score);
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 2 * 5 * 2, "every case, text, strategy and ignore list");
}

#[test]
fn a_strategy_is_named_in_any_case_and_an_unknown_one_lists_them() {
    assert_eq!("Average".parse::<Aggregation>(), Ok(Aggregation::Average));
    assert_eq!("MAX".parse::<Aggregation>(), Ok(Aggregation::Max));
    let err = "grouped".parse::<Aggregation>().expect_err("unknown");
    assert!(err.contains("`grouped`") && err.contains("`none`, `simple`, `first`, `average`, `max`"), "{err}");
}

#[test]
fn the_tensor_answer_pads_each_text_with_zeros_and_counts_its_tokens() {
    let out = padded(&[vec![0.25, 0.75], vec![0.5, 0.5, 1.0, 0.0]], 2).expect("padded");
    assert_eq!(out[0].shape(), [2, 2, 2]);
    assert_eq!(out[0].to_vec::<f32>().expect("fp32"), [0.25, 0.75, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0]);
    assert_eq!(out[1].to_vec::<i64>().expect("int64"), [1, 2]);
}
