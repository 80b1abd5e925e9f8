//! KServe v2 HTTP handlers. Each one extracts, converts with `kserve`, asks the model manager,
//! and converts back.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use sheaf_core::{ErrorKind, InferError, Readiness};

use crate::error::ApiError;
use crate::forward::Forwarded;
use crate::kserve::{codec, metadata, HEADER_CONTENT_LENGTH};
use crate::AppState;

/// `{model}` and, on the `/versions/{version}/` routes, `{version}`.
#[derive(Debug, Deserialize)]
pub struct ModelPath {
    pub(crate) model: String,
    #[serde(default)]
    pub(crate) version: Option<String>,
}

pub async fn live() -> StatusCode {
    StatusCode::OK
}

pub async fn ready(State(state): State<AppState>) -> StatusCode {
    if state.ready_checked().await {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub async fn server_metadata(State(state): State<AppState>) -> Json<Value> {
    Json(metadata::server(&state.id))
}

/// `GET /v2/logging`: the log settings (Triton's logging extension).
pub async fn log_settings() -> Json<Value> {
    Json(log_settings_json())
}

/// `POST /v2/logging`: changes the settings the body names, all or none; answers with every
/// setting.
pub async fn update_log_settings(body: Bytes) -> Result<Json<Value>, ApiError> {
    use crate::logging::Setting;
    let request = json_body(&body, "log settings")?;
    let Some(changes) = request.as_object() else {
        return Err(
            sheaf_core::InferError::invalid("the log settings must be a JSON object").into(),
        );
    };
    let mut settings = Vec::with_capacity(changes.len());
    for (name, value) in changes {
        let setting = match value {
            Value::Bool(b) => Setting::Bool(*b),
            Value::String(s) => Setting::Text(s.as_str().into()),
            Value::Number(n) => match n.as_u64() {
                Some(n) => Setting::Number(n),
                None => {
                    return Err(sheaf_core::InferError::invalid(format!(
                        "log setting '{name}' takes a whole number of 0 or more, not {n}"
                    ))
                    .into())
                }
            },
            other => {
                return Err(sheaf_core::InferError::invalid(format!(
                    "log setting '{name}' takes a value, not {other}"
                ))
                .into())
            }
        };
        settings.push((name.as_str(), setting));
    }
    crate::logging::update(settings)?;
    Ok(Json(log_settings_json()))
}

fn log_settings_json() -> Value {
    use crate::logging::Setting;
    let settings = crate::logging::current()
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                Setting::Bool(b) => json!(b),
                Setting::Number(n) => json!(n),
                Setting::Text(t) => json!(t),
            };
            (name.to_string(), value)
        })
        .collect::<serde_json::Map<_, _>>();
    Value::Object(settings)
}

/// `GET /v2/trace/setting`: the server's trace settings (Triton's trace extension).
pub async fn trace_settings(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    trace_settings_json(&state, None)
}

/// `POST /v2/trace/setting`: changes the server's trace settings the body names, all or none.
pub async fn update_trace_settings(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    change_trace_settings(&state, None, &body)
}

