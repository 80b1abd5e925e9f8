//! The checks every HTTP request passes before its handler runs, in this order:
//! 1. the key its route's [`Scope`] needs (401 / 403), and the header of a restricted API group
//!    that holds the route's category ([`crate::restricted`], 403);
//! 2. for a POST, that no browser page on another site sent it (403), unless the server allows
//!    that site's origin ([`super::Cors`]), and that its body is declared as JSON, binary
//!    tensors, or not at all (415): a cross-site form can send neither. The one form taken is
//!    an upload to `POST /v1/files` (OpenAI's Files API is multipart), which the origin check
//!    above still guards;
//! 3. for a POST, admission through the [`crate::drain::Drain`] (503 once a shutdown began). The
//!    admitted request's guard rides in its response body, so a stream counts until its end;
//! 4. for a POST, its whole body, no longer than the limit (413, from its `Content-Length` when
//!    it declares one) and within the body timeout (408), however slowly it trickles in; a
//!    compressed one inflated, within the same limit ([`super::encoding`]). Its bytes are held
//!    in the server's [`crate::request_memory`] (503 past `--max-request-memory`): the declared
//!    length before any of it is read, a chunked body's as it arrives, and the inflated size;
//!    the hold, like the admission's guard, rides in the response body.
//!
//! A refusal sent before the body was read leaves the body to be read and dropped in the
//! background ([`unread`]), so that a client still uploading reads the refusal rather than a
//! reset connection, and may send its next request on the same connection.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::access::{Denied, Scope};
use crate::drain::InFlight;
use crate::error::{ApiError, OpenAiError};
use crate::request_memory::Held;
use crate::restricted::Api;
use crate::AppState;

/// The API category of a request on the main HTTP port, by its method and path, in Triton's
/// words ([`Api`]); `None` for the dashboard's page (a POST there is TEI's embeddings).
pub fn api(method: &Method, path: &str) -> Option<Api> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(match segments.as_slice() {
        [""] if matches!(*method, Method::GET | Method::HEAD) => return None,
        [""] => Api::Inference,
        // TEI's description of its model.
        ["v2"] | ["info"] => Api::Metadata,
        ["v2", "health", ..] | ["ping"] | ["health"] => Api::Health,
        ["v2", "repository", ..] => Api::ModelRepository,
        ["stats"] | ["v2", "models", "stats"] => Api::Statistics,
        ["v2", "trace", ..] => Api::Trace,
        ["v2", "logging"] => Api::Logging,
        ["v2", "systemsharedmemory" | "cudasharedmemory", ..] => Api::SharedMemory,
        // SageMaker's multi-model endpoint: loads, lists and unloads; invoke is inference.
        ["models"] | ["models", _] => Api::ModelRepository,
        ["v2", "models", _, rest @ ..] => {
            let route = match rest {
                ["versions", _, route @ ..] => route,
                route => route,
            };
            match route {
                [] => Api::Metadata,
                ["ready"] => Api::Health,
                ["config"] => Api::ModelConfig,
                ["stats"] => Api::Statistics,
                ["trace", ..] => Api::Trace,
                _ => Api::Inference,
            }
        }
        _ => Api::Inference,
    })
}

/// The key scope of a path on the main HTTP port, whose category is `api`.
pub fn scope(path: &str, api: Option<Api>) -> Scope {
    match api {
        // `/` is the dashboard's page, which holds no data: it asks for the admin key itself.
        None => Scope::Open,
        // A model's readiness names the model, so it takes the key its metadata takes.
        Some(Api::Health) if path.starts_with("/v2/models/") => Scope::Inference,
        Some(api) => Scope::of(api),
    }
}

/// What the main port's checks need.
#[derive(Clone)]
pub struct Gate {
    pub state: AppState,
    pub body_timeout: std::time::Duration,
    pub max_body_bytes: usize,
    /// The origins whose pages may send POSTs.
    pub cors: Option<std::sync::Arc<super::Cors>>,
}

