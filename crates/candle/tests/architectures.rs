//! Each transformer architecture on candle against its reference: the tiny models of tests/data/architectures, whose
//! last hidden states for a few texts were computed alone and in float64 by transformers (make_native.py: MPNet,
//! ModernBERT, Qwen3) or by the numpy reference of tests/python/reference_arch.py (make_remote.py: NomicBERT, GTE).
//! Also: a text's states do not depend on the batch around it, padded on the right (as the batcher pads) or on the
//! left (as a client's own tensors may be), and BF16 on the CPU stays near FP32.

use std::path::{Path, PathBuf};

use inferd_candle::CandleEngine;
use inferd_core::text::Contract;
use inferd_core::{Engine, ModelConfig, Precision, Tensor};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/architectures")
}

fn parse<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> T {
    serde_json::from_value(v.clone()).expect("reference")
}

/// Each reference text's token ids and float64 states `[tokens][hidden]`.
fn references(name: &str) -> Vec<(Vec<i64>, Vec<Vec<f64>>)> {
    let read = |file: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(file)).expect("references")).expect("JSON")
    };
    let native = read("references.json");
    let texts: Vec<String> = serde_json::from_value(native["texts"].clone()).expect("texts");
    match native["fixtures"].get(name) {
        Some(fixture) => texts.iter().map(|t| (parse(&fixture[t]["ids"]), parse(&fixture[t]["hidden"]))).collect(),
        None => {
            let remote = read("references_remote.json");
            let fixture = &remote[name];
            (0..texts.len()).map(|i| (parse(&fixture["ids"][i]), parse(&fixture["hidden"][i]))).collect()
        }
    }
}

fn engine(name: &str, precision: Precision) -> CandleEngine {
    let mut config = ModelConfig::load(&fixtures().join(name)).expect("model.toml");
    config.precision = Some(precision);
    CandleEngine::load(&config, precision, &[Contract::TokenStates, Contract::Pooled]).expect("load")
}