/// `GET /v2/models/{m}/trace/setting`: the trace settings in force for a model.
pub async fn model_trace_settings(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<Json<Value>, ApiError> {
    trace_settings_json(&state, Some(&p.model))
}

/// `POST /v2/models/{m}/trace/setting`: changes a model's own trace settings (null: back to
/// the server's).
pub async fn update_model_trace_settings(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    change_trace_settings(&state, Some(&p.model), &body)
}

fn change_trace_settings(
    state: &AppState,
    model: Option<&str>,
    body: &[u8],
) -> Result<Json<Value>, ApiError> {
    use sheaf_core::trace::Change;
    let request = json_body(body, "trace settings")?;
    let Some(asked) = request.as_object() else {
        return Err(InferError::invalid("the trace settings must be a JSON object").into());
    };
    let mut changes = Vec::with_capacity(asked.len());
    for (name, value) in asked {
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let change = match value {
            Value::Null => Some(Change::Clear),
            Value::Array(values) => values
                .iter()
                .map(text)
                .collect::<Option<Vec<_>>>()
                .map(Change::Set),
            one => text(one).map(|v| Change::Set(vec![v])),
        };
        let Some(change) = change else {
            return Err(InferError::invalid(format!(
                "trace setting '{}' takes a string, a list of strings or null, not {value}",
                sheaf_core::clip(name)
            ))
            .into());
        };
        changes.push((name.clone(), change));
    }
    crate::trace::update(state, model, &changes)?;
    trace_settings_json(state, model)
}

/// The settings as Triton's JSON gives them: the level a list, the others a string each.
fn trace_settings_json(state: &AppState, model: Option<&str>) -> Result<Json<Value>, ApiError> {
    let settings = crate::trace::settings(state, model)?
        .into_iter()
        .map(|(name, mut values)| {
            let value = match name {
                "trace_level" => json!(values),
                _ => json!(values.pop().unwrap_or_default()),
            };
            (name.to_string(), value)
        })
        .collect::<serde_json::Map<_, _>>();
    Ok(Json(Value::Object(settings)))
}

pub async fn model_metadata(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<Json<Value>, ApiError> {
    let m = state.manager.metadata(&p.model, p.version.as_deref())?;
    Ok(Json(metadata::model(&m)))
}

/// 200 when ready, 503 with the reason when known but not ready, 404 when unknown.
pub async fn model_ready(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<StatusCode, ApiError> {
    match state
        .manager
        .readiness_checked(&p.model, p.version.as_deref())
        .await?
    {
        Readiness::Ready => Ok(StatusCode::OK),
        Readiness::NotReady(reason) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason)),
    }
}

pub async fn infer(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let header_length = match headers.get(HEADER_CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "Inference-Header-Content-Length must be a non-negative integer",
                    )
                })?,
        ),
    };
    let forwarded = Forwarded::from_http(state.forward_http.as_ref(), &headers)?;
    let handle = match state
        .manager
        .get_or_load(&p.model, p.version.as_deref())
        .await
    {
        Ok(handle) => handle,
        // A model served elsewhere: the queue's workers answer it.
        Err(e) if e.kind == ErrorKind::ModelNotFound => match &state.broker {
            Some(broker) if wants_events(&headers) => {
                let broker = broker.clone();
                return forward_events(state.clone(), broker, p, body, header_length, forwarded)
                    .await;
            }
            Some(broker) => {
                let sequence = codec::sequence_of(&body, header_length)?;
                let answer = broker
                    .forward(
                        &p.model,
                        p.version.as_deref(),
                        body,
                        header_length,
                        sequence.as_ref(),
                        &forwarded,
                    )
                    .await;
                let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
                return Ok(tensor_body(status, answer.body, answer.header_length));
            }
            None => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    };
    let sent = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let mut decoded = codec::decode_request(body, header_length, &state.shm)?;
    // Tensors decoded from JSON (or copied from shared memory), not slices of the body the
    // gate holds, are held too while the request runs.
    let _decoded = state
        .request_memory
        .hold(decoded_bytes(&decoded.request, sent))
        .map_err(|full| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, full.to_string()))?;
    if handle.is_generator() {
        let events = wants_events(&headers);
        return super::generate_text::infer(&state, &handle, &decoded.request, events).await;
    }
    forwarded.add_to(&mut decoded.request)?;
    crate::trace::prepare(&state, &mut decoded.request);
    if wants_events(&headers) && state.manager.streams(&handle).await {
        return infer_events(state, handle, decoded.request).await;
    }
    let mut response = state.manager.infer(&handle, decoded.request).await?;
    crate::trace::sample(&state, &mut response, sheaf_core::trace::Protocol::Http);
    let encoded = codec::encode_response(&response, &decoded.binary, &state.shm)?;
    let mut http = tensor_body(StatusCode::OK, encoded.body, encoded.header_length);
    // The account closes once the body is written (see crate::stages).
    if let Some(receipt) = response.receipt.take() {
        http.extensions_mut().insert(receipt);
    }
    Ok(http)
}

