//! Typed reads of JSON request fields, with Toxiproxy's "bad request body" errors.
//!
//! An absent field and an explicit `null` both mean "use the default", as
//! they do for Go's JSON decoder on the other server.

use crate::error::ApiError;
use serde_json::{Map, Value};

pub fn object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    match body {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::bad_request_body(format!(
            "expected a JSON object, got {other}"
        ))),
    }
}

pub fn string(map: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::bad_request_body(format!(
            "{field} must be a string, got {other}"
        ))),
    }
}

pub fn boolean(map: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ApiError::bad_request_body(format!(
            "{field} must be a boolean, got {other}"
        ))),
    }
}
