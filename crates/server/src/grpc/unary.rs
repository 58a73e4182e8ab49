//! `ModelInfer`, the unary inference RPC, read and answered here rather than through tonic's generic unary call.
//!
//! tonic serves a unary RPC as a stream of one: a `Streaming` decoder over the body, a `Request` made from the
//! HTTP parts (the headers turned into metadata), the handler's future boxed, and the answer encoded by a stream
//! encoder that polls a one-item stream, then makes its trailers from a `Status`. For a small model's request that
//! machinery was about one instruction in twenty of a gRPC request. Here the message is read from the body (kept as
//! the body's own bytes when one chunk holds it, as a message in one frame does), decoded by prost, run through the
//! same [`infer_counted`](super::service) as tonic's path, and answered with one data frame and the
//! `grpc-status: 0` trailer. Each refusal is the status tonic gives the same message, but one: a second message in
//! the call is INTERNAL, where tonic decoded it and dropped it. A call whose message is compressed goes to tonic's
//! path, which answers it as before.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use bytes::{BufMut, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Frame;
use prost::Message;
use tonic::Status;

use super::service::infer_counted;
use super::{Deadline, GRPC_STATUS};
use crate::budget::Hold;
use crate::codec::grpc::proto::{ModelInferRequest, ModelInferResponse};
use crate::state::AppState;

/// A gRPC message's prefix: its compressed flag and its length (big-endian u32).
const PREFIX_BYTES: usize = 5;

const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// Whether a call is read here: its message is not compressed (no `grpc-encoding`, or `identity`). The server
/// takes no compressed messages, and tonic's path answers such a call UNIMPLEMENTED with the encodings it takes.
pub fn read_here(headers: &HeaderMap) -> bool {
    headers.get(GRPC_ENCODING).is_none_or(|encoding| encoding.as_bytes() == b"identity")
}

/// Answers a `ModelInfer` call: its message is at most `--max-body-bytes`, as tonic's path has it.
pub async fn model_infer(state: AppState, request: Request) -> Result<Response, Infallible> {
    let (parts, body) = request.into_parts();
    let answer = async {
        let message = read_message(body, state.max_body_bytes()).await?;
        // tonic's decoder maps prost's errors to INTERNAL, as gRPC's status codes ask of a message that won't parse.
        let message = ModelInferRequest::decode(message).map_err(|e| Status::internal(e.to_string()))?;
        // The gate's deadline and the message's hold on the in-flight budget, as tonic's request carries them.
        let deadline = parts.extensions.get::<Deadline>().copied();
        let hold = parts.extensions.get::<Arc<Hold>>().cloned();
        let answer = infer_counted(&state, message, deadline, hold).await?;
        answered(&answer)
    };
    Ok(answer.await.unwrap_or_else(|status: Status| status.into_http::<Body>()))
}

/// The body's one message, without its prefix. A message whose prefix says more than `max_message` bytes is
/// refused OUT_OF_RANGE as soon as the prefix is read (the gate words it as the server's limit); a compressed flag
/// and a body that ends early are INTERNAL, as tonic has them, and so is a body that goes on past its message
/// (refused before the bytes past it are held).
async fn read_message(mut body: Body, max_message: usize) -> Result<Bytes, Status> {
    // The first chunk as it came, until a second one has to be joined to it.
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    // Where the message ends, its prefix counted, once the prefix is in.
    let mut end: Option<usize> = None;
    let more = || Status::internal("protocol error: a unary call carries one message, and this one sent more");
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::from_error(e.into()))?;
        // Trailers are not the message, and an empty chunk (the frame that ends the stream, as many clients send
        // it after the message) adds nothing to it.
        let Ok(chunk) = frame.into_data() else { continue };
        if chunk.is_empty() {
            continue;
        }
        let held = joined.as_ref().map_or(first.len(), BytesMut::len);
        if end.is_some_and(|end| held + chunk.len() > end) {
            return Err(more());
        }
        let held = if held == 0 {
            first = chunk;
            first.len()
        } else {
            let buffer = joined.get_or_insert_with(|| {
                let mut buffer = BytesMut::with_capacity(end.unwrap_or(held + chunk.len()));
                buffer.extend_from_slice(&std::mem::take(&mut first));
                buffer
            });
            buffer.extend_from_slice(&chunk);
            buffer.len()
        };
        if end.is_none() && held >= PREFIX_BYTES {
            let message_end = message_end(joined.as_deref().unwrap_or(&first), max_message)?;
            if held > message_end {
                return Err(more());
            }
            end = Some(message_end);
            if let Some(buffer) = joined.as_mut() {
                buffer.reserve(message_end - buffer.len());
            }
        }
    }
    let message = joined.map_or(first, BytesMut::freeze);
    match end {
        None if message.is_empty() => Err(Status::internal("Missing request message.")),
        Some(end) if message.len() == end => Ok(message.slice(PREFIX_BYTES..)),
        _ => Err(Status::internal("Unexpected EOF decoding stream.")),
    }
}

/// Where the message a prefix starts ends, the prefix counted, checked as tonic checks it: the flag says
/// uncompressed, the length is within `max_message`.
fn message_end(prefix: &[u8], max_message: usize) -> Result<usize, Status> {
    match prefix[0] {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ))
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), \
                 while sending request"
            )))
        }
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    length.checked_add(PREFIX_BYTES).filter(|_| length <= max_message).ok_or_else(|| {
        Status::out_of_range(format!(
            "Error, decoded message length too large: found {length} bytes, the limit is: {max_message} bytes"
        ))
    })
}

/// The answer: `application/grpc`, the encoded message in one data frame, then `grpc-status: 0`.
fn answered(answer: &ModelInferResponse) -> Result<Response, Status> {
    let length = answer.encoded_len();
    let prefix = u32::try_from(length).map_err(|_| {
        Status::resource_exhausted(format!("the answer is {length} bytes, more than a gRPC message can carry"))
    })?;
    let mut message = BytesMut::with_capacity(PREFIX_BYTES + length);
    message.put_u8(0);
    message.put_u32(prefix);
    answer.encode_raw(&mut message);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    let mut response = Response::new(Body::new(Answer { message: Some(message.freeze()), trailers: Some(trailers) }));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    Ok(response)
}

/// An answer's body: its message, then its trailers. Not `Full::with_trailers` (http-body-util): that body gives an
/// exact size, and hyper then adds a `content-length` to the answer's headers, which tonic's answers never had.
struct Answer {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        Poll::Ready(this.trailers.take().map(|trailers| Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }
}

#[cfg(test)]
#[path = "unary_tests.rs"]
mod tests;
