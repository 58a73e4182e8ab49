//! Zero-shot picture classification as the Hugging Face Inference API serves it, so that `huggingface_hub`'s
//! `InferenceClient.zero_shot_image_classification` works unchanged: `POST /` (the default embedder) or
//! `POST /models/{model}` with `{"inputs": "<the picture's file in base64>", "parameters": {"candidate_labels": [...],
//! "hypothesis_template": "This is a photo of {}."}}` → `[{"label", "score"}]`, best first. For a model of two towers
//! (CLIP, SigLIP): the picture and each label's sentence are embedded (batched with other requests' pictures and
//! texts), and each logit, `exp(logit_scale)` × their cosine (plus SigLIP's bias), becomes a probability as
//! transformers' pipeline makes it: a softmax over the labels, or for SigLIP a sigmoid each.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use inferd_core::text::Similarity;
use inferd_models::task::{file_from_base64, Normalize};
use inferd_models::{Input, LoadedModel, Request, TextInput, Texts};
use serde::{Deserialize, Serialize};

use crate::budget::Hold;
use crate::error::AppError;
use crate::ops::infer::{infer, off_runtime_if, INLINE_WORK_BYTES};
use crate::state::AppState;

/// transformers' default sentence for a label.
const DEFAULT_TEMPLATE: &str = "This is a photo of {}.";

#[derive(Deserialize)]
struct ZeroShotRequest {
    /// The picture's file in base64, or a `data:` URL.
    inputs: String,
    parameters: Parameters,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Parameters {
    candidate_labels: Labels,
    /// Each label's sentence: `{}` is replaced by the label.
    #[serde(default)]
    hypothesis_template: Option<String>,
}

/// The labels: a list, or one text of labels joined by commas (the Inference API's older form).
#[derive(Deserialize)]
#[serde(untagged)]
enum Labels {
    List(Vec<String>),
    Joined(String),
}

impl Labels {
    fn into_list(self) -> Vec<String> {
        match self {
            Labels::List(labels) => labels,
            Labels::Joined(text) => {
                text.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()
            }
        }
    }
}

#[derive(Serialize)]
struct LabelScore {
    label: String,
    score: f64,
}

/// Whether a `POST /` body to `model` asks for zero-shot classification: the model scores pictures against texts,
/// and the body has the keys `parameters` and `candidate_labels` (which TEI's embed requests never have). Read
/// without parsing: the body is mostly a picture's base64, parsed once, off the runtime.
pub(crate) fn asked(model: &LoadedModel, body: &[u8]) -> bool {
    let has = |key: &[u8]| memchr::memmem::find(body, key).is_some();
    similarity(model).is_some() && has(b"\"parameters\"") && has(b"\"candidate_labels\"")
}

/// How `model` scores a picture against a text, where it can.
fn similarity(model: &LoadedModel) -> Option<Similarity> {
    model.batchers().find_map(|b| b.metadata().text.as_ref()?.similarity)
}

/// Classifies the body's picture among its labels.
pub(crate) async fn classify(
    state: &AppState,
    model: &Arc<LoadedModel>,
    hold: &Arc<Hold>,
    body: Bytes,
) -> Result<Response, AppError> {
    let Some(similarity) = similarity(model) else {
        return Err(AppError::bad_request(format!(
            "model `{}` does not embed pictures and texts into one space: zero-shot classification needs CLIP or SigLIP",
            model.name()
        )));
    };
    let large = body.len() > INLINE_WORK_BYTES;
    let parse = move || {
        let request: ZeroShotRequest = serde_json::from_slice(&body)
            .map_err(|e| AppError::bad_request(format!("invalid zero-shot classification request: {e}")))?;
        let picture = file_from_base64(&request.inputs)
            .map_err(|e| AppError::bad_request(format!("inputs: not the picture's file in base64 ({e})")))?;
        Ok::<_, AppError>((request.parameters, Bytes::from(picture)))
    };
    let (parameters, picture) = off_runtime_if(large, parse).await??;
    let labels = parameters.candidate_labels.into_list();
    if labels.is_empty() {
        return Err(AppError::bad_request("parameters.candidate_labels: give at least one label"));
    }
    let template = parameters.hypothesis_template.unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
    if !template.contains("{}") {
        return Err(AppError::bad_request(
            "parameters.hypothesis_template: it must hold `{}`, where each label goes (\"This is a photo of {}.\")",
        ));
    }
    let sentences: Vec<String> = labels.iter().map(|label| template.replace("{}", label)).collect();
    // The picture and the sentences run at once, each on its tower; both as unit vectors, whose product is the cosine.
    let picture = Request::new(Input::Images(vec![picture])).with(Normalize(true));
    let texts = Request::new(Input::Texts(TextInput::new(Texts::Strings(sentences)))).with(Normalize(true));
    let (picture, texts) = tokio::try_join!(infer(state, model, picture, hold), infer(state, model, texts, hold))?;
    let vector = |served: &crate::ops::infer::Served| {
        served
            .answer
            .tensors
            .first()
            .and_then(|t| t.to_vec::<f32>().ok())
            .ok_or_else(|| AppError::internal("an embedding is missing from the answer"))
    };
    let (picture, texts) = (vector(&picture)?, vector(&texts)?);
    if picture.is_empty() || texts.len() != picture.len() * labels.len() {
        return Err(AppError::internal("the picture's and the labels' embeddings differ in length"));
    }
    let logits: Vec<f64> = texts
        .chunks_exact(picture.len())
        .map(|text| {
            let cosine: f64 = text.iter().zip(&picture).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            f64::from(similarity.scale) * cosine + similarity.bias.map_or(0.0, f64::from)
        })
        .collect();
    let scores = probabilities(&logits, similarity.bias.is_some());
    let mut answer: Vec<LabelScore> =
        labels.into_iter().zip(scores).map(|(label, score)| LabelScore { label, score }).collect();
    answer.sort_by(|a, b| b.score.total_cmp(&a.score));
    let body = serde_json::to_vec(&answer).map_err(|e| AppError::internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Each logit's probability: a sigmoid each (`apart`), or a softmax over them all.
fn probabilities(logits: &[f64], apart: bool) -> Vec<f64> {
    if apart {
        return logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
    }
    let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::probabilities;

    #[test]
    fn labels_share_a_softmax_or_are_scored_apart() {
        let shared = probabilities(&[1.0, 2.0, 3.0], false);
        assert!((shared.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(shared[2] > shared[1] && shared[1] > shared[0]);
        let apart = probabilities(&[0.0, 2.0], true);
        assert!((apart[0] - 0.5).abs() < 1e-12 && (apart[1] - 1.0 / (1.0 + (-2.0f64).exp())).abs() < 1e-12);
    }
}