/// `rows` as one batch, each padded with `pad_id` to the longest, on the right or the left: each row's states
/// `[tokens][hidden]`, padding left out.
fn states(engine: &mut CandleEngine, rows: &[&[i64]], left: bool) -> Vec<Vec<Vec<f32>>> {
    let seq = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for row in rows {
        let pad = seq - row.len();
        let (real, padding) = (row.iter().copied(), std::iter::repeat_n(0, pad));
        let (row_ids, row_mask): (Vec<i64>, Vec<i64>) = match left {
            false => (real.chain(padding).collect(), (0..seq).map(|t| i64::from(t < row.len())).collect()),
            true => (padding.chain(real).collect(), (0..seq).map(|t| i64::from(t >= pad)).collect()),
        };
        ids.extend(row_ids);
        mask.extend(row_mask);
    }
    let shape = vec![rows.len(), seq];
    let types = vec![0i64; ids.len()];
    let tensor = |values: &[i64]| Tensor::from_slice(shape.clone(), values).expect("tensor");
    let inputs = [tensor(&ids), tensor(&mask), tensor(&types)];
    let out = engine.run_text(Contract::TokenStates, &inputs).expect("run");
    let values = out.to_vec::<f32>().expect("f32");
    let width = values.len() / (rows.len() * seq);
    (0..rows.len())
        .map(|r| {
            (0..seq)
                .filter(|&t| mask[r * seq + t] != 0)
                .map(|t| values[(r * seq + t) * width..(r * seq + t + 1) * width].to_vec())
                .collect()
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn largest_difference(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    a.iter().flatten().flatten().zip(b.iter().flatten().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn check(name: &str) {
    let references = references(name);
    let mut fp32 = engine(name, Precision::Fp32);
    let mut worst = 1.0f64;
    let mut alone = Vec::new();
    for (ids, want) in &references {
        let got = states(&mut fp32, &[ids], false).remove(0);
        assert_eq!(got.len(), want.len(), "{name}: tokens");
        for (g, w) in got.iter().zip(want) {
            worst = worst.min(cosine(g, w));
        }
        alone.push(got);
    }
    assert!(worst >= 0.99999, "{name}: smallest cosine to the reference {worst}");
    // The texts in one batch, 64 rows (each text eight times), padded either way.
    let rows: Vec<&[i64]> = references.iter().cycle().take(64).map(|(ids, _)| &ids[..]).collect();
    let expected: Vec<Vec<Vec<f32>>> = alone.iter().cycle().take(64).cloned().collect();
    for left in [false, true] {
        let batched = states(&mut fp32, &rows, left);
        let difference = largest_difference(&batched, &expected);
        assert!(difference <= 1e-5, "{name}: padded {} differs by {difference}", if left { "left" } else { "right" });
    }
    // BF16 on the CPU: candle runs it; each token's state near FP32's.
    let mut bf16 = engine(name, Precision::Bf16);
    let mut worst = 1.0f64;
    for ((ids, _), fp32) in references.iter().zip(&alone) {
        let got = states(&mut bf16, &[ids], false).remove(0);
        for (g, f) in got.iter().zip(fp32) {
            worst = worst.min(cosine(g, &f.iter().map(|&v| f64::from(v)).collect::<Vec<_>>()));
        }
    }
    assert!(worst >= 0.998, "{name}: BF16's smallest cosine to FP32 {worst}");
}

#[test]
fn mpnet_matches_transformers() {
    check("mpnet");
}

#[test]
fn modernbert_matches_transformers_with_local_attention() {
    check("modernbert");
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}

#[test]
fn qwen3_with_a_sliding_window_matches_transformers() {
    check("qwen3-sliding");
}

#[test]
fn nomic_bert_matches_its_reference() {
    check("nomic");
}

#[test]
fn gte_matches_its_reference() {
    check("gte");
}

/// A classifier's logits for each reference text, run alone and in one right-padded batch, against transformers'.
fn check_head(name: &str) {
    let native: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("references.json")).expect("references"))
            .expect("JSON");
    let texts: Vec<String> = parse(&native["texts"]);
    let fixture = &native["fixtures"][name];
    let mut config = ModelConfig::load(&fixtures().join(name)).expect("model.toml");
    config.precision = Some(Precision::Fp32);
    let mut engine = CandleEngine::load(&config, Precision::Fp32, &[Contract::SequenceScores]).expect("load");
    let ids: Vec<Vec<i64>> = texts.iter().map(|t| parse(&fixture[t]["ids"])).collect();
    let want: Vec<Vec<f64>> = texts.iter().map(|t| parse(&fixture[t]["logits"])).collect();
    let run = |engine: &mut CandleEngine, rows: &[Vec<i64>]| -> Vec<Vec<f32>> {
        let seq = rows.iter().map(Vec::len).max().unwrap_or(0);
        let ids: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied().chain(std::iter::repeat(0)).take(seq)).collect();
        let mask: Vec<i64> = rows.iter().flat_map(|r| (0..seq).map(move |t| i64::from(t < r.len()))).collect();
        let shape = vec![rows.len(), seq];
        let tensor = |values: &[i64]| Tensor::from_slice(shape.clone(), values).expect("tensor");
        let out =
            engine.run_text(Contract::SequenceScores, &[tensor(&ids), tensor(&mask), tensor(&vec![0; ids.len()])]);
        let values = out.expect("run").to_vec::<f32>().expect("f32");
        values.chunks(values.len() / rows.len()).map(<[f32]>::to_vec).collect()
    };
    let batched = run(&mut engine, &ids);
    for (i, (row, want)) in ids.iter().zip(&want).enumerate() {
        let alone = run(&mut engine, std::slice::from_ref(row)).remove(0);
        for (got, label) in [(&alone, "alone"), (&batched[i], "batched")] {
            let worst = got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-4, "{name}: text {i} {label}: logits {got:?}, want {want:?}");
        }
    }
}

#[test]
fn modernbert_classifier_matches_transformers() {
    check_head("modernbert-classifier");
}

#[test]
fn mpnet_classifier_matches_transformers() {
    check_head("mpnet-classifier");
}