/// Whether the client asks for server-sent events (`Accept: text/event-stream`).
fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// A streaming model's responses as server-sent events: each a KServe JSON response (`data:`)
/// as it comes, an error as an `error` event, and the stream closed with the request. A request
/// refused before its first response (bad input, a full queue) gets a plain HTTP error.
async fn infer_events(
    state: AppState,
    handle: std::sync::Arc<sheaf_core::ModelHandle>,
    request: sheaf_core::RawRequest,
) -> Result<Response, ApiError> {
    use axum::response::sse::Event;
    use futures::StreamExt;
    let work = admit_stream(&state)?;
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(16);
    // The events are formed on a task of its own, which holds the model and the drain's
    // account of the request until the stream ends.
    tokio::spawn(async move {
        let json_only = codec::BinaryOutputs {
            default: false,
            by_name: Vec::new(),
            shm: Vec::new(),
        };
        let mut responses = match state.manager.infer_stream(&handle, request).await {
            Ok(r) => {
                let _ = started_tx.send(Ok(()));
                r
            }
            Err(e) => {
                let _ = started_tx.send(Err(e));
                return;
            }
        };
        while let Some(response) = responses.next().await {
            let event = response
                .and_then(|r| codec::encode_response(&r, &json_only, &state.shm))
                .map(|encoded| Event::default().data(String::from_utf8_lossy(&encoded.body)))
                .unwrap_or_else(|e| {
                    Event::default()
                        .event("error")
                        .data(json!({ "error": e.message }).to_string())
                });
            if tx.send(Ok(event)).await.is_err() {
                break;
            }
        }
        drop(work);
    });
    events_once_started(started, rx).await
}

/// The events a stream's task sends on `rx`, as server-sent events, once the task says the
/// stream started; the error it sends instead of starting as a plain HTTP error.
pub(crate) async fn events_once_started(
    started: tokio::sync::oneshot::Receiver<Result<(), sheaf_core::InferError>>,
    rx: tokio::sync::mpsc::Receiver<Result<axum::response::sse::Event, std::convert::Infallible>>,
) -> Result<Response, ApiError> {
    use axum::response::sse::{KeepAlive, Sse};
    match started.await {
        Ok(Ok(())) => Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
            .keep_alive(KeepAlive::default())
            .into_response()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the stream stopped before it started",
        )),
    }
}

