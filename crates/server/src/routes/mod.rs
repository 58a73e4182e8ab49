//! One module per protocol, each with its routes, handlers and the wire types they alone serve: the seed's
//! `/predict`, KServe v2, TEI's API, OpenAI's `/v1/embeddings`, Cohere's and Jina's rerank, and the probes with
//! `/metrics`; [`dispatch`] serves the routes several share (`/predict`, `/invocations`) as the model's task says. A handler reads top to bottom: decode its body, [`crate::ops`] (the task's steps around the batcher),
//! encode the answer. The app assembles them.

/// One route served at two paths by one handler: `$first` at `$first_path` and `$second` at `$second_path` (a
/// default model and a named one, or a model's newest version and a named version), documented alike in the OpenAPI
/// document, each with its own path parameters. `$serve` is the handler: an `async fn` of the same arguments.
macro_rules! twin_routes {
    (
        $method:ident $serve:path, ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        $first_doc:literal $first:ident at $first_path:literal ($($first_params:tt)*);
        $second_doc:literal $second:ident at $second_path:literal ($($second_params:tt)*);
        $($attrs:tt)+
    ) => {
        #[doc = $first_doc]
        #[utoipa::path($method, path = $first_path, params($($first_params)*), $($attrs)+)]
        async fn $first($($arg: $ty),*) -> $ret {
            $serve($($arg),*).await
        }

        #[doc = $second_doc]
        #[utoipa::path($method, path = $second_path, params($($second_params)*), $($attrs)+)]
        async fn $second($($arg: $ty),*) -> $ret {
            $serve($($arg),*).await
        }
    };
}

pub mod cohere;
pub mod dispatch;
pub mod health;
pub mod images;
pub mod openai;
pub mod predict;
pub mod settings;
pub mod shm;
pub mod tei;
pub mod v2;
pub mod zero_shot;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use inferd_models::Texts;
use serde::Deserialize;

use crate::error::{body_error, AppError};

/// A small JSON body (a setting, a registration): refused, saying what was wrong, where it is not a `T`.
pub(crate) fn json_request<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
    what: &str,
) -> Result<T, AppError> {
    let body = body.map_err(body_error)?;
    serde_json::from_slice(&body).map_err(|e| AppError::bad_request(format!("invalid {what} request: {e}")))
}

/// A small JSON body that may be empty (`None`).
pub(crate) fn optional_json<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
    what: &str,
) -> Result<Option<T>, AppError> {
    match body {
        Ok(body) if body.iter().all(u8::is_ascii_whitespace) => Ok(None),
        body => json_request(body, what).map(Some),
    }
}

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

/// What a JSON body's `inputs` holds, as far as telling protocols apart needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputsKind {
    Text,
    List,
    Object,
}

/// The kind of a JSON object body's `inputs`: `None` when the body is not an object, has an `input` first (the
/// seed's), or has no `inputs`. Reads no further than that value's first token (a text is read whole; a list or
/// object only opened), skipping the keys before it, so a large body is not parsed twice: its full decode runs off
/// the async runtime, and this runs on it.
pub fn inputs_kind(body: &[u8]) -> Option<InputsKind> {
    use std::cell::Cell;

    use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// The top-level object: its keys, until `input` or `inputs`; then the parse stops with an error, so that
    /// what follows is never read.
    struct Body<'a>(&'a Cell<Option<InputsKind>>);
    impl<'de> DeserializeSeed<'de> for Body<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Body<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                match key.as_ref() {
                    "inputs" => return map.next_value_seed(Inputs(self.0)),
                    "input" => break,
                    _ => map.next_value::<IgnoredAny>().map(drop)?,
                }
            }
            Err(A::Error::custom("decided"))
        }
    }
    /// `inputs`' value, told by its first character; the rest is not read.
    struct Inputs<'a>(&'a Cell<Option<InputsKind>>);
    impl<'de> DeserializeSeed<'de> for Inputs<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)?;
            Err(D::Error::custom("decided"))
        }
    }
    impl<'de> Visitor<'de> for Inputs<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any value")
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            self.0.set(Some(InputsKind::Text));
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
            self.0.set(Some(InputsKind::List));
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
            self.0.set(Some(InputsKind::Object));
            Ok(())
        }
    }
    let kind = Cell::new(None);
    let _ = Body(&kind).deserialize(&mut serde_json::Deserializer::from_slice(body));
    kind.get()
}
