//! Translation between Toxiproxy's toxic JSON and the `noxious` library's `Toxic`.
//!
//! The library's serde form differs from Toxiproxy's wire form (it writes
//! `direction` where Toxiproxy writes `stream`, requires every attribute,
//! and has no `attributes` object for `noop`), so requests and responses go
//! through this module instead of straight through serde. Toxiproxy fills
//! absent attributes with zero; so does this module.
//!
//! `reset_peer`, which the library lacks, is the library's `timeout` toxic (timeout 0:
//! hold and discard) plus the server's own reset (`crate::reset`); [`ApiToxic`] keeps
//! which toxic is which, so the API shows it as Toxiproxy does.

use crate::error::ApiError;
use crate::fields;
use noxious::toxic::{StreamDirection, Toxic, ToxicKind};
use serde_json::{Map, Value};

/// Toxic types the library can run, with their attribute names.
const KINDS: &[(&str, &[&str])] = &[
    ("noop", &[]),
    ("latency", &["latency", "jitter"]),
    ("timeout", &["timeout"]),
    ("bandwidth", &["rate"]),
    ("slow_close", &["delay"]),
    ("slicer", &["average_size", "size_variation", "delay"]),
    ("limit_data", &["bytes"]),
];

const RESET_PEER: &str = "reset_peer";

/// A toxic as the API knows it: what the library runs, and for `reset_peer` the
/// milliseconds after which the server resets each connection.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiToxic {
    pub toxic: Toxic,
    pub reset_after_ms: Option<u64>,
}

impl ApiToxic {
    pub fn name(&self) -> &str {
        &self.toxic.name
    }
}

fn attribute_names(type_name: &str) -> Result<&'static [&'static str], ApiError> {
    if let Some((_, names)) = KINDS.iter().find(|(name, _)| *name == type_name) {
        return Ok(names);
    }
    Err(ApiError::invalid_toxic_type(format!("{type_name:?}")))
}

/// The toxic as Toxiproxy serves it.
pub fn to_json(api: &ApiToxic) -> Value {
    let toxic = &api.toxic;
    let (type_name, attributes) = match api.reset_after_ms {
        Some(ms) => (RESET_PEER.to_owned(), serde_json::json!({"timeout": ms})),
        None => (
            toxic.kind.get_name().to_owned(),
            Value::Object(attributes_of(&toxic.kind)),
        ),
    };
    let mut out = Map::new();
    out.insert("name".into(), Value::from(toxic.name.clone()));
    out.insert("type".into(), Value::from(type_name));
    out.insert("stream".into(), Value::from(toxic.direction.to_string()));
    out.insert("toxicity".into(), toxicity_json(toxic.toxicity));
    out.insert("attributes".into(), attributes);
    Value::Object(out)
}

/// `reset_peer`'s `timeout` attribute: milliseconds, 0 or more.
fn reset_timeout(attrs: &Map<String, Value>) -> Result<u64, ApiError> {
    match attrs.get("timeout") {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            ApiError::bad_request_body(format!(
                "reset_peer timeout must be a whole number of milliseconds >= 0, got {n}"
            ))
        }),
        Some(other) => Err(ApiError::bad_request_body(format!(
            "reset_peer timeout must be a number, got {other}"
        ))),
    }
}

/// The server resets every connection it sees, so a reset that spares some is not offered.
fn reset_toxicity(toxicity: f32) -> Result<f32, ApiError> {
    if toxicity < 1.0 {
        return Err(ApiError::bad_request_body(
            "reset_peer supports toxicity 1 only (every connection is reset)",
        ));
    }
    Ok(toxicity)
}

/// What the library runs for a `reset_peer`: a timeout toxic that holds and discards the stream.
fn hold_kind() -> ToxicKind {
    ToxicKind::Timeout { timeout: 0 }
}

/// Write the `f32` toxicity the way it was given (0.3, not 0.30000001192092896),
/// as Go does for a float32.
fn toxicity_json(toxicity: f32) -> Value {
    toxicity
        .to_string()
        .parse::<f64>()
        .map(Value::from)
        .unwrap_or_else(|_| Value::from(toxicity))
}

fn attributes_of(kind: &ToxicKind) -> Map<String, Value> {
    match serde_json::to_value(kind) {
        Ok(Value::Object(mut tagged)) => match tagged.remove("attributes") {
            Some(Value::Object(attrs)) => attrs,
            _ => Map::new(),
        },
        _ => Map::new(),
    }
}

