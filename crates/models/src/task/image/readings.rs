//! From a vision model's outputs to answers people read (`[output.NAME]`): the top-k classes of a classifier, with
//! labels and probabilities; a YOLO-style detector's boxes, after non-maximum suppression per class, in the
//! original picture's pixels; and Triton's classification extension (`"score:index:label"` strings) for the v2
//! protocol, on any model's output.

use inferd_core::{DataType, OutputConfig, Tensor};
use serde::Serialize;

use super::pixels::Geometry;
use crate::task::TaskError;

/// One class and how sure the model is of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Class {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub score: f32,
}

/// One object found: its class, and its box in the picture's pixels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    #[serde(flatten)]
    pub class: Class,
    /// Left, top, right, bottom.
    #[serde(rename = "box")]
    pub bounds: [f32; 4],
}

/// One output's answer for one picture.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    Classes(Vec<Class>),
    Boxes(Vec<Detection>),
    /// The picture's row of the output, as the model gave it.
    Tensor(Tensor),
}

/// A tensor's values as `f32`, whatever its floating-point type.
pub fn floats(t: &Tensor) -> Result<Vec<f32>, TaskError> {
    use inferd_core::half::{bf16, f16};
    let internal = |e: inferd_core::Error| TaskError::Internal(e.to_string());
    Ok(match t.dtype() {
        DataType::Fp32 => t.to_vec::<f32>().map_err(internal)?,
        DataType::Fp16 => t.to_vec::<f16>().map_err(internal)?.into_iter().map(f16::to_f32).collect(),
        DataType::Bf16 => t.to_vec::<bf16>().map_err(internal)?.into_iter().map(bf16::to_f32).collect(),
        DataType::Fp64 => t.to_vec::<f64>().map_err(internal)?.into_iter().map(|v| v as f32).collect(),
        other => return Err(TaskError::Internal(format!("an output of scores is {other}, not floating point"))),
    })
}

/// Whether `row` already holds probabilities that sum to 1.
fn is_distribution(row: &[f32]) -> bool {
    row.iter().all(|v| (0.0..=1.0).contains(v)) && (row.iter().sum::<f32>() - 1.0).abs() < 1e-3
}

fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// The best `k` of `row`, best first; ties keep the lower index first.
fn best(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut ranked: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(k);
    ranked
}

fn class(index: usize, score: f32, labels: Option<&[String]>) -> Class {
    Class { index, label: labels.and_then(|l| l.get(index)).cloned(), score }
}

/// A classifier's row of scores (or logits) as its `top_k` best classes.
pub fn classify(row: &[f32], config: &OutputConfig, labels: Option<&[String]>) -> Vec<Class> {
    let mut row = row.to_vec();
    if config.softmax.unwrap_or_else(|| !is_distribution(&row)) {
        softmax(&mut row);
    }
    best(&row, config.top_k).into_iter().map(|(i, score)| class(i, score, labels)).collect()
}

/// Triton's classification extension: each row of `output` (everything after its batch dimension when `batched`,
/// else the whole tensor) as its best `k` classes, `"score:index"` or `"score:index:label"` strings, in a `BYTES`
/// tensor of `[batch, k]` (or `[k]`). The scores are the model's own, as Triton gives them.
pub fn triton_classification(
    output: &Tensor,
    k: usize,
    labels: Option<&[String]>,
    batched: bool,
) -> Result<Tensor, TaskError> {
    let values = floats(output)
        .map_err(|_| TaskError::Invalid(format!("classification: the output is {}, not scores", output.dtype())))?;
    let rows = if batched { output.shape().first().copied().unwrap_or(1) } else { 1 };
    let classes = values.len().checked_div(rows).unwrap_or(0);
    let k = k.min(classes);
    let mut strings = Vec::with_capacity(rows * k);
    if classes > 0 {
        for row in values.chunks(classes) {
            for (i, score) in best(row, k) {
                let text = match labels.and_then(|l| l.get(i)) {
                    Some(label) => format!("{score:.6}:{i}:{label}"),
                    None => format!("{score:.6}:{i}"),
                };
                strings.push(text.into_bytes());
            }
        }
    }
    let shape = if batched { vec![rows, k] } else { vec![k] };
    Tensor::from_byte_strings(shape, strings).map_err(|e| TaskError::Internal(e.to_string()))
}

/// A YOLO-style detector's output for one picture, `[4 + classes, anchors]` or `[anchors, 4 + classes]` (`dims`),
/// as the boxes it finds, best first, in the picture's pixels.
pub fn detect(
    values: &[f32],
    dims: (usize, usize),
    config: &OutputConfig,
    labels: Option<&[String]>,
    geometry: &Geometry,
) -> Result<Vec<Detection>, TaskError> {
    // Anchors outnumber attributes; labels, when given, settle it.
    let attributes_first = match labels {
        Some(l) if dims.0 == l.len() + 4 => true,
        Some(l) if dims.1 == l.len() + 4 => false,
        Some(l) => {
            return Err(TaskError::Internal(format!(
                "the detection output is {dims:?}: neither dimension is 4 + the {} labels",
                l.len()
            )))
        }
        None => dims.0 <= dims.1,
    };
    let (attributes, anchors) = if attributes_first { dims } else { (dims.1, dims.0) };
    if attributes < 5 {
        return Err(TaskError::Internal(format!("the detection output is {dims:?}: no class scores after the box")));
    }
    let at = |attribute: usize, anchor: usize| {
        if attributes_first {
            values[attribute * anchors + anchor]
        } else {
            values[anchor * attributes + attribute]
        }
    };
    let mut found: Vec<(usize, f32, [f32; 4])> = Vec::new();
    for anchor in 0..anchors {
        let (best, score) =
            (4..attributes)
                .map(|a| (a - 4, at(a, anchor)))
                .fold((0, f32::NEG_INFINITY), |b, c| if c.1 > b.1 { c } else { b });
        if score >= config.confidence {
            let (cx, cy, w, h) = (at(0, anchor), at(1, anchor), at(2, anchor), at(3, anchor));
            found.push((best, score, [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0]));
        }
    }
    // Best first; then greedy suppression within each class.
    found.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut kept: Vec<(usize, f32, [f32; 4])> = Vec::new();
    for candidate in found {
        if kept.len() == config.max_detections {
            break;
        }
        if kept.iter().all(|k| k.0 != candidate.0 || iou(&k.2, &candidate.2) <= config.iou) {
            kept.push(candidate);
        }
    }
    Ok(kept
        .into_iter()
        .map(|(index, score, b)| {
            let (x1, y1) = geometry.to_picture(b[0], b[1]);
            let (x2, y2) = geometry.to_picture(b[2], b[3]);
            Detection { class: class(index, score, labels), bounds: [x1, y1, x2, y2] }
        })
        .collect())
}

