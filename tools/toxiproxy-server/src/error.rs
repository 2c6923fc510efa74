//! Errors in the shape Toxiproxy's API returns them: `{"error": "...", "status": N}`.
//!
//! The messages copy Toxiproxy 2.x's wording so that clients which match on
//! them (or on the status code) behave as they do against the Go server.

use serde_json::{json, Value};
use std::fmt;

/// An error that becomes one HTTP response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request_body(detail: impl fmt::Display) -> Self {
        Self::new(400, format!("bad request body: {detail}"))
    }

    pub fn missing_field(field: impl fmt::Display) -> Self {
        Self::new(400, format!("missing required field: {field}"))
    }

    pub fn proxy_not_found() -> Self {
        Self::new(404, "proxy not found")
    }

    pub fn proxy_exists() -> Self {
        Self::new(409, "proxy already exists")
    }

    pub fn invalid_stream() -> Self {
        Self::new(
            400,
            "stream was invalid, can be either upstream or downstream",
        )
    }

    pub fn invalid_toxic_type(detail: impl fmt::Display) -> Self {
        Self::new(400, format!("invalid toxic type: {detail}"))
    }

    pub fn toxic_exists() -> Self {
        Self::new(409, "toxic already exists")
    }

    pub fn toxic_not_found() -> Self {
        Self::new(404, "toxic not found")
    }

    pub fn internal(detail: impl fmt::Display) -> Self {
        Self::new(500, detail.to_string())
    }

    pub fn to_json(&self) -> Value {
        json!({"error": self.message, "status": self.status})
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}