/// Build the library's kind from a type name and (possibly partial) attributes.
fn kind_from(type_name: &str, given: &Map<String, Value>) -> Result<ToxicKind, ApiError> {
    let names = attribute_names(type_name)?;
    if names.is_empty() {
        return Ok(ToxicKind::Noop);
    }
    let mut attrs = Map::new();
    for name in names {
        let value = given.get(*name).cloned().unwrap_or(Value::from(0));
        attrs.insert((*name).to_owned(), value);
    }
    let tagged = serde_json::json!({"type": type_name, "attributes": attrs});
    let kind: ToxicKind = serde_json::from_value(tagged).map_err(ApiError::bad_request_body)?;
    check_kind(&kind)?;
    Ok(kind)
}

/// Reject attribute combinations on which the library would spin or overflow.
fn check_kind(kind: &ToxicKind) -> Result<(), ApiError> {
    match *kind {
        ToxicKind::Latency { latency, jitter } if jitter > latency => {
            Err(ApiError::bad_request_body(format!(
                "latency jitter ({jitter}) must not exceed latency ({latency})"
            )))
        }
        ToxicKind::Slicer { average_size: 0, .. } => Err(ApiError::bad_request_body(
            "slicer average_size must be greater than 0",
        )),
        ToxicKind::Slicer {
            average_size,
            size_variation,
            ..
        } if size_variation >= average_size => Err(ApiError::bad_request_body(format!(
            "slicer size_variation ({size_variation}) must be less than average_size ({average_size})"
        ))),
        _ => Ok(()),
    }
}

fn attributes_field(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    match body.get("attributes") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(attrs)) => Ok(attrs.clone()),
        Some(other) => Err(ApiError::bad_request_body(format!(
            "attributes must be an object, got {other}"
        ))),
    }
}

fn toxicity_field(body: &Map<String, Value>, default: f32) -> Result<f32, ApiError> {
    match body.get("toxicity") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if (0.0..=1.0).contains(&t) => Ok(t as f32),
            _ => Err(ApiError::bad_request_body(format!(
                "toxicity must be between 0 and 1, got {n}"
            ))),
        },
        Some(other) => Err(ApiError::bad_request_body(format!(
            "toxicity must be a number, got {other}"
        ))),
    }
}

/// A new toxic from a `POST /proxies/{proxy}/toxics` body, with Toxiproxy's defaults.
pub fn parse_new(body: Value) -> Result<ApiToxic, ApiError> {
    let body = fields::object(&body)?;
    let stream = fields::string(body, "stream")?.unwrap_or_else(|| "downstream".into());
    let direction = match stream.to_ascii_lowercase().as_str() {
        "downstream" => StreamDirection::Downstream,
        "upstream" => StreamDirection::Upstream,
        _ => return Err(ApiError::invalid_stream()),
    };
    let type_name = fields::string(body, "type")?.unwrap_or_default();
    let name = fields::string(body, "name")?.unwrap_or_default();
    if type_name == RESET_PEER {
        let ms = reset_timeout(&attributes_field(body)?)?;
        let toxic = Toxic {
            kind: hold_kind(),
            name: if name.is_empty() {
                format!("{RESET_PEER}_{direction}")
            } else {
                name
            },
            toxicity: reset_toxicity(toxicity_field(body, 1.0)?)?,
            direction,
        };
        return Ok(ApiToxic {
            toxic,
            reset_after_ms: Some(ms),
        });
    }
    let kind = kind_from(&type_name, &attributes_field(body)?)?;
    let mut toxic = Toxic {
        kind,
        name,
        toxicity: toxicity_field(body, 1.0)?,
        direction,
    };
    toxic.set_default_name();
    Ok(ApiToxic {
        toxic,
        reset_after_ms: None,
    })
}