/// The main port's checks (module docs).
pub async fn gate(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let state = &gate.state;
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path();
    let openai = openai_shaped(path);
    // A refusal before the body is read leaves it to be read and dropped (see [`unread`]).
    let refuse_unread = |body: Body, status: StatusCode, message: &str| {
        unread(body, gate.body_timeout, refusal(openai, status, message))
    };
    let api = api(&parts.method, path);
    let authorization = authorization(&parts.headers);
    if let Err(denied) = state.access.check(scope(path, api), authorization) {
        return unread(body, gate.body_timeout, denial(openai, denied));
    }
    if let Some(api) = api {
        let header = |name: &str| parts.headers.get(name).map(HeaderValue::as_bytes);
        if let Err(why) = state.access.http_restricted.check(api, header) {
            return refuse_unread(body, StatusCode::FORBIDDEN, &why);
        }
    }
    if matches!(parts.method, Method::GET | Method::HEAD) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    if let Some(why) = cross_site(&parts.headers) {
        let origin = parts.headers.get(header::ORIGIN);
        let allowed = gate
            .cors
            .as_deref()
            .zip(origin)
            .is_some_and(|(cors, origin)| cors.allows(origin));
        if !allowed {
            return refuse_unread(body, StatusCode::FORBIDDEN, &why);
        }
    }
    if let Some(why) = unsupported_content_type(&parts.headers, parts.uri.path()) {
        return refuse_unread(body, StatusCode::UNSUPPORTED_MEDIA_TYPE, &why);
    }
    let Some(guard) = state.drain.admit() else {
        return refuse_unread(
            body,
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down; send the request to another replica",
        );
    };
    // A declared length is refused or held before any of the body is read, so that the client
    // learns at once instead of after uploading.
    let limit = gate.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        let (status, message) = over_limit(format!("request body of {n} bytes"), limit);
        return refuse_unread(body, status, &message);
    }
    // A body another gate of this server holds already is read, not counted again.
    let counted = parts.extensions.remove::<HeldAlready>().is_some();
    let mut held = state.request_memory.nothing();
    if let Some(Err(full)) = declared
        .filter(|_| !counted)
        .map(|n| held.grow_to(n as usize))
    {
        let (status, message) = overloaded(full);
        return refuse_unread(body, status, &message);
    }
    let read = async {
        match declared {
            // hyper ends the body at its declared length, which is held.
            Some(_) => read_declared(body, limit).await,
            None if counted => read_declared(body, limit).await,
            None => read_pieces(body, limit, &mut held).await,
        }
    };
    let body = match within(gate.body_timeout, read).await {
        Ok(bytes) => bytes,
        Err((status, message)) => return refusal(openai, status, &message),
    };
    let body = if parts.headers.contains_key(header::CONTENT_ENCODING) {
        match super::encoding::decompress(&parts.headers, body, gate.max_body_bytes).await {
            Ok(plain) => {
                // The inflated body is held in the compressed one's place.
                if let Err(full) = held.grow_to(if counted { 0 } else { plain.len() }) {
                    let (status, message) = overloaded(full);
                    return refusal(openai, status, &message);
                }
                // The routes read it as sent plain.
                parts.headers.remove(header::CONTENT_ENCODING);
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, plain.len().into());
                plain
            }
            Err((status, message)) => {
                let mut refused = refusal(openai, status, &message);
                if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
                    let accepted = HeaderValue::from_static(super::encoding::ACCEPTED);
                    refused
                        .headers_mut()
                        .insert(header::ACCEPT_ENCODING, accepted);
                }
                return refused;
            }
        }
    } else {
        body
    };
    let request = Request::from_parts(parts, Body::from(body));
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Guarded {
            body,
            _guard: (guard, held),
        }),
    )
}

/// A body of a declared length, whole.
async fn read_declared(body: Body, limit: usize) -> Result<Bytes, (StatusCode, String)> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            over_limit("request body".into(), limit)
        } else {
            unreadable(e)
        }
    })
}

