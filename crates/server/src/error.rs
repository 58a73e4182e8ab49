//! The one error type of the HTTP layer, and the one place that decides each error's status code.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferd_batcher::BatchError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The client's request is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// No API key, or a wrong one.
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The model's queue is full: come back shortly.
    #[error("{0}")]
    Overloaded(String),
    /// Not ready, draining, or timed out in the queue.
    #[error("{0}")]
    Unavailable(String),
    /// Our fault.
    #[error("{0}")]
    Internal(String),
}

impl AppError {
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AppError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            AppError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<BatchError> for AppError {
    fn from(e: BatchError) -> Self {
        let message = e.to_string();
        match e {
            BatchError::QueueFull { .. } => AppError::Overloaded(message),
            BatchError::Unavailable(_) | BatchError::DeadlineExceeded => AppError::Unavailable(message),
            BatchError::InvalidInput(_) => AppError::BadRequest(message),
            BatchError::Engine(_) => AppError::Internal(message),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        }
        let mut response = (status, Json(serde_json::json!({ "error": self.to_string() }))).into_response();
        if matches!(self, AppError::Overloaded(_) | AppError::Unavailable(_)) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, AppError::Unauthorized(_)) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