/// The toxic after a `POST /proxies/{proxy}/toxics/{toxic}` body.
///
/// As in Toxiproxy, only `attributes` (merged into the current ones) and
/// `toxicity` change; name, type and stream stay.
pub fn parse_update(api: &ApiToxic, body: Value) -> Result<ApiToxic, ApiError> {
    let body = fields::object(&body)?;
    let current = &api.toxic;
    if let Some(ms) = api.reset_after_ms {
        let mut attrs = Map::new();
        attrs.insert("timeout".into(), Value::from(ms));
        attrs.extend(attributes_field(body)?);
        return Ok(ApiToxic {
            toxic: Toxic {
                toxicity: reset_toxicity(toxicity_field(body, current.toxicity)?)?,
                ..current.clone()
            },
            reset_after_ms: Some(reset_timeout(&attrs)?),
        });
    }
    let mut attrs = attributes_of(&current.kind);
    attrs.extend(attributes_field(body)?);
    Ok(ApiToxic {
        toxic: Toxic {
            kind: kind_from(current.kind.get_name(), &attrs)?,
            name: current.name.clone(),
            toxicity: toxicity_field(body, current.toxicity)?,
            direction: current.direction,
        },
        reset_after_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_match_toxiproxy() {
        let toxic = parse_new(json!({"type": "latency", "attributes": {"latency": 50}}))
            .unwrap()
            .toxic;
        assert_eq!(toxic.name, "latency_downstream");
        assert_eq!(toxic.direction, StreamDirection::Downstream);
        assert_eq!(toxic.toxicity, 1.0);
        assert_eq!(
            toxic.kind,
            ToxicKind::Latency {
                latency: 50,
                jitter: 0
            }
        );
    }

    #[test]
    fn wire_form_uses_stream_and_attributes() {
        let toxic = parse_new(json!({"type": "noop", "stream": "UPSTREAM", "name": "n"})).unwrap();
        assert_eq!(toxic.reset_after_ms, None);
        assert_eq!(
            to_json(&toxic),
            json!({"name": "n", "type": "noop", "stream": "upstream",
                   "toxicity": 1.0, "attributes": {}})
        );
    }

    #[test]
    fn toxicity_keeps_its_decimal_form() {
        let toxic = parse_new(json!({"type": "noop", "toxicity": 0.3})).unwrap();
        assert_eq!(to_json(&toxic)["toxicity"], json!(0.3));
    }

    #[test]
    fn update_merges_attributes() {
        let toxic = parse_new(json!({"type": "slicer",
            "attributes": {"average_size": 10, "size_variation": 2}}))
        .unwrap();
        let updated = parse_update(&toxic, json!({"attributes": {"delay": 7}})).unwrap();
        assert_eq!(
            updated.toxic.kind,
            ToxicKind::Slicer {
                average_size: 10,
                size_variation: 2,
                delay: 7
            }
        );
    }

    #[test]
    fn reset_peer_is_a_held_stream_the_server_resets() {
        let toxic =
            parse_new(json!({"type": "reset_peer", "attributes": {"timeout": 250}})).unwrap();
        assert_eq!(toxic.reset_after_ms, Some(250));
        assert_eq!(toxic.toxic.kind, ToxicKind::Timeout { timeout: 0 });
        assert_eq!(
            to_json(&toxic),
            json!({"name": "reset_peer_downstream", "type": "reset_peer", "stream": "downstream",
                   "toxicity": 1.0, "attributes": {"timeout": 250}})
        );
        let bare = parse_new(json!({"type": "reset_peer", "stream": "upstream"})).unwrap();
        assert_eq!(bare.reset_after_ms, Some(0));
        assert_eq!(bare.toxic.name, "reset_peer_upstream");
        let updated = parse_update(&toxic, json!({"attributes": {"timeout": 0}})).unwrap();
        assert_eq!(updated.reset_after_ms, Some(0));
        for bad in [
            json!({"type": "reset_peer", "toxicity": 0.5}),
            json!({"type": "reset_peer", "attributes": {"timeout": -1}}),
            json!({"type": "reset_peer", "attributes": {"timeout": "soon"}}),
        ] {
            assert_eq!(parse_new(bad).unwrap_err().status, 400);
        }
        assert_eq!(
            parse_update(&toxic, json!({"toxicity": 0.2}))
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn rejects_what_the_library_cannot_run() {
        assert_eq!(parse_new(json!({"type": "bogus"})).unwrap_err().status, 400);
        assert_eq!(
            parse_new(json!({"type": "slicer"})).unwrap_err().status,
            400
        );
        let err = parse_new(json!({"type": "noop", "stream": "sideways"})).unwrap_err();
        assert_eq!(err, ApiError::invalid_stream());
        let err = parse_new(json!({"type": "timeout", "attributes": {"timeout": -1}}));
        assert_eq!(err.unwrap_err().status, 400);
    }
}
