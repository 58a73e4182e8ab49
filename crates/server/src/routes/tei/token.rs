//! Token classification (named entities) in the Hugging Face Inference API's shape, which
//! `huggingface_hub.InferenceClient.token_classification` sends to a model's URL: `POST /` (and `/predict`) on a token
//! classifier, `{"inputs": text, "parameters": {"aggregation_strategy", "ignore_labels"}}` → a list of entities
//! (`entity_group` or, with `none`, `entity` and `index`; `score`, `word`, `start`, `end` in characters); for a list
//! of texts, a list of lists.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use inferd_models::task::{Aggregation, Entity, IgnoreLabels};
use inferd_models::{Input, LoadedModel, Request, Service, Texts};
use serde::{Deserialize, Serialize};

use super::{json_body, serve_json, text_input, TeiFailure, TruncationDirection};
use crate::budget::Hold;
use crate::codec::CodecError;
use crate::state::AppState;

/// A token classification request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct TokenRequest {
    /// One text, or several.
    #[schema(value_type = Object)]
    inputs: OneOrMany,
    #[serde(default)]
    parameters: TokenParameters,
    /// Cut texts longer than the model takes (default true); `false` refuses them with a 400.
    #[serde(default)]
    truncate: Option<bool>,
    /// Which end of a long text is cut (default `right`).
    #[serde(default)]
    truncation_direction: Option<TruncationDirection>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// How tokens become entities.
#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct TokenParameters {
    /// `none`, `simple` (the default), `first`, `average` or `max`, as transformers' pipeline defines them.
    #[serde(default, alias = "aggregationStrategy")]
    aggregation_strategy: Option<String>,
    /// Labels left out of the answer (default `["O"]`).
    #[serde(default, alias = "ignoreLabels")]
    ignore_labels: Option<Vec<String>>,
    /// Refused: a text longer than the model takes is cut (or refused with `truncate: false`), not read in
    /// overlapping windows.
    #[serde(default)]
    stride: Option<u64>,
}

/// One entity, as the Hugging Face Inference API answers it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenEntity {
    /// A token's label (`B-PER`), with `aggregation_strategy: none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    entity: Option<String>,
    /// A group's entity (`PER`), with the other strategies.
    #[serde(skip_serializing_if = "Option::is_none")]
    entity_group: Option<String>,
    score: f32,
    /// A token's position in the tokenized text, special tokens included (`none` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    /// The tokens as the tokenizer writes them; the exact text is `start..end`.
    word: String,
    /// Where it starts and ends in the text, in characters.
    start: usize,
    end: usize,
}

impl TokenEntity {
    fn of(entity: &Entity, grouped: bool) -> Self {
        TokenEntity {
            entity: (!grouped).then(|| entity.label.clone()),
            entity_group: grouped.then(|| entity.label.clone()),
            score: entity.score,
            index: entity.index,
            word: entity.word.clone(),
            start: entity.start,
            end: entity.end,
        }
    }
}

/// Serves a token classification request on `model`.
pub(crate) async fn classify_tokens(
    state: &AppState,
    model: &Arc<LoadedModel>,
    hold: &Arc<Hold>,
    body: Bytes,
) -> Result<Response, TeiFailure> {
    let build = |r: TokenRequest| {
        let p = r.parameters;
        if p.stride.is_some() {
            return Err(CodecError::Invalid(
                "parameters.stride: this server cuts a text longer than the model takes (or refuses it with \
                 \"truncate\": false) rather than reading it in overlapping windows"
                    .into(),
            ));
        }
        let aggregation = match p.aggregation_strategy.as_deref() {
            Some(name) => name.parse::<Aggregation>().map_err(CodecError::Invalid)?,
            None => Aggregation::default(),
        };
        let (texts, batch) = match r.inputs {
            OneOrMany::One(text) => (vec![text], false),
            OneOrMany::Many(texts) => (texts, true),
        };
        let input = text_input(Texts::Strings(texts), r.truncate, r.truncation_direction);
        let mut request = Request::new(Input::Texts(input)).with(aggregation);
        if let Some(ignore) = p.ignore_labels {
            request = request.with(IgnoreLabels(ignore));
        }
        Ok((request, (aggregation.groups(), batch)))
    };
    serve_json(state, model, hold, Service::TokenClassify, "token classification", body, build, |served, context| {
        let (grouped, batch) = context;
        let texts = served
            .answer
            .payload::<Vec<Vec<Entity>>>()
            .ok_or_else(|| CodecError::Encode("the token classifier gave no entities".into()))?;
        let texts: Vec<Vec<TokenEntity>> =
            texts.iter().map(|entities| entities.iter().map(|e| TokenEntity::of(e, grouped)).collect()).collect();
        match (batch, texts.as_slice()) {
            (false, [one]) => json_body(one),
            _ => json_body(&texts),
        }
    })
    .await
}
