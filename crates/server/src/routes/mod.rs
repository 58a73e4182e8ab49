//! One module per protocol, each with its routes, handlers and the wire types they alone serve: the seed's
//! `/predict`, KServe v2, TEI's API, OpenAI's `/v1/embeddings`, Cohere's and Jina's rerank, and the probes with
//! `/metrics`. A handler reads top to bottom: decode its body, [`crate::ops`] (the task's steps around the batcher),
//! encode the answer. The app assembles them.

pub mod cohere;
pub mod health;
pub mod openai;
pub mod predict;
pub mod tei;
pub mod v2;

use inferd_models::Texts;
use serde::Deserialize;

/// What TEI's `inputs` and OpenAI's `input` hold: a text or a token list, or a list of either.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum TextsInput {
    One(String),
    Many(Vec<String>),
    Ids(Vec<u32>),
    ManyIds(Vec<Vec<u32>>),
}

impl From<TextsInput> for Texts {
    fn from(input: TextsInput) -> Self {
        match input {
            TextsInput::One(text) => Texts::Strings(vec![text]),
            TextsInput::Many(texts) => Texts::Strings(texts),
            TextsInput::Ids(ids) => Texts::Ids(vec![ids]),
            TextsInput::ManyIds(ids) => Texts::Ids(ids),
        }
    }
}
