//! The one inference path every protocol shares: decode the body (on the blocking pool when it is large, or when
//! a text model's tokenizer has texts to read), queue the request with the model's batcher in the request's span,
//! encode the answer the same way. A protocol is a [`WireFormat`]: how its bodies decode into a [`Job`], and how
//! answers encode.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use inferd_batcher::{InferRequest, Inputs};
use inferd_core::{Tensor, TensorSpec};

use crate::codec::{CodecError, Limits};
use crate::error::{AppError, ErrorKind};
use crate::repository::Endpoint;
use crate::state::AppState;
use crate::text::{normalize_rows, TextJob, TextModel};

/// Bodies above this size are decoded, and answers above it encoded, on the blocking pool rather than on the
/// async runtime's threads.
pub(crate) const INLINE_CODEC_BYTES: usize = 64 * 1024;

/// Response headers that say how a request was served.
pub const BATCH_SIZE_HEADER: &str = "x-inferd-batch-size";
pub const QUEUE_TIME_HEADER: &str = "x-inferd-queue-us";
pub const COMPUTE_TIME_HEADER: &str = "x-inferd-compute-us";

/// One protocol's inference bodies. A value holds what the protocol read from the request besides its body
/// (its headers, say); it travels with the request to be decoded, and back to encode the answer.
pub trait WireFormat: Send + 'static {
    /// What decoding leaves for encoding the answer: the outputs asked for, an id.
    type Pending: Send + 'static;
    /// The encoded answer.
    type Answer: Send + 'static;

    /// Decodes a body into a job for `model`, within `limits`. Tensor protocols decode against
    /// `model.metadata()`, where a text model takes a `BYTES` input of texts.
    fn decode(&mut self, body: &[u8], model: &Endpoint, limits: &Limits) -> Result<(Job, Self::Pending), CodecError>;

    /// Encodes the model's outputs for the request.
    fn encode(&self, model: &Endpoint, outputs: &Outputs, pending: Self::Pending) -> Result<Self::Answer, CodecError>;
}

/// What a request asks the model to do.
#[derive(Debug)]
pub enum Job {
    /// Tensors, as the model's (public) metadata describes them.
    Tensors(InferRequest),
    /// Texts to embed.
    Text(TextJob),
}

impl From<InferRequest> for Job {
    fn from(request: InferRequest) -> Self {
        Job::Tensors(request)
    }
}

/// A model's answer to one request.
#[derive(Debug)]
pub struct Outputs {
    /// In the order of the model's (public) metadata.
    pub tensors: Vec<Tensor>,
    /// Text models: tokens embedded, special tokens included; 0 otherwise.
    pub tokens: usize,
}

/// An answer, and how it was served.
pub struct Served<A> {
    pub answer: A,
    pub batch_rows: usize,
    pub queue_time: Duration,
    pub compute_time: Duration,
}

impl<A> Served<A> {
    /// The response headers that say how the request was served.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            (BATCH_SIZE_HEADER, self.batch_rows as u128),
            (QUEUE_TIME_HEADER, self.queue_time.as_micros()),
            (COMPUTE_TIME_HEADER, self.compute_time.as_micros()),
        ] {
            headers.insert(name, HeaderValue::from(u64::try_from(value).unwrap_or(u64::MAX)));
        }
        headers
    }
}

