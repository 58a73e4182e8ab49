//! What the text protocols share beyond inference: a model's service checked before its body is read, the pairs a
//! rerank request makes, a reranker's scores in rank order, a tensor protocol's `dimensions`, and TEI's timing
//! headers, which its clients, OpenAI's and Cohere's routes carry alike.

use axum::http::{HeaderMap, HeaderValue};
use inferd_core::Tensor;
use inferd_models::task::Dimensions;
use inferd_models::{LoadedModel, Request, Service, Texts};

use crate::codec::CodecError;
use crate::error::AppError;
use crate::ops::infer::Served;

/// The model serves `service`, or the 400 that says what it does instead.
pub fn require(model: &LoadedModel, service: Service) -> Result<(), AppError> {
    match model.service() {
        served if served == service => Ok(()),
        served => Err(AppError::bad_request(format!(
            "model `{}` does not {}: it {} (its task is `{}`)",
            model.name(),
            service.action(),
            served.does(),
            model.task_name()
        ))),
    }
}

/// The pairs that score `query` against each of `texts`, which the protocol calls `field`: what every rerank
/// protocol sends.
pub fn rerank_pairs(query: &str, texts: &[String], field: &str) -> Result<Texts, CodecError> {
    if query.is_empty() {
        return Err(CodecError::Invalid("`query` is empty: there is nothing to rank against".into()));
    }
    if texts.is_empty() {
        return Err(CodecError::Invalid(format!("`{field}` is empty: there is nothing to rank")));
    }
    Ok(Texts::Pairs(texts.iter().map(|t| (query.to_owned(), t.clone())).collect()))
}

/// A reranker's scores as (index, score), best first; ties keep the request's order.
pub fn ranked(tensors: &[Tensor]) -> Result<Vec<(usize, f32)>, CodecError> {
    let scores = tensors.first().ok_or_else(|| CodecError::Encode("the reranker gave no scores".into()))?;
    let scores = scores.to_vec::<f32>().map_err(|e| CodecError::Encode(e.to_string()))?;
    let mut ranked: Vec<(usize, f32)> = scores.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(ranked)
}

/// TEI's timing headers of a text answer, in whole milliseconds as TEI writes them: `x-compute-time` (tokenizing,
/// queue and inference), `x-tokenization-time`, `x-queue-time`, `x-inference-time`, with `x-compute-tokens` and
/// `x-compute-characters`; `x-compute-type` says where `model` ran.
pub fn timing_headers(served: &Served, model: &LoadedModel) -> HeaderMap {
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("x-compute-type", None),
        ("x-compute-time", Some(ms(served.prepare_time + served.queue_time + served.compute_time))),
        ("x-total-time", Some(ms(served.total_time))),
        ("x-tokenization-time", Some(ms(served.prepare_time))),
        ("x-queue-time", Some(ms(served.queue_time))),
        ("x-inference-time", Some(ms(served.compute_time))),
        ("x-compute-tokens", Some(served.answer.tokens as u64)),
        ("x-compute-characters", Some(served.characters as u64)),
    ] {
        let value = match value {
            Some(v) => HeaderValue::from(v),
            None => HeaderValue::from_static(if model.engine_metadata().on_gpu() { "gpu" } else { "cpu" }),
        };
        headers.insert(name, value);
    }
    headers
}

/// `request` with its embeddings cut to `dimensions` where the client asked (a tensor protocol's `dimensions`
/// parameter): only an embedding model's answer can be, and a parameter another model would leave unread is refused
/// rather than ignored.
pub fn with_dimensions(model: &LoadedModel, request: Request, dimensions: Option<usize>) -> Result<Request, AppError> {
    match dimensions {
        None => Ok(request),
        Some(_) if model.service() != Service::Embed => Err(AppError::bad_request(format!(
            "model `{}` {}: the `dimensions` parameter shortens an embedding model's embeddings",
            model.name(),
            model.service().does()
        ))),
        Some(n) => Ok(request.with(Dimensions(n))),
    }
}
