//! CLIP and SigLIP against transformers: the tiny models of tests/data/clip, whose projections and logits for the
//! same token ids and pixel values were computed in float64 (make_clip.py).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::{Clip, Config, Family};
use crate::batch::Batch;

fn folder(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/clip").join(name)
}

fn references() -> serde_json::Value {
    let text = std::fs::read_to_string(folder("references.json")).expect("references");
    serde_json::from_str(&text).expect("JSON")
}

fn load(name: &str, dtype: DType) -> Clip {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder(name).join("config.json")).expect("config"))
            .expect("JSON");
    let config = Config::read(&json).expect("a CLIP config");
    // SAFETY: the fixture is only read, and only while the tensors are copied.
    #[allow(unsafe_code)]
    let root =
        unsafe { VarBuilder::from_mmaped_safetensors(&[folder(name).join("model.safetensors")], dtype, &Device::Cpu) }
            .expect("weights");
    Clip::load(&root, config).expect("load")
}

fn rows(value: &serde_json::Value) -> Vec<Vec<f64>> {
    serde_json::from_value(value.clone()).expect("rows")
}

fn host(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).expect("f64").to_vec2::<f64>().expect("rows")
}

/// Every row within `tolerance` of the reference, element by element, and at a cosine of 0.99999 or more.
fn assert_near(got: &[Vec<f64>], want: &[Vec<f64>], tolerance: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        let worst = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let cosine = cosine(g, w);
        assert!(worst <= tolerance && cosine >= 0.99999, "{what} row {r}: differs by {worst}, cosine {cosine}");
    }
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(a) * norm(b))
}

/// Each text's ids, and its real length: to its end token, the highest id in its row (as CLIP's tokenizer makes
/// them; SigLIP's rows are all real).
fn texts(reference: &serde_json::Value, family: Family) -> Vec<(Vec<u32>, usize)> {
    let ids: Vec<Vec<u32>> = serde_json::from_value(reference["ids"].clone()).expect("ids");
    ids.into_iter()
        .map(|row| {
            let real = match family {
                Family::Clip => {
                    let end = *row.iter().max().expect("ids");
                    row.iter().position(|&id| id == end).expect("end") + 1
                }
                Family::Siglip => row.len(),
            };
            (row, real)
        })
        .collect()
}

/// `texts` as one batch, each padded to the longest with `pad`, on the right or on the left.
fn batch(texts: &[(Vec<u32>, usize)], pad: u32, left: bool) -> Batch {
    let seq = texts.iter().map(|(_, n)| *n).max().expect("texts");
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for (row, n) in texts {
        let padding = seq - n;
        let (real, pads) = (row[..*n].iter().copied(), std::iter::repeat_n(pad, padding));
        let (real_mask, pad_mask) = (std::iter::repeat_n(1i64, *n), std::iter::repeat_n(0i64, padding));
        match left {
            false => {
                ids.extend(real.chain(pads));
                mask.extend(real_mask.chain(pad_mask));
            }
            true => {
                ids.extend(pads.chain(real));
                mask.extend(pad_mask.chain(real_mask));
            }
        }
    }
    let rows = texts.len();
    Batch::new(ids, vec![0; rows * seq], &mask, rows, seq, &Device::Cpu).expect("batch")
}

fn pixels(reference: &serde_json::Value, side: usize) -> Tensor {
    let pictures: Vec<Vec<Vec<f32>>> = serde_json::from_value(reference["pixels"].clone()).expect("pixels");
    let n = pictures.len();
    let flat: Vec<f32> = pictures.into_iter().flatten().flatten().collect();
    Tensor::from_vec(flat, (n, 3, side, side), &Device::Cpu).expect("pixels")
}

#[test]
fn clip_and_siglip_embed_pictures_and_texts_as_transformers_does() {
    let all = references();
    for name in ["clip", "siglip"] {
        let reference = &all[name];
        let model = load(name, DType::F32);
        let family = model.config.family;
        let images = model.embed_images(&pixels(reference, model.config.image_size), DType::F32).expect("images");
        assert_near(&host(&images), &rows(&reference["image_embeds"]), 1e-4, &format!("{name} pictures"));
        let texts = texts(reference, family);
        if family == Family::Siglip {
            // Its texts come padded to its longest with the pad id config.json names.
            let pad = model.config.pad_id.expect("SigLIP's pad id");
            assert_eq!(texts[3].0.last(), Some(&pad), "the short text's padding");
        }
        let embedded = model.embed_texts(&batch(&texts, 0, false)).expect("texts");
        assert_near(&host(&embedded), &rows(&reference["text_embeds"]), 1e-4, &format!("{name} texts"));
        let logits = model.logits(&images, &embedded).expect("logits");
        assert_near(&host(&logits), &rows(&reference["logits_per_image"]), 1e-3, &format!("{name} logits"));
        if family == Family::Clip {
            // Padding on the left, or none (each text alone), changes nothing.
            let left = model.embed_texts(&batch(&texts, 0, true)).expect("left");
            assert_near(&host(&left), &rows(&reference["text_embeds"]), 1e-4, "clip texts padded left");
            for (row, text) in texts.iter().enumerate() {
                let alone = host(&model.embed_texts(&batch(std::slice::from_ref(text), 0, false)).expect("alone"));
                let want = &rows(&reference["text_embeds"])[row..row + 1];
                assert_near(&alone, want, 1e-4, "clip text alone");
            }
        }
        // BF16 on the CPU stays near FP32.
        let half = load(name, DType::BF16);
        let images16 = half.embed_images(&pixels(reference, half.config.image_size), DType::BF16).expect("bf16");
        for (a, b) in host(&images16).iter().zip(host(&images)) {
            assert!(cosine(a, &b) > 0.99, "{name}: BF16 pictures drift from FP32");
        }
    }
}

#[test]
fn a_contradictory_config_names_its_field() {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder("siglip").join("config.json")).expect("config"))
            .expect("JSON");
    let cases = [
        ("/vision_config/patch_size", serde_json::json!(7), "vision_config.patch_size: patches of 7 pixels"),
        ("/text_config/num_attention_heads", serde_json::json!(5), "text_config.num_attention_heads: 5 heads"),
        ("/vision_config/hidden_act", serde_json::json!("swish"), "vision_config.hidden_act: `swish`"),
        ("/text_config/projection_size", serde_json::json!(8), "text_config.projection_size: 8"),
        ("/model_type", serde_json::json!("blip"), "model_type: `blip`"),
        ("/vision_config/vision_use_head", serde_json::json!(false), "vision_config.vision_use_head: false"),
    ];
    // A saved config leaves out what equals its class's defaults: SigLIP's base.
    let sparse = serde_json::json!({"model_type": "siglip", "text_config": {}, "vision_config": {}});
    let base = Config::read(&sparse).expect("defaults");
    assert_eq!((base.max_tokens, base.image_size, base.dims, base.pad_id), (64, 224, 768, Some(1)));
    for (pointer, value, says) in cases {
        let mut bad = json.clone();
        *bad.pointer_mut(pointer).expect(pointer) = value;
        let message = Config::read(&bad).expect_err(pointer);
        assert!(message.starts_with(says), "{message}");
    }
}
