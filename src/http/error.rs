//! API errors as Kubernetes `Status` objects: the HTTP status, a machine-readable reason,
//! and a message a person can act on. 5xx causes are logged, not shown.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::store;
use crate::types::{FieldErrors, Invalid};

#[derive(Debug)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header (429 when shedding load).
    pub retry_after: Option<u64>,
    /// The Status's `details` (the object and, for 422, every field at fault).
    pub details: Option<serde_json::Value>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            retry_after: None,
            details: None,
        }
    }
    /// 422 naming every field at fault in `details.causes`, as Kubernetes does; kubectl
    /// prints each on its own line under `The <kind> "<name>" is invalid`.
    pub fn invalid_fields(group: &str, kind: &str, name: &str, e: FieldErrors) -> Self {
        let causes: Vec<serde_json::Value> = e
            .errors
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        ApiError {
            details: Some(json!({"name": name, "group": group, "kind": kind, "causes": causes})),
            ..Self::invalid(e.to_string())
        }
    }
    /// 429 with `Retry-After`: the server sheds load; the client should come back.
    pub fn too_many(m: impl Into<String>, retry_after_secs: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after_secs.max(1)),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", m)
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", m)
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFound", m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Conflict", m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", m)
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "a valid bearer token is required (see <data-dir>/initial-admin)",
        )
    }
    pub fn internal(m: impl std::fmt::Display) -> Self {
        tracing::error!(error = %m, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "internal error; see the server log",
        )
    }
}

impl From<store::Error> for ApiError {
    fn from(e: store::Error) -> Self {
        use store::Error as E;
        match &e {
            E::NotFound { .. } => ApiError::not_found(e.to_string()),
            E::AlreadyExists { .. } => {
                ApiError::new(StatusCode::CONFLICT, "AlreadyExists", e.to_string())
            }
            E::Conflict => ApiError::conflict(e.to_string()),
            E::Gone(_) => ApiError::new(StatusCode::GONE, "Expired", e.to_string()),
            E::Invalid(m) => ApiError::invalid(m.clone()),
            E::BadQuery(m) => ApiError::bad_request(m.clone()),
            E::Busy => ApiError::too_many(e.to_string(), 1),
            _ => ApiError::internal(e),
        }
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::invalid(e.0)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(details) = self.details {
            body["details"] = details;
        }
        let mut r = (self.code, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        r
    }
}