/// Intersection over union of two boxes (left, top, right, bottom).
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |r: &[f32; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(text: &str) -> OutputConfig {
        toml::from_str(text).expect("valid [output.NAME]")
    }

    #[test]
    fn logits_become_probabilities_and_probabilities_stay() {
        let c = output("kind = \"classification\"\ntop_k = 2");
        let labels = ["cat".to_owned(), "dog".to_owned(), "fox".to_owned()];
        let top = classify(&[1.0, 3.0, 2.0], &c, Some(&labels));
        assert_eq!(top.iter().map(|c| c.label.as_deref()).collect::<Vec<_>>(), [Some("dog"), Some("fox")]);
        assert!((top[0].score - 0.665_240_9).abs() < 1e-6, "{top:?}");
        let top = classify(&[0.2, 0.5, 0.3], &c, None);
        assert_eq!((top[0].index, top[0].score, top[1].index), (1, 0.5, 2));
    }

    #[test]
    fn triton_classification_strings() {
        let t = Tensor::from_slice(vec![2, 3], &[0.1f32, 0.7, 0.2, 0.5, 0.25, 0.25]).expect("tensor");
        let labels = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let out = triton_classification(&t, 2, Some(&labels), true).expect("classes");
        assert_eq!(out.shape(), &[2, 2]);
        let strings: Vec<&[u8]> = out.byte_strings().expect("bytes").iter().map(Vec::as_slice).collect();
        assert_eq!(strings, [&b"0.700000:1:b"[..], b"0.200000:2:c", b"0.500000:0:a", b"0.250000:1:b"]);
        let out = triton_classification(&t, 9, None, true).expect("classes");
        assert_eq!(out.shape(), &[2, 3]);
        // Every element after the batch dimension is a class ([N, 3, 1, 1] as [N, 3]); without a batch dimension the
        // whole tensor is one row, answered [k].
        let t = Tensor::from_slice(vec![1, 3, 1, 1], &[0.1f32, 0.7, 0.2]).expect("tensor");
        assert_eq!(triton_classification(&t, 2, None, true).expect("classes").shape(), &[1, 2]);
        let out = triton_classification(&t, 2, None, false).expect("classes");
        assert_eq!(out.shape(), &[2]);
        assert_eq!(out.byte_strings().expect("bytes")[0], b"0.700000:1");
        let empty = Tensor::from_slice(vec![2, 0], &[] as &[f32]).expect("tensor");
        assert_eq!(triton_classification(&empty, 3, None, true).expect("no classes").shape(), &[2, 0]);
    }

    #[test]
    fn detection_suppresses_overlaps_within_a_class_and_maps_boxes_back() {
        // Four anchors, two classes, attributes first: cx, cy, w, h, score of class 0, of class 1.
        #[rustfmt::skip]
        let values = [
            10.0, 11.0, 50.0, 10.0,  // cx
            10.0, 10.0, 50.0, 10.0,  // cy
            10.0, 10.0, 20.0, 10.0,  // w
            10.0, 10.0, 20.0, 10.0,  // h
            0.9,  0.8,  0.1,  0.0,   // class 0
            0.0,  0.0,  0.6,  0.7,   // class 1
        ];
        let c = output("kind = \"detection\"");
        let g = Geometry { width: 200, height: 200, scale_x: 0.5, scale_y: 0.5, left: 0.0, top: 0.0 };
        // Two labels tell the layouts apart (without, the longer dimension is taken for the anchors).
        let labels = ["a".to_owned(), "b".to_owned()];
        let found = detect(&values, (6, 4), &c, Some(&labels), &g).expect("boxes");
        // Anchor 1 overlaps anchor 0 (same class, IoU 0.82) and goes; anchor 3 overlaps anchor 0 but is class 1.
        let summary: Vec<(usize, f32)> = found.iter().map(|d| (d.class.index, d.class.score)).collect();
        assert_eq!(summary, [(0, 0.9), (1, 0.7), (1, 0.6)]);
        assert_eq!(found[0].bounds, [10.0, 10.0, 30.0, 30.0]);
        // The same output laid out anchors first reads the same.
        let transposed: Vec<f32> = (0..4).flat_map(|a| (0..6).map(move |r| values[r * 4 + a])).collect();
        let again = detect(&transposed, (4, 6), &c, Some(&labels), &g).expect("boxes");
        assert_eq!(
            again.iter().map(|d| d.bounds).collect::<Vec<_>>(),
            found.iter().map(|d| d.bounds).collect::<Vec<_>>()
        );
        assert_eq!(again[0].class.label.as_deref(), Some("a"));
    }
}
