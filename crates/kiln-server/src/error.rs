//! Every error the server answers with, OpenAI-shaped
//! (`{"error":{"message","type","param","code"}}`), mapped to its HTTP
//! status in this one place.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_runtime::engine::{EngineError, SubmitError};
use serde_json::json;

/// An error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: a bad value in the request.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 400 naming the field at fault.
    pub fn param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            code: Some("invalid_value"),
            ..ApiError::invalid(message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn with_status(mut self, status: StatusCode, kind: &'static str) -> Self {
        self.status = status;
        self.kind = kind;
        self
    }

    pub fn unauthorized() -> Self {
        ApiError::invalid("invalid or missing API key: send 'Authorization: Bearer KEY'")
            .with_status(StatusCode::UNAUTHORIZED, "authentication_error")
            .with_code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::invalid(message).with_status(StatusCode::NOT_FOUND, "not_found_error")
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError::invalid(format!(
            "the request body exceeds the limit of {limit} bytes"
        ))
        .with_status(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error")
        .with_code("request_too_large")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::invalid(message).with_status(StatusCode::SERVICE_UNAVAILABLE, "server_error")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::invalid(message).with_status(StatusCode::INTERNAL_SERVER_ERROR, "server_error")
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Busy { .. } => ApiError::invalid(e.to_string())
                .with_status(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error")
                .with_code("rate_limit_exceeded"),
            SubmitError::Loading => ApiError::unavailable(e.to_string()).with_code("model_loading"),
            SubmitError::Stopped(_) => ApiError::unavailable(e.to_string()),
            SubmitError::Invalid(_) => ApiError::invalid(e.to_string()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Invalid(m) => ApiError::invalid(m),
            EngineError::Step(_) => ApiError::internal(e.to_string()),
            EngineError::ShuttingDown => ApiError::unavailable(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // Retry once a step or two has freed a place.
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
