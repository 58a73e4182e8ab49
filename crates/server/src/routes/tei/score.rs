//! TEI's scoring routes: `POST /rerank` (a query against texts: `[{index, score, text?}]`, best first) and
//! `POST /predict` with TEI's `inputs` (one text or pair, or a batch of them: every label with its score, best
//! first). Each serves its task's default model, and `/models/{model}/…` the named one.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use inferd_core::ModelMetadata;
use inferd_models::task::RawScores;
use inferd_models::{Input, Request, Service, Texts};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{json_body, serve_json, text_input, TeiError, TeiFailure, TruncationDirection};
use crate::codec::CodecError;
use crate::error::{body_error, AppError};
use crate::ops::text::{ranked, rerank_pairs};
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// `/rerank`, which serves the default reranker.
pub fn default_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(rerank_default))
}

/// `/models/{model}/rerank`.
pub fn named_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(rerank_named))
}

/// A TEI rerank request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    /// The query every text is scored against.
    pub query: String,
    /// The texts (passages) to score.
    pub texts: Vec<String>,
    /// Cut pairs longer than the model takes, the text first (default true); `false` refuses them.
    #[serde(default)]
    pub truncate: Option<bool>,
    /// Which end of a long text is cut (default `right`).
    #[serde(default)]
    pub truncation_direction: Option<TruncationDirection>,
    /// The logits as they are, rather than their sigmoid (default false).
    #[serde(default)]
    pub raw_scores: Option<bool>,
    /// Echo each text in its result (default false).
    #[serde(default)]
    pub return_text: Option<bool>,
}

/// One text's place in a rerank answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Rank {
    /// The text's position in the request.
    pub index: usize,
    /// Its relevance to the query.
    pub score: f32,
    /// The text, when `return_text` asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

tei_routes! {
    rerank_default at "/rerank", rerank_named at "/models/{model}/rerank" => rerank;
    docs "Rerank texts against a query with the default reranker."
        "Rerank texts against a query with the named reranker.";
    tag "rerank"; body RerankRequest; answer "Every text, best first" Vec<Rank>
}

pub(super) async fn rerank(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let build = |r: RerankRequest| {
        let input = text_input(rerank_pairs(&r.query, &r.texts, "texts")?, r.truncate, r.truncation_direction);
        let request = Request::new(Input::Texts(input)).with(RawScores(r.raw_scores.unwrap_or(false)));
        Ok((request, r.return_text.unwrap_or(false).then_some(r.texts)))
    };
    serve_json(&state, &model, &hold, Service::Rerank, "rerank", body, build, |served, texts| {
        let ranks = ranked(&served.answer.tensors)?
            .into_iter()
            .map(|(index, score)| Rank { index, score, text: texts.as_ref().map(|t| t[index].clone()) })
            .collect::<Vec<_>>();
        json_body(&ranks)
    })
    .await
}

/// TEI's `/predict` body: `inputs` is one text, one pair (`["a", "b"]`), or a batch of one-text or two-text lists.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct PredictRequest {
    #[schema(value_type = Object)]
    pub inputs: serde_json::Value,
    #[serde(default)]
    pub truncate: Option<bool>,
    /// Which end of a long text is cut (default `right`).
    #[serde(default)]
    pub truncation_direction: Option<TruncationDirection>,
    #[serde(default)]
    pub raw_scores: Option<bool>,
}

/// One label's score.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LabelScore {
    pub label: String,
    pub score: f32,
}

/// TEI's predict inputs as texts or pairs, and whether they were a batch.
fn predict_inputs(inputs: &serde_json::Value) -> Result<(Texts, bool), CodecError> {
    use serde_json::Value;
    let bad = |m: &str| CodecError::Invalid(format!("`inputs`: {m}"));
    let sequence = |items: &[Value]| -> Result<Vec<String>, CodecError> {
        items.iter().map(|v| v.as_str().map(str::to_owned).ok_or_else(|| bad("texts must be strings"))).collect()
    };
    let (sequences, batch) = match inputs {
        Value::String(text) => (vec![vec![text.clone()]], false),
        Value::Array(items) if items.is_empty() => return Err(bad("empty: there is nothing to classify")),
        Value::Array(items) if items.iter().all(Value::is_string) => (vec![sequence(items)?], false),
        Value::Array(items) => (
            items
                .iter()
                .map(|item| item.as_array().ok_or_else(|| bad("a batch is a list of lists of one or two texts")))
                .map(|item| item.and_then(|i| sequence(i)))
                .collect::<Result<Vec<_>, _>>()?,
            true,
        ),
        _ => return Err(bad("one text, a pair [text, text], or a list of lists of one or two texts")),
    };
    if sequences.iter().any(|s| !(1..=2).contains(&s.len())) {
        return Err(bad("each input is one text or a pair of two"));
    }
    let texts = match sequences.iter().all(|s| s.len() == 1) {
        true => Texts::Strings(sequences.into_iter().map(|mut s| s.remove(0)).collect()),
        false if sequences.iter().all(|s| s.len() == 2) => {
            Texts::Pairs(sequences.into_iter().map(|s| (s[0].clone(), s[1].clone())).collect())
        }
        false => return Err(bad("a batch holds single texts or pairs, not both")),
    };
    Ok((texts, batch))
}

