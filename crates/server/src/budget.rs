//! The in-flight budget (`--max-inflight-bytes`): the request bytes (after decompression) and the decoded tensors
//! that every inference request holds, counted across all connections and models until it is answered. A request
//! that would take the server past it is refused at once with a 503 and `Retry-After`, before the rest of its body
//! is read; so however many connections send maximal bodies, what requests hold stays within the budget.
//!
//! The checkpoint reads each inference body through [`Hold::collect`], which holds what it reads, and hands the
//! request's [`Hold`] to its handler; the inference path adds the decoded tensors to it with [`Hold::take`]. A route
//! that decodes a body as it arrives gets it unread ([`Payload::Unread`]) and reads it through [`Hold::meter`],
//! which holds each byte as it is read.

use std::io::Read;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap};
use futures_util::Stream;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::error::{AppError, ErrorKind};

/// Permits are KiB: the budget is counted in whole KiB, each request's share rounded up.
const UNIT: usize = 1024;
/// How long the rest of a refused body is read and thrown away before the refusal is sent.
pub const DISCARD_FOR: Duration = Duration::from_secs(5);

/// The server's budget, shared by every request.
pub struct Budget {
    permits: Arc<Semaphore>,
    total_bytes: usize,
}

/// The permits a budget of `total_bytes` has.
fn units_of(total_bytes: usize) -> usize {
    total_bytes.div_ceil(UNIT).min(Semaphore::MAX_PERMITS)
}

/// What one request holds of the budget, given back when it is dropped (once the request is answered).
pub struct Hold {
    permits: Arc<Semaphore>,
    total_bytes: usize,
    held: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Budget {
    pub fn new(total_bytes: usize) -> Budget {
        Budget { permits: Arc::new(Semaphore::new(units_of(total_bytes))), total_bytes }
    }

    /// A new request's (empty) hold.
    pub fn hold(&self) -> Arc<Hold> {
        Arc::new(Hold { permits: self.permits.clone(), total_bytes: self.total_bytes, held: Mutex::new(None) })
    }

    /// Bytes held across the server now.
    pub fn held_bytes(&self) -> usize {
        (units_of(self.total_bytes) - self.permits.available_permits()) * UNIT
    }
}

impl Hold {
    /// Holds `bytes` more, or refuses the request: the budget is spent by the requests in flight.
    pub fn take(&self, bytes: usize) -> Result<(), AppError> {
        if bytes == 0 {
            return Ok(());
        }
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let already = held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        if already.saturating_add(units as usize) > units_of(self.total_bytes) {
            // Retrying would never help: this request alone is past the budget.
            return Err(AppError::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "the request and its decoded tensors hold more than the server's whole in-flight budget of {} MiB \
                     (--max-inflight-bytes)",
                    self.total_bytes >> 20
                ),
            ));
        }
        let permit = self.permits.clone().try_acquire_many_owned(units).map_err(|_| self.refusal())?;
        match held.as_mut() {
            Some(all) => all.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }

    fn refusal(&self) -> AppError {
        AppError::new(
            ErrorKind::Unavailable,
            format!(
                "the requests in flight hold the server's whole budget of {} MiB (--max-inflight-bytes): retry shortly",
                self.total_bytes >> 20
            ),
        )
    }

    /// Reads `body` whole into memory, holding its bytes as they arrive: a declared `Content-Length` at once (so
    /// that a body too large is refused before any of it is read), the rest as it decompresses. Over
    /// `max_body_bytes` it is a 413, as the extractors say it.
    ///
    /// A refused body is never held. Its client hears the refusal rather than a broken pipe: one that sent
    /// `Expect: 100-continue` never sends the body at all; from any other, what is left of the body is read and
    /// thrown away as it arrives, for at most [`DISCARD_FOR`], before the answer goes.
    pub async fn collect(&self, headers: &HeaderMap, body: Body, max_body_bytes: usize) -> Result<Bytes, AppError> {
        let mut body = body;
        match self.read(headers, &mut body, max_body_bytes).await {
            Ok(bytes) => Ok(bytes),
            Err(refused) => {
                let waits_for_continue =
                    headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                if !waits_for_continue {
                    let discard = async { while let Some(Ok(_)) = body.frame().await {} };
                    let _ = tokio::time::timeout(DISCARD_FOR, discard).await;
                }
                Err(refused)
            }
        }
    }

