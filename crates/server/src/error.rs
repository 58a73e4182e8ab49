//! The HTTP layer's one error type, the one table from error kind to status code, and the error body every
//! route answers with.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferd_batcher::BatchError;
use inferd_models::TaskError;
use serde::Serialize;

use crate::codec::CodecError;

/// What went wrong, as far as the client needs to know: it decides the status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The client's request is wrong.
    BadRequest,
    /// No API key, or a wrong one.
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    /// The body, or what it holds, is over the server's limits.
    PayloadTooLarge,
    /// The model's queue is full: come back shortly.
    Overloaded,
    /// Not ready, draining, or timed out.
    Unavailable,
    /// The request's deadline passed before it was served: a 503 over HTTP, `DEADLINE_EXCEEDED` over gRPC.
    DeadlineExceeded,
    /// Our fault.
    Internal,
}

impl ErrorKind {
    /// The table: each kind's status code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The same table over gRPC: each kind's status code.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorKind::BadRequest => tonic::Code::InvalidArgument,
            ErrorKind::Unauthorized => tonic::Code::Unauthenticated,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::MethodNotAllowed => tonic::Code::Unimplemented,
            ErrorKind::PayloadTooLarge | ErrorKind::Overloaded => tonic::Code::ResourceExhausted,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            ErrorKind::Internal => tonic::Code::Internal,
        }
    }
}

/// An error answer: its kind and the message the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    pub kind: ErrorKind,
    pub message: String,
}

impl AppError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AppError { kind, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::NotFound, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::Internal, message)
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The same error as a task's step sees it (the in-flight budget refusing a decoded picture, say), so that it
    /// comes back out as itself.
    pub fn into_task_error(self) -> TaskError {
        match self.kind {
            ErrorKind::BadRequest => TaskError::Invalid(self.message),
            ErrorKind::PayloadTooLarge => TaskError::OverLimit(self.message),
            ErrorKind::Unavailable | ErrorKind::Overloaded => TaskError::Busy(self.message),
            _ => TaskError::Internal(self.message),
        }
    }

    /// The same error, its message saying which model it concerns.
    pub fn in_model(self, model: &str) -> Self {
        AppError { kind: self.kind, message: format!("model `{model}`: {}", self.message) }
    }
}

impl From<CodecError> for AppError {
    fn from(e: CodecError) -> Self {
        let kind = match e {
            CodecError::Invalid(_) => ErrorKind::BadRequest,
            CodecError::OverLimit(_) => ErrorKind::PayloadTooLarge,
            CodecError::Encode(_) | CodecError::Answer(_) => ErrorKind::Internal,
        };
        AppError::new(kind, e.to_string())
    }
}

impl From<TaskError> for AppError {
    fn from(e: TaskError) -> Self {
        let kind = match e {
            TaskError::Invalid(_) => ErrorKind::BadRequest,
            TaskError::OverLimit(_) => ErrorKind::PayloadTooLarge,
            TaskError::Busy(_) => ErrorKind::Unavailable,
            TaskError::Internal(_) => ErrorKind::Internal,
        };
        AppError::new(kind, e.to_string())
    }
}

impl From<BatchError> for AppError {
    fn from(e: BatchError) -> Self {
        let kind = match e {
            BatchError::QueueFull { .. } => ErrorKind::Overloaded,
            BatchError::Unavailable(_) => ErrorKind::Unavailable,
            BatchError::DeadlineExceeded => ErrorKind::DeadlineExceeded,
            BatchError::InvalidInput(_) => ErrorKind::BadRequest,
            BatchError::Engine(_) => ErrorKind::Internal,
        };
        AppError::new(kind, e.to_string())
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

impl From<AppError> for tonic::Status {
    fn from(e: AppError) -> Self {
        if e.kind == ErrorKind::Internal {
            tracing::warn!(error = %e.message, "request failed");
        }
        tonic::Status::new(e.kind.grpc_code(), e.message)
    }
}

/// Every error answer's body.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, and usually how to fix it.
    pub error: String,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        self.respond(|message| ErrorBody { error: message })
    }
}

impl AppError {
    /// The error's answer with the body a protocol's clients expect, made from the message: the status and the
    /// headers are the same on every protocol.
    pub fn respond<B: Serialize>(self, body: impl FnOnce(String) -> B) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self.message, "request failed");
        }
        let kind = self.kind;
        let mut response = (status, Json(body(self.message))).into_response();
        if matches!(kind, ErrorKind::Overloaded | ErrorKind::Unavailable | ErrorKind::DeadlineExceeded) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if kind == ErrorKind::Unauthorized {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The answers an inference route gives besides success, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
pub enum InferErrors {
    /// Malformed JSON, a wrong input or output name, shape or data type, a number out of range, JSON nested too
    /// deep, or an input the engine refused.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// An API key is configured and the request carries none, or a wrong one.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// No such model (or model version).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The body, its tensor elements or its rows are over the server's limits.
    #[response(status = 413)]
    PayloadTooLarge(ErrorBody),
    /// The model's queue is full; retry after `Retry-After` seconds.
    #[response(status = 429)]
    Overloaded(ErrorBody),
    /// The model is not ready, the server is draining, or the request's deadline passed in the queue.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}