/// `read`, unless the body does not arrive within `timeout` (408), however slowly it trickles.
async fn within(
    timeout: std::time::Duration,
    read: impl std::future::Future<Output = Result<Bytes, (StatusCode, String)>>,
) -> Result<Bytes, (StatusCode, String)> {
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| {
            let message = format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            );
            Err((StatusCode::REQUEST_TIMEOUT, message))
        })
}

/// `refusal`, sent before the request's body was read. The body is read and dropped in the
/// background, for at most `timeout`: a client still sending it then reads the refusal, where
/// a connection closed under its upload would be reset, and it would see that instead.
fn unread(body: Body, timeout: std::time::Duration, refusal: Response) -> Response {
    if !body.is_end_stream() {
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            let mut body = body;
            let _ = tokio::time::timeout(timeout, async {
                while let Some(Ok(_)) = body.frame().await {}
            })
            .await;
        });
    }
    refusal
}

/// A body sent without a length, piece by piece: each piece is held before it is kept.
async fn read_pieces(
    mut body: Body,
    limit: usize,
    held: &mut Held,
) -> Result<Bytes, (StatusCode, String)> {
    use http_body_util::BodyExt;
    let mut kept = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(piece) = frame.map_err(unreadable)?.into_data() else {
            continue; // trailers
        };
        let total = kept.len() + piece.len();
        if total > limit {
            return Err(over_limit("request body".into(), limit));
        }
        held.grow_to(total).map_err(overloaded)?;
        kept.extend_from_slice(&piece);
    }
    Ok(kept.freeze())
}

fn over_limit(what: String, limit: usize) -> (StatusCode, String) {
    let message = format!("{what} is over the length limit of {limit} bytes");
    (StatusCode::PAYLOAD_TOO_LARGE, message)
}

fn unreadable(e: impl std::fmt::Display) -> (StatusCode, String) {
    let message = format!("cannot read the request body: {e}");
    (StatusCode::BAD_REQUEST, message)
}

fn overloaded(full: crate::request_memory::Full) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, full.to_string())
}

/// The metrics port's check: `/metrics` needs the admin key when so configured.
pub async fn metrics_gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.access.protect_metrics {
        let authorization = authorization(request.headers());
        if let Err(denied) = state.access.check(Scope::Admin, authorization) {
            return denial(false, denied);
        }
    }
    next.run(request).await
}

/// The `Authorization` header's bytes.
fn authorization(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
}

fn denial(openai: bool, denied: Denied) -> Response {
    let status = match denied {
        Denied::Unauthenticated => StatusCode::UNAUTHORIZED,
        Denied::NotAdmin => StatusCode::FORBIDDEN,
    };
    let mut response = if openai && status == StatusCode::UNAUTHORIZED {
        let error = OpenAiError::new(status, denied.message());
        error.code(crate::error::INVALID_API_KEY).into_response()
    } else {
        refusal(openai, status, denied.message())
    };
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// Whether the route answers errors in OpenAI's shape: under `/v1/`, and vLLM's routes outside
/// it (`/tokenize`, `/detokenize`, `/score`, `/rerank`, and `/v2/rerank`, Cohere's).
fn openai_shaped(path: &str) -> bool {
    path.starts_with("/v1/")
        || matches!(
            path,
            "/tokenize" | "/detokenize" | "/score" | "/rerank" | "/v2/rerank"
        )
}

/// An error in the route's protocol: OpenAI's shape where [`openai_shaped`], KServe's elsewhere.
fn refusal(openai: bool, status: StatusCode, message: &str) -> Response {
    if openai {
        OpenAiError::new(status, message).into_response()
    } else {
        ApiError::new(status, message).into_response()
    }
}

/// Why a POST looks like it came from a page on another site, which a browser marks with
/// `Sec-Fetch-Site` and `Origin`. Programs (curl, tritonclient, openai) send neither.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let fetch_site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if fetch_site.eq_ignore_ascii_case("cross-site") || fetch_site.eq_ignore_ascii_case("same-site")
    {
        return Some(format!(
            "requests from web pages of other sites are refused (Sec-Fetch-Site: {fetch_site}); \
             start the server with --cors-allow-origin ORIGIN to let a site's pages call it"
        ));
    }
    let origin = headers.get(header::ORIGIN)?.to_str().unwrap_or("null");
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'))
        .unwrap_or("");
    if origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host) {
        return Some(format!(
            "requests from web pages of other sites are refused (Origin: {}); start the server \
             with --cors-allow-origin ORIGIN to let a site's pages call it",
            sheaf_core::clip(origin)
        ));
    }
    None
}

