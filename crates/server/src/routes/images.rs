//! Pictures on the seed API: `/models/{model}/predict` (and `/predict`) takes a vision model's pictures as the raw
//! body (`Content-Type: image/*`), as the parts of a `multipart/form-data` form (one picture a part, in order), or
//! base64 in JSON (`{"image": "…"}`, `{"images": ["…", …]}`, data URLs too), and answers each picture's readings:
//! labels, boxes, or the tensor, by output name.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use inferd_models::task::{file_from_base64, Picture, Reading};
use inferd_models::{Input, LoadedModel, Request};
use serde::{Deserialize, Serialize};

use crate::budget::Hold;
use crate::codec::json::NestedJson;
use crate::codec::CodecError;
use crate::error::AppError;
use crate::ops::infer::{decode, encode, infer, off_runtime_if, respond, Served, INLINE_WORK_BYTES};
use crate::state::AppState;

/// How a body carries pictures, by its `Content-Type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carrier {
    /// The body is one encoded picture.
    Raw,
    /// Each file part of the form is one picture.
    Multipart { boundary: String },
}

/// How the body of a request with `headers` carries pictures: `image/*` and `multipart/form-data` always; an
/// `application/octet-stream` body when the model takes pictures (`takes_images`). `None`: it is JSON (or says
/// nothing), read as the seed's tensors or, for a vision model, as base64 pictures.
pub fn carrier(headers: &HeaderMap, takes_images: bool) -> Result<Option<Carrier>, AppError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else { return Ok(None) };
    let value = value.to_str().unwrap_or_default();
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if essence.starts_with("image/") || (takes_images && essence == "application/octet-stream") {
        return Ok(Some(Carrier::Raw));
    }
    if essence == "multipart/form-data" {
        let boundary = multer::parse_boundary(value)
            .map_err(|e| AppError::bad_request(format!("multipart/form-data without a usable boundary: {e}")))?;
        return Ok(Some(Carrier::Multipart { boundary }));
    }
    Ok(None)
}

/// The pictures of a body carried as `carrier`. A form is parsed off the runtime when it is large.
async fn pictures(carrier: Carrier, body: Bytes) -> Result<Vec<Bytes>, AppError> {
    match carrier {
        Carrier::Raw => Ok(vec![body]),
        Carrier::Multipart { boundary } => {
            let large = body.len() > INLINE_WORK_BYTES;
            // The whole body is in memory: parsing it never waits, so it completes on the first poll.
            off_runtime_if(large, move || {
                use futures_util::FutureExt as _;
                form_files(body, boundary)
                    .now_or_never()
                    .unwrap_or_else(|| Err(AppError::internal("parsing a form in memory waited: this is a bug")))
            })
            .await?
        }
    }
}

/// The files of a `multipart/form-data` body, in order. A part that is not a file (no file name, and a text type or
/// none) is refused: a picture sent as a text field would otherwise be read as one, or a form field taken for one.
async fn form_files(body: Bytes, boundary: String) -> Result<Vec<Bytes>, AppError> {
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::convert::Infallible>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut files = Vec::new();
    let bad = |e: multer::Error| AppError::bad_request(format!("a malformed multipart/form-data body: {e}"));
    while let Some(field) = form.next_field().await.map_err(bad)? {
        let text = field.content_type().is_none_or(|t| t.type_() == "text");
        if field.file_name().is_none() && text {
            let name = field.name().unwrap_or_default().to_owned();
            return Err(AppError::bad_request(format!(
                "form field `{name}` is not a file: send each picture as a file part (curl -F {name}=@photo.jpg)"
            )));
        }
        files.push(field.bytes().await.map_err(bad)?);
    }
    Ok(files)
}

/// The seed's JSON body for a vision model: pictures in base64.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImagesRequest {
    /// One picture: its file in base64, or a `data:` URL.
    image: Option<String>,
    /// Several pictures, each as `image`.
    images: Option<Vec<String>>,
}

/// The files of a JSON body of base64 pictures.
fn decode_json(body: &[u8]) -> Result<Vec<Bytes>, CodecError> {
    let request: ImagesRequest = serde_json::from_slice(body).map_err(|e| {
        CodecError::Invalid(format!(
            "invalid JSON for a vision model: {e}; it takes {{\"image\": \"<base64>\"}} or {{\"images\": [...]}}, or the \
             picture itself as the body with Content-Type: image/*"
        ))
    })?;
    let texts = match (request.image, request.images) {
        (Some(one), None) => vec![one],
        (None, Some(many)) => many,
        _ => return Err(CodecError::Invalid("give `image` or `images`, one of them".into())),
    };
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            file_from_base64(text)
                .map(Bytes::from)
                .map_err(|e| CodecError::Invalid(format!("picture {i}: not base64: {e}")))
        })
        .collect()
}

/// A vision model's answer on the seed API.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ImagesResponse<'a> {
    model: &'a str,
    device: &'a str,
    /// One per picture, in the order sent.
    #[schema(value_type = Vec<Object>)]
    predictions: Vec<PictureJson<'a>>,
}