    async fn read(&self, headers: &HeaderMap, body: &mut Body, max_body_bytes: usize) -> Result<Bytes, AppError> {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|_| !headers.contains_key(header::CONTENT_ENCODING));
        let mut held = 0;
        if let Some(length) = declared {
            if length > max_body_bytes {
                return Err(too_large());
            }
            self.take(length)?;
            held = length;
        }
        let mut data = Vec::with_capacity(declared.unwrap_or(0));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| AppError::bad_request(format!("cannot read the request body: {e}")))?;
            let Ok(chunk) = frame.into_data() else { continue };
            let len = data.len() + chunk.len();
            if len > max_body_bytes {
                return Err(too_large());
            }
            if len > held {
                self.take(len - held)?;
                held = len;
            }
            data.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(data))
    }
}

fn too_large() -> AppError {
    AppError::new(ErrorKind::PayloadTooLarge, "the request body is larger than this server takes (--max-body-bytes)")
}

/// An inference request's body as its handler gets it: read whole by the checkpoint, or left unread for a route that
/// decodes as it reads, where no `Content-Length` bounds the body (a compressed one, inflating as it is read; see
/// [`crate::app::checkpoint::Guard::streams`]).
pub enum Payload {
    Whole(Bytes),
    Unread(Body),
}

/// The checkpoint's mark on a request whose body it left unread.
#[derive(Clone, Copy)]
pub struct Unread;

impl Payload {
    /// The body whole: read now, held and bounded as the checkpoint reads bodies, where it was left unread.
    pub async fn whole(self, hold: &Hold, headers: &HeaderMap, max_body_bytes: usize) -> Result<Bytes, AppError> {
        match self {
            Payload::Whole(bytes) => Ok(bytes),
            Payload::Unread(body) => hold.collect(headers, body, max_body_bytes).await,
        }
    }
}

impl<S: Send + Sync> FromRequest<S> for Payload {
    type Rejection = AppError;

    async fn from_request(request: Request, _: &S) -> Result<Self, Self::Rejection> {
        if request.extensions().get::<Unread>().is_some() {
            return Ok(Payload::Unread(request.into_body()));
        }
        // Read already, within --max-body-bytes, by the checkpoint.
        axum::body::to_bytes(request.into_body(), usize::MAX)
            .await
            .map(Payload::Whole)
            .map_err(|e| AppError::bad_request(format!("cannot read the request body: {e}")))
    }
}

type BodyStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// A body read as it arrives, on a blocking thread: each byte held in the budget as it is read, and no more than
/// `--max-body-bytes` read. Reading past either fails, and the refusal is kept in `refused`.
pub struct Metered {
    reader: SyncIoBridge<StreamReader<BodyStream, Bytes>>,
    hold: Arc<Hold>,
    read: usize,
    held: usize,
    max_body_bytes: usize,
    pub refused: Option<AppError>,
}

impl Hold {
    /// A reader of `body` for a blocking thread (see [`Metered`]); made on the async runtime, whose handle it keeps.
    pub fn meter(self: &Arc<Self>, body: Body, max_body_bytes: usize) -> Metered {
        let stream: BodyStream = Box::pin(BodyExt::map_err(body, std::io::Error::other).into_data_stream());
        Metered {
            reader: SyncIoBridge::new(StreamReader::new(stream)),
            hold: self.clone(),
            read: 0,
            held: 0,
            max_body_bytes,
            refused: None,
        }
    }
}

impl Metered {
    /// Reads what is left of a refused body and throws it away, for at most [`DISCARD_FOR`], so that its client
    /// hears the refusal rather than a broken pipe (as [`Hold::collect`] does).
    pub async fn discard(self) {
        let mut rest = self.reader.into_inner();
        let _ = tokio::time::timeout(DISCARD_FOR, tokio::io::copy(&mut rest, &mut tokio::io::sink())).await;
    }