/// A request that asks for a stream, for a model the queue's workers serve (see
/// [`crate::broker::message`]): a streaming model's responses as server-sent events, as
/// [`infer_events`] gives them; any other model's answer, or a refusal, as a plain response.
async fn forward_events(
    state: AppState,
    broker: std::sync::Arc<crate::broker::Broker>,
    p: ModelPath,
    body: Bytes,
    header_length: Option<usize>,
    forwarded: Forwarded,
) -> Result<Response, ApiError> {
    use crate::broker::gateway::Forwarded as Sent;
    use axum::response::sse::{Event, KeepAlive, Sse};
    let work = admit_stream(&state)?;
    let version = p.version.as_deref();
    let mut answers = match broker
        .forward_stream(&p.model, version, body, header_length, &forwarded)
        .await
    {
        Sent::Stream(answers) => answers,
        Sent::Once(answer) => {
            let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
            return Ok(tensor_body(status, answer.body, answer.header_length));
        }
    };
    let event = |answer: crate::broker::message::Answer| {
        let data = String::from_utf8_lossy(&answer.body).into_owned();
        match answer.status {
            200 => Event::default().data(data),
            _ => Event::default().event("error").data(data),
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(16);
    tokio::spawn(async move {
        while let Some(answer) = answers.recv().await {
            if tx.send(Ok(event(answer))).await.is_err() {
                break;
            }
        }
        drop(work);
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Admits a stream of events as work of its own, which it holds until the stream ends: a
/// drain waits for it.
pub(crate) fn admit_stream(state: &AppState) -> Result<crate::drain::InFlight, ApiError> {
    state.drain.admit().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
    })
}

/// An inference answer: JSON, or JSON followed by binary tensors.
fn tensor_body(status: StatusCode, body: Bytes, header_length: Option<usize>) -> Response {
    let mut http = (status, body).into_response();
    let headers = http.headers_mut();
    match header_length {
        Some(n) => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(HEADER_CONTENT_LENGTH, HeaderValue::from(n));
        }
        None => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    http
}

/// `GET /v2/models/{m}/config`: Triton's model configuration JSON.
pub async fn model_config(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<Json<Value>, ApiError> {
    let handle = state.manager.get(&p.model, p.version.as_deref())?;
    let signature = state.manager.signature_of(&handle);
    Ok(Json(metadata::model_config(&handle, &signature).to_json()))
}

/// `GET /v2/models/{m}/stats`, `/v2/models/{m}/versions/{v}/stats`.
pub async fn model_stats(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
) -> Result<Json<Value>, ApiError> {
    stats_of(&state, &p.model, p.version.as_deref())
}

/// `GET /v2/models/stats`: every ready model.
pub async fn all_stats(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    stats_of(&state, "", None)
}

fn stats_of(state: &AppState, model: &str, version: Option<&str>) -> Result<Json<Value>, ApiError> {
    let entries: Vec<Value> = state
        .manager
        .statistics(model, version)?
        .iter()
        .map(metadata::model_stats)
        .collect();
    Ok(Json(json!({ "model_stats": entries })))
}

/// `GET /`: the live dashboard, one self-contained page.
pub async fn dashboard() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("dashboard.html"))
}

/// `GET /stats`: server, device and model figures (seed 001's shape).
pub async fn server_stats(State(state): State<AppState>) -> Json<Value> {
    Json(super::stats::document(&state.manager))
}

/// `GET /metrics` on the metrics port: Prometheus text exposition format 0.0.4.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut body = state.manager.encode_metrics();
    state.request_memory.render(&mut body);
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Bytes of `request`'s inputs that are not slices of the body at the addresses `sent`: those
/// decoded from JSON `data`, or copied in.
fn decoded_bytes(request: &sheaf_core::request::RawRequest, sent: std::ops::Range<usize>) -> usize {
    let outside = |data: &Bytes| !sent.contains(&(data.as_ptr() as usize));
    let tensors = request.inputs.iter().map(|i| i.tensor.data());
    let texts = request.byte_inputs.iter().flat_map(|b| b.items.iter());
    tensors
        .chain(texts)
        .filter(|d| outside(d))
        .map(Bytes::len)
        .sum()
}

/// `POST /v2/repository/index`: every model with its state (`{"ready": true}` lists only
/// ready ones).
pub async fn repository_index(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let filter: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?
    };
    let only_ready = filter["ready"].as_bool().unwrap_or(false);
    let index: Vec<Value> = state
        .manager
        .index(only_ready)
        .into_iter()
        .map(|m| {
            let mut entry = json!({
                "name": m.name, "version": m.version, "state": m.state.as_str(),
                "platform": m.platform,
            });
            if let Some(reason) = m.reason {
                entry["reason"] = json!(reason);
            }
            if !m.devices.is_empty() {
                entry["devices"] = json!(m.devices);
            }
            entry
        })
        .collect();
    Ok(Json(Value::Array(index)))
}

/// `POST /v2/repository/models/{m}/load`: loads the model from its folder (again, when it is
/// loaded), with the configuration the body gives, or from the files it sends.
pub async fn repository_load(
    State(state): State<AppState>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request = json_body(&body, "load")?;
    use crate::kserve::repository::LoadValue;
    let params = request["parameters"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.iter())
        .map(|(k, v)| {
            let value = v.as_str().map_or(LoadValue::Other, LoadValue::Text);
            (k.as_str(), value)
        });
    let asked = crate::kserve::repository::load_parameters(params)?;
    if let Some(why) = crate::kserve::repository::files_refused(&state.access, &asked) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, why));
    }
    crate::kserve::repository::load(&state.manager, &model, asked).await?;
    Ok(Json(json!({})))
}

/// A repository or log settings request's JSON body (none: `{}`).
fn json_body(body: &[u8], what: &str) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the {what} request is not JSON: {e}"),
        )
    })
}

/// `POST /v2/repository/models/{m}/unload`: answers once the model's requests are done. With
/// `{"parameters": {"unload_dependents": true}}`, a pipeline's step models go too.
pub async fn repository_unload(
    State(state): State<AppState>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let dependents = unload_dependents(&body)?;
    crate::kserve::repository::unload(&state.manager, &model, dependents).await?;
    Ok(Json(json!({})))
}

/// The `unload_dependents` parameter of an unload request's body (none: false).
fn unload_dependents(body: &[u8]) -> Result<bool, ApiError> {
    match &json_body(body, "unload")?["parameters"]["unload_dependents"] {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => {
            Err(crate::kserve::repository::unload_dependents_not_bool(&other.to_string()).into())
        }
    }
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint")
}

pub async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("this endpoint does not take {method}"),
    )
}