/// Runs one inference request of `format` on `endpoint`, the model (version) the route resolved.
pub async fn infer<F: WireFormat>(
    state: &AppState,
    endpoint: Endpoint,
    format: F,
    body: Result<Bytes, BytesRejection>,
) -> Result<Served<F::Answer>, AppError> {
    let body = body.map_err(body_error)?;
    let limits = *state.limits();
    let allow_non_finite = state.allow_non_finite();
    let decoder = endpoint.clone();
    // Tokenizing is CPU work like decoding a large body: both leave the runtime's threads, and so does the scan
    // for non-finite numbers that follows.
    let (format, decoded) = off_runtime_if(body.len() > INLINE_CODEC_BYTES || endpoint.text.is_some(), move || {
        let mut format = format;
        let decoded = format.decode(&body, &decoder, &limits).and_then(|(job, pending)| {
            let (request, text) = prepare(job, decoder.text.as_deref(), &limits)?;
            if let (false, Inputs::Rows(inputs)) = (allow_non_finite, &request.inputs) {
                refuse_non_finite(inputs, &decoder.batcher.metadata().inputs, "input", CodecError::Invalid)?;
            }
            Ok(((request, text), pending))
        });
        (format, decoded)
    })
    .await?;
    let ((mut request, text), pending) = decoded.map_err(|e| e.context(format_args!("model `{}`", endpoint.name())))?;
    // The decoded tensors count against the in-flight budget with the body they came from.
    crate::budget::hold_more(request_bytes(&request.inputs))?;
    // Decoding may have run on the blocking pool: the request's span is this task's.
    request.span = tracing::Span::current();
    let answer = endpoint.batcher.infer(request).await?;
    let out_bytes: usize = answer.outputs.iter().map(|t| t.element_count() * 12).sum();
    let encoder = endpoint.clone();
    let mut outputs = Outputs { tensors: answer.outputs, tokens: 0 };
    let encoded = off_runtime_if(out_bytes > INLINE_CODEC_BYTES, move || {
        if !allow_non_finite {
            refuse_non_finite(&outputs.tensors, &encoder.batcher.metadata().outputs, "output", CodecError::Encode)?;
        }
        if let Some(text) = text {
            outputs.tokens = text.tokens;
            if text.normalize {
                outputs.tensors = outputs.tensors.iter().map(normalize_rows).collect::<Result<_, _>>()?;
            }
        }
        format.encode(&encoder, &outputs, pending)
    })
    .await??;
    Ok(Served {
        answer: encoded,
        batch_rows: answer.batch_rows,
        queue_time: answer.queue_time,
        compute_time: answer.compute_time,
    })
}

/// The bytes a request's decoded tensors hold.
fn request_bytes(inputs: &Inputs) -> usize {
    let tensor = |t: &Tensor| {
        t.raw_bytes().map_or_else(|| t.byte_strings().unwrap_or_default().iter().map(Vec::len).sum(), <[u8]>::len)
    };
    match inputs {
        Inputs::Rows(tensors) => tensors.iter().map(tensor).sum(),
        Inputs::Sequences(sequences) => sequences.iter().flatten().map(tensor).sum(),
    }
}

/// The non-finite policy (`--allow-non-finite` off): the first NaN or infinity in `tensors` is an error of `kind`
/// that names the tensor and the element.
fn refuse_non_finite(
    tensors: &[Tensor],
    specs: &[TensorSpec],
    what: &str,
    error: fn(String) -> CodecError,
) -> Result<(), CodecError> {
    for (t, spec) in tensors.iter().zip(specs) {
        if let Some((index, value)) = t.first_non_finite() {
            let value = if value.is_nan() { "NaN".to_owned() } else { format!("{value}") };
            return Err(error(format!(
                "{what} `{}` holds {value} at element {index}: this server takes and gives finite numbers only \
                     (--allow-non-finite)",
                crate::codec::quoted(&spec.name)
            )));
        }
    }
    Ok(())
}

/// What a text request's answer needs from its preparation.
struct TextAnswer {
    tokens: usize,
    normalize: bool,
}

/// Turns a job into the batcher's request: a text model tokenizes texts, whichever protocol brought them.
fn prepare(
    job: Job,
    text: Option<&TextModel>,
    limits: &Limits,
) -> Result<(InferRequest, Option<TextAnswer>), CodecError> {
    match (job, text) {
        (Job::Tensors(request), None) => Ok((request, None)),
        (Job::Text(_), None) => {
            Err(CodecError::Invalid("it does not embed text: it takes tensors (its task is not `embed`)".into()))
        }
        (job, Some(text)) => {
            let job = match job {
                Job::Tensors(request) => text.job_from_tensors(request)?,
                Job::Text(job) => job,
            };
            let prepared = text.prepare(job, limits)?;
            Ok((prepared.request, Some(TextAnswer { tokens: prepared.tokens, normalize: prepared.normalize })))
        }
    }
}

/// Runs `work` on the blocking pool when `large`, inline when not.
pub(crate) async fn off_runtime_if<T: Send + 'static>(
    large: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    if large {
        tokio::task::spawn_blocking(work).await.map_err(|e| AppError::internal(format!("codec task failed: {e}")))
    } else {
        Ok(work())
    }
}

/// The error of a body that could not be read: too large, or cut off.
pub fn body_error(rejection: BytesRejection) -> AppError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        AppError::new(
            ErrorKind::PayloadTooLarge,
            "the request body is larger than this server takes (--max-body-bytes)",
        )
    } else {
        AppError::bad_request(rejection.body_text())
    }
}

/// A deadline `after` from now, or none where that is past the end of time.
pub fn deadline_in(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}