/// Why the declared body type is refused. A body may be declared JSON (`application/json`,
/// `application/*+json`), binary tensors (`application/octet-stream`), or not at all, as
/// tritonclient sends it; the types an HTML form can send are refused, but for a multipart
/// upload to `/v1/files`.
fn unsupported_content_type(headers: &HeaderMap, path: &str) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?;
    let text = value.to_str().unwrap_or("");
    let media = media_type(text);
    if is_json(&media) || media == "application/octet-stream" {
        return None;
    }
    if path == "/v1/files" && media == "multipart/form-data" {
        return None;
    }
    Some(format!(
        "Content-Type '{}' is not accepted: send JSON as application/json (curl: -H \
         'Content-Type: application/json'), or binary tensors as application/octet-stream",
        sheaf_core::clip(text)
    ))
}

/// The media type of a `Content-Type` value, lowercase, without its parameters.
pub(crate) fn media_type(value: &str) -> String {
    value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a media type ([`media_type`]) is JSON: `application/json` or `application/*+json`.
pub(crate) fn is_json(media: &str) -> bool {
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// Marks a request whose body another gate of this server holds already (a Vertex AI
/// prediction redirected to a route of the main API, [`super::vertex`]): the gate it passes
/// next reads the body without counting its bytes a second time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldAlready;

/// A response body that holds its request's [`InFlight`] guard, and the memory its request
/// holds, until the body is dropped.
struct Guarded {
    body: Body,
    _guard: (InFlight, Held),
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn scopes_of_routes() {
        let scope = |path: &str| scope(path, api(&Method::GET, path));
        assert_eq!(scope("/v2/health/ready"), Scope::Open);
        assert_eq!(scope("/health"), Scope::Open);
        assert_eq!(scope("/"), Scope::Open);
        assert_eq!(
            super::scope("/", api(&Method::POST, "/")),
            Scope::Inference,
            "TEI's embeddings at the root"
        );
        assert_eq!(scope("/v2/models/mlp/infer"), Scope::Inference);
        assert_eq!(scope("/v2/models/mlp"), Scope::Inference);
        assert_eq!(scope("/v1/chat/completions"), Scope::Inference);
        assert_eq!(scope("/v2/models/mlp/stats"), Scope::Admin);
        assert_eq!(scope("/v2/models/mlp/versions/1/stats"), Scope::Admin);
        assert_eq!(scope("/v2/models/stats"), Scope::Admin);
        assert_eq!(scope("/stats"), Scope::Admin);
        assert_eq!(scope("/v2/repository/models/mlp/load"), Scope::Admin);
        assert_eq!(scope("/v2/trace/setting"), Scope::Admin);
        assert_eq!(scope("/v2/models/mlp/trace/setting"), Scope::Admin);
        assert_eq!(scope("/v2/models/mlp/ready"), Scope::Inference);
        assert_eq!(scope("/v2/models/stats/ready"), Scope::Inference);
        assert_eq!(scope("/v2/logging"), Scope::Admin);
    }

    #[test]
    fn categories_of_routes() {
        let cases = [
            ("/v2/health/live", Api::Health),
            ("/ping", Api::Health),
            ("/invocations", Api::Inference),
            ("/v2/models/mlp/ready", Api::Health),
            ("/v2/models/mlp/versions/2/ready", Api::Health),
            ("/v2", Api::Metadata),
            ("/info", Api::Metadata),
            ("/v2/models/mlp", Api::Metadata),
            ("/v2/models/mlp/versions/1", Api::Metadata),
            ("/v2/models/config", Api::Metadata),
            ("/v2/models/mlp/infer", Api::Inference),
            ("/v2/models/mlp/versions/1/infer", Api::Inference),
            ("/v2/models/llm/generate_stream", Api::Inference),
            ("/v1/chat/completions", Api::Inference),
            ("/v1/models", Api::Inference),
            ("/embed", Api::Inference),
            ("/health", Api::Health),
            (
                "/v2/systemsharedmemory/region/a/register",
                Api::SharedMemory,
            ),
            ("/v2/cudasharedmemory/status", Api::SharedMemory),
            ("/v2/models/mlp/config", Api::ModelConfig),
            ("/v2/models/mlp/versions/1/config", Api::ModelConfig),
            ("/v2/repository/index", Api::ModelRepository),
            ("/v2/repository/models/mlp/unload", Api::ModelRepository),
            ("/stats", Api::Statistics),
            ("/v2/models/stats", Api::Statistics),
            ("/v2/models/mlp/stats", Api::Statistics),
            ("/v2/models/mlp/versions/1/stats", Api::Statistics),
            ("/v2/trace/setting", Api::Trace),
            ("/v2/models/mlp/trace/setting", Api::Trace),
            ("/v2/logging", Api::Logging),
            ("/models", Api::ModelRepository),
            ("/models/abc123", Api::ModelRepository),
            ("/models/abc123/invoke", Api::Inference),
            ("/invocations", Api::Inference),
        ];
        for (path, want) in cases {
            assert_eq!(api(&Method::POST, path), Some(want), "{path}");
        }
        assert_eq!(api(&Method::GET, "/"), None);
        assert_eq!(api(&Method::POST, "/"), Some(Api::Inference));
        assert_eq!(api(&Method::GET, "/health"), Some(Api::Health));
    }

    #[test]
    fn browsers_on_other_sites_are_told_apart_from_programs() {
        assert_eq!(cross_site(&headers(&[])), None);
        assert_eq!(
            cross_site(&headers(&[
                ("origin", "http://localhost:8000"),
                ("host", "localhost:8000")
            ])),
            None
        );
        assert_eq!(
            cross_site(&headers(&[("sec-fetch-site", "same-origin")])),
            None
        );
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])).is_some());
        assert!(cross_site(&headers(&[
            ("origin", "https://evil.example"),
            ("host", "localhost:8000")
        ]))
        .is_some());
        assert!(cross_site(&headers(&[("origin", "null"), ("host", "localhost:8000")])).is_some());
    }

    #[test]
    fn form_types_are_refused_and_json_binary_or_none_pass() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.api+json",
            "application/octet-stream",
        ] {
            let h = headers(&[("content-type", ok)]);
            assert_eq!(
                unsupported_content_type(&h, "/v1/completions"),
                None,
                "{ok}"
            );
        }
        assert_eq!(unsupported_content_type(&headers(&[]), "/"), None);
        for bad in [
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/plain",
            "application/xml",
        ] {
            let h = headers(&[("content-type", bad)]);
            assert!(
                unsupported_content_type(&h, "/v1/completions").is_some(),
                "{bad}"
            );
        }
        // A file upload is a form, on its own route alone.
        let h = headers(&[("content-type", "multipart/form-data; boundary=x")]);
        assert_eq!(unsupported_content_type(&h, "/v1/files"), None);
        assert!(unsupported_content_type(&h, "/v1/files/file-1").is_some());
        let h = headers(&[("content-type", "text/plain")]);
        assert!(unsupported_content_type(&h, "/v1/files").is_some());
    }
}
