//! The Toxiproxy 2.x HTTP API: routing, bodies and status codes.

use crate::error::ApiError;
use crate::store::{ProxySpec, Store};
use crate::toxics;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, SERVER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::Mutex;

/// The Toxiproxy API version this server answers on `GET /version`.
pub const API_VERSION: &str = "2.1.4";

/// Bodies larger than this are refused; proxy lists are small.
const MAX_BODY: usize = 1 << 20;

pub type Shared = Arc<Mutex<Store>>;

enum Reply {
    Json(StatusCode, Value),
    Text(StatusCode, String),
    Empty,
}

fn ok(value: Value) -> Result<Reply, ApiError> {
    Ok(Reply::Json(StatusCode::OK, value))
}

async fn read_json(req: Request<Incoming>) -> Result<Value, ApiError> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(ApiError::bad_request_body)?
        .to_bytes();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request_body("EOF"));
    }
    serde_json::from_slice(&body).map_err(ApiError::bad_request_body)
}

/// Decode `%XX` escapes in one path segment.
fn decode_segment(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn not_found() -> ApiError {
    ApiError::new(404, "not found")
}

fn method_not_allowed() -> ApiError {
    ApiError::new(405, "method not allowed")
}

async fn route(store: &Shared, req: Request<Incoming>) -> Result<Reply, ApiError> {
    let path = req.uri().path().to_owned();
    let segments: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(decode_segment)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = req.method().clone();
    match (segments.as_slice(), &method) {
        (["version"], &Method::GET) => Ok(Reply::Text(StatusCode::OK, API_VERSION.to_owned())),
        (["version"], _) => Err(method_not_allowed()),
        (["reset"], &Method::POST) => {
            store.lock().await.reset().await?;
            Ok(Reply::Empty)
        }
        (["reset"], _) => Err(method_not_allowed()),
        (["populate"], &Method::POST) => populate(store, read_json(req).await?).await,
        (["populate"], _) => Err(method_not_allowed()),
        (["proxies"], &Method::GET) => ok(store.lock().await.to_json()),
        (["proxies"], &Method::POST) => {
            let spec = ProxySpec::parse(&read_json(req).await?, None)?;
            let mut store = store.lock().await;
            let proxy = store.create(&spec).await?;
            Ok(Reply::Json(StatusCode::CREATED, proxy.to_json()))
        }
        (["proxies"], _) => Err(method_not_allowed()),
        (["proxies", name], &Method::GET) => ok(store.lock().await.get(name)?.to_json()),
        (["proxies", name], &Method::POST | &Method::PATCH) => {
            let body = read_json(req).await?;
            let mut store = store.lock().await;
            let proxy = store.get_mut(name)?;
            proxy.update(&body).await?;
            ok(proxy.to_json())
        }
        (["proxies", name], &Method::DELETE) => {
            store.lock().await.delete(name).await?;
            Ok(Reply::Empty)
        }
        (["proxies", _], _) => Err(method_not_allowed()),
        (["proxies", name, "toxics"], &Method::GET) => {
            ok(store.lock().await.get(name)?.toxics_json())
        }
        (["proxies", name, "toxics"], &Method::POST) => {
            let body = read_json(req).await?;
            let mut store = store.lock().await;
            let proxy = store.get_mut(name)?;
            let toxic = toxics::parse_new(body)?;
            ok(toxics::to_json(proxy.add_toxic(toxic).await?))
        }
        (["proxies", _, "toxics"], _) => Err(method_not_allowed()),
        (["proxies", name, "toxics", toxic], &Method::GET) => {
            ok(toxics::to_json(store.lock().await.get(name)?.toxic(toxic)?))
        }
        (["proxies", name, "toxics", toxic], &Method::POST | &Method::PATCH) => {
            let body = read_json(req).await?;
            let mut store = store.lock().await;
            let proxy = store.get_mut(name)?;
            let updated = toxics::parse_update(proxy.toxic(toxic)?, body)?;
            ok(toxics::to_json(proxy.update_toxic(updated).await?))
        }
        (["proxies", name, "toxics", toxic], &Method::DELETE) => {
            store
                .lock()
                .await
                .get_mut(name)?
                .remove_toxic(toxic)
                .await?;
            Ok(Reply::Empty)
        }
        (["proxies", _, "toxics", _], _) => Err(method_not_allowed()),
        _ => Err(not_found()),
    }
}

/// Parse a populate list (also the `--config` file format).
pub fn parse_proxy_list(body: &Value) -> Result<Vec<ProxySpec>, ApiError> {
    let Value::Array(items) = body else {
        return Err(ApiError::bad_request_body(format!(
            "expected a JSON array of proxies, got {body}"
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| ProxySpec::parse(item, Some(i + 1)))
        .collect()
}

async fn populate(store: &Shared, body: Value) -> Result<Reply, ApiError> {
    let specs = parse_proxy_list(&body)?;
    let (proxies, error) = store.lock().await.populate(&specs).await;
    Ok(match error {
        None => Reply::Json(StatusCode::CREATED, json!({ "proxies": proxies })),
        Some(err) => {
            let mut value = err.to_json();
            value["proxies"] = Value::Array(proxies);
            let status =
                StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Reply::Json(status, value)
        }
    })
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    if !content_type.is_empty() {
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    resp.headers_mut().insert(
        SERVER,
        HeaderValue::from_static(concat!(
            "brokerchaos-toxiproxy/",
            env!("CARGO_PKG_VERSION"),
            " (noxious 1.0.4, patched)"
        )),
    );
    resp
}

/// Answer one request; never fails, errors become JSON error bodies.
pub async fn handle(
    store: Shared,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let reply = route(&store, req).await.unwrap_or_else(|err| {
        let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Reply::Json(status, err.to_json())
    });
    Ok(match reply {
        Reply::Json(status, value) => {
            response(status, "application/json", Bytes::from(value.to_string()))
        }
        Reply::Text(status, text) => response(status, "text/plain", Bytes::from(text)),
        Reply::Empty => response(StatusCode::NO_CONTENT, "", Bytes::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_percent_escapes() {
        assert_eq!(decode_segment("a%2Fb%20c"), "a/b c");
        assert_eq!(decode_segment("plain"), "plain");
        assert_eq!(decode_segment("bad%zz%4"), "bad%zz%4");
    }
}