/// Serves TEI's `/predict` (`inputs`) on a scoring model: every label's score for each input, best first.
pub(crate) async fn predict(
    state: &AppState,
    model: &std::sync::Arc<inferd_models::LoadedModel>,
    hold: &std::sync::Arc<crate::budget::Hold>,
    body: Bytes,
) -> Result<Response, TeiFailure> {
    let labels = labels_of(model.metadata());
    let build = |r: PredictRequest| {
        let (texts, batch) = predict_inputs(&r.inputs)?;
        let input = text_input(texts, r.truncate, r.truncation_direction);
        Ok((Request::new(Input::Texts(input)).with(RawScores(r.raw_scores.unwrap_or(false))), batch))
    };
    serve_json(state, model, hold, Service::Classify, "predict", body, build, move |served, batch| {
        let scores = served.answer.tensors.first().ok_or_else(|| CodecError::Encode("no scores".into()))?;
        let values = scores.to_vec::<f32>().map_err(|e| CodecError::Encode(e.to_string()))?;
        let width = labels.len().max(1);
        let rows: Vec<Vec<LabelScore>> = values
            .chunks_exact(width)
            .map(|row| {
                let mut row: Vec<LabelScore> =
                    row.iter().zip(&labels).map(|(&score, label)| LabelScore { label: label.clone(), score }).collect();
                row.sort_by(|a, b| b.score.total_cmp(&a.score));
                row
            })
            .collect();
        match (batch, rows.as_slice()) {
            (false, [one]) => json_body(one),
            _ => json_body(&rows),
        }
    })
    .await
}

/// A scoring model's label names in its head's order.
pub(crate) fn labels_of(meta: &ModelMetadata) -> Vec<String> {
    meta.text.as_ref().map(|t| t.labels.clone()).unwrap_or_default()
}

/// `id2label` and `label2id`, as the hub's config and TEI's `/info` write them.
pub(crate) fn label_maps(labels: &[String]) -> (HashMap<String, String>, HashMap<String, usize>) {
    let id2label = labels.iter().enumerate().map(|(i, l)| (i.to_string(), l.clone())).collect();
    let label2id = labels.iter().enumerate().map(|(i, l)| (l.clone(), i)).collect();
    (id2label, label2id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predict_inputs_follow_tei_one_text_one_pair_or_a_batch_of_lists() {
        let texts = |v: serde_json::Value| predict_inputs(&v).map_err(|e| e.to_string());
        let strings = |t: &[&str]| Texts::Strings(t.iter().map(|s| (*s).to_owned()).collect());
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(texts(serde_json::json!("a")), Ok((strings(&["a"]), false)));
        assert_eq!(texts(serde_json::json!(["a"])), Ok((strings(&["a"]), false)));
        assert_eq!(texts(serde_json::json!(["a", "b"])), Ok((Texts::Pairs(vec![pair("a", "b")]), false)));
        assert_eq!(texts(serde_json::json!([["a"], ["b"]])), Ok((strings(&["a", "b"]), true)));
        assert_eq!(
            texts(serde_json::json!([["a", "b"], ["c", "d"]])),
            Ok((Texts::Pairs(vec![pair("a", "b"), pair("c", "d")]), true))
        );
        for bad in [
            serde_json::json!([]),
            serde_json::json!(["a", "b", "c"]),
            serde_json::json!([["a"], ["b", "c"]]),
            serde_json::json!([["a", 1]]),
            serde_json::json!(7),
            serde_json::json!([[]]),
        ] {
            assert!(texts(bad.clone()).is_err(), "{bad}");
        }
    }
}