    fn refuse(&mut self, refusal: AppError) -> std::io::Error {
        let message = refusal.to_string();
        self.refused = Some(refusal);
        std::io::Error::other(message)
    }
}

impl Read for Metered {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.reader.read(buf)?;
        self.read += n;
        if self.read > self.max_body_bytes {
            return Err(self.refuse(too_large()));
        }
        if self.read > self.held {
            // Whole units, so that reads of a few bytes are not each rounded up.
            let more = (self.read - self.held).div_ceil(UNIT) * UNIT;
            if let Err(refusal) = self.hold.take(more) {
                return Err(self.refuse(refusal));
            }
            self.held += more;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_add_up_and_come_back_when_dropped() {
        let budget = Budget::new(10 * UNIT);
        let a = budget.hold();
        a.take(3 * UNIT).expect("fits");
        a.take(1).expect("rounded up to a unit");
        let b = budget.hold();
        b.take(6 * UNIT).expect("fits: 4 + 6");
        let c = budget.hold();
        let refused = c.take(1).expect_err("the budget is spent");
        assert!(refused.to_string().contains("--max-inflight-bytes"), "{refused}");
        assert_eq!(budget.held_bytes(), 10 * UNIT);
        drop(a);
        c.take(4 * UNIT).expect("a's share came back");
        drop((b, c));
        assert_eq!(budget.held_bytes(), 0);
    }

    #[test]
    fn a_request_past_the_whole_budget_is_too_large_not_told_to_retry() {
        let budget = Budget::new(10 * UNIT);
        let a = budget.hold();
        a.take(6 * UNIT).expect("fits");
        let refused = a.take(5 * UNIT).expect_err("11 units of 10");
        assert_eq!(refused.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE, "{refused}");
        let other = budget.hold();
        let busy = other.take(5 * UNIT).expect_err("6 held, 5 more do not fit now");
        assert_eq!(busy.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE, "{busy}");
        drop(a);
        other.take(5 * UNIT).expect("fits once a is answered");
    }

    /// A body that never sends anything: reading it would hang.
    struct Never;

    impl hyper::body::Body for Never {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
            std::task::Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_declared_length_over_the_budget_is_refused_before_the_body_is_read() {
        let budget = Budget::new(8 * UNIT);
        let busy = budget.hold();
        busy.take(6 * UNIT).expect("fits");
        let hold = budget.hold();
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, (4 * UNIT).into());
        // A client that waits for 100 Continue before it sends its body: none of it is read.
        headers.insert(header::EXPECT, axum::http::HeaderValue::from_static("100-continue"));
        let err = hold.collect(&headers, Body::new(Never), 1 << 20).await.expect_err("refused at once");
        assert_eq!(err.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        // More than the whole budget: never servable, so not "retry".
        headers.insert(header::CONTENT_LENGTH, (16 * UNIT).into());
        let err = hold.collect(&headers, Body::new(Never), 1 << 20).await.expect_err("refused at once");
        assert_eq!(err.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        headers.insert(header::CONTENT_LENGTH, (2 << 20).into());
        let err = hold.collect(&headers, Body::new(Never), 1 << 20).await.expect_err("413");
        assert_eq!(err.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn an_undeclared_body_is_held_as_it_arrives_and_refused_once_over() {
        let budget = Budget::new(8 * UNIT);
        let hold = budget.hold();
        let body = Body::from(vec![7u8; 6 * UNIT]);
        let bytes = hold.collect(&HeaderMap::new(), body, 1 << 20).await.expect("fits");
        assert_eq!(bytes.len(), 6 * UNIT);
        let other = budget.hold();
        let err = other.collect(&HeaderMap::new(), Body::from(vec![0u8; 3 * UNIT]), 1 << 20).await.expect_err("over");
        assert_eq!(err.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    }
}