/// One picture's answer: its size (upright) and each output's reading by name.
#[derive(Serialize)]
struct PictureJson<'a> {
    width: u32,
    height: u32,
    outputs: BTreeMap<&'a str, ReadingJson<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ReadingJson<'a> {
    Classes(&'a [inferd_models::task::Class]),
    Boxes(&'a [inferd_models::task::Detection]),
    Tensor(NestedJson<'a>),
}

fn answer_json(model: &LoadedModel, pictures: &[Picture]) -> Result<Vec<u8>, CodecError> {
    let meta = model.metadata();
    let predictions = pictures
        .iter()
        .map(|p| PictureJson {
            width: p.width,
            height: p.height,
            outputs: meta
                .outputs
                .iter()
                .zip(&p.readings)
                .map(|(spec, reading)| {
                    let json = match reading {
                        Reading::Classes(c) => ReadingJson::Classes(c),
                        Reading::Boxes(b) => ReadingJson::Boxes(b),
                        Reading::Tensor(t) => ReadingJson::Tensor(NestedJson(t)),
                    };
                    (spec.name.as_str(), json)
                })
                .collect(),
        })
        .collect();
    let response = ImagesResponse { model: model.name(), device: &meta.device, predictions };
    serde_json::to_vec(&response).map_err(|e| CodecError::Encode(e.to_string()))
}

/// Serves pictures to `model`: carried as `carrier`, or (`None`) as base64 JSON.
pub async fn predict(
    state: &AppState,
    model: &Arc<LoadedModel>,
    hold: &Arc<Hold>,
    carrier: Option<Carrier>,
    body: Bytes,
    deadline: Option<std::time::Instant>,
) -> Result<Response, AppError> {
    let files = match carrier {
        Some(carrier) => pictures(carrier, body).await?,
        None => decode(model, body.len(), move |_| decode_json(&body)).await?,
    };
    let request = Request::new(Input::Images(files)).with_deadline(deadline);
    let served: Served = infer(state, model, request, hold).await?;
    let headers = served.headers();
    let encoder = model.clone();
    let body = encode(served, move |served| {
        let pictures: &[Picture] = served.answer.payload::<Vec<Picture>>().map_or(&[], Vec::as_slice);
        answer_json(&encoder, pictures)
    })
    .await?;
    Ok(respond(headers, "application/json", body))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn the_content_type_says_how_pictures_come() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).expect("header"));
            carrier(&headers, false)
        };
        assert_eq!(with("image/jpeg").expect("ok"), Some(Carrier::Raw));
        assert_eq!(with("Image/PNG; q=1").expect("ok"), Some(Carrier::Raw));
        assert_eq!(
            with("multipart/form-data; boundary=abc").expect("ok"),
            Some(Carrier::Multipart { boundary: "abc".into() })
        );
        assert!(with("multipart/form-data").expect_err("no boundary").message.contains("boundary"));
        assert_eq!(with("application/json").expect("ok"), None);
        assert_eq!(carrier(&HeaderMap::new(), true).expect("ok"), None);
        let mut octets = HeaderMap::new();
        octets.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        assert_eq!(carrier(&octets, true).expect("ok"), Some(Carrier::Raw));
        assert_eq!(carrier(&octets, false).expect("ok"), None);
    }

    #[tokio::test]
    async fn every_part_of_a_form_is_a_picture_file() {
        let body = "--b\r\nContent-Disposition: form-data; name=\"a\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\
                    PNG\r\n--b\r\nContent-Disposition: form-data; name=\"b\"\r\nContent-Type: image/jpeg\r\n\r\nJPG\r\n--b--\r\n";
        let files = form_files(Bytes::from(body), "b".into()).await.expect("two files");
        assert_eq!(files, [Bytes::from_static(b"PNG"), Bytes::from_static(b"JPG")]);
        let body = "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nresnet\r\n--b--\r\n";
        let err = form_files(Bytes::from(body), "b".into()).await.expect_err("a text field");
        assert!(err.message.contains("form field `model` is not a file"), "{}", err.message);
    }

    #[test]
    fn json_pictures_are_base64_or_data_urls() {
        let files = decode_json(br#"{"images": ["aGk=", "data:image/png;base64,aGk=", "aG\nk="]}"#).expect("three");
        assert_eq!(files, [Bytes::from_static(b"hi"), Bytes::from_static(b"hi"), Bytes::from_static(b"hi")]);
        let err = decode_json(br#"{"image": "not base64!"}"#).expect_err("bad");
        assert!(err.to_string().contains("picture 0: not base64"), "{err}");
        let err = decode_json(br#"{"image": "aGk=", "images": []}"#).expect_err("both");
        assert!(err.to_string().contains("one of them"), "{err}");
        let err = decode_json(br#"{"input": [[1.0]]}"#).expect_err("tensors");
        assert!(err.to_string().contains("Content-Type: image/*"), "{err}");
    }
}
