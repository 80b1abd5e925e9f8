//! Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and
//! `.../generate_stream`, a plain JSON form of an inference request for text models (the form
//! LLM clients such as LangChain's and LiteLLM's Triton providers send).
//!
//! The request is one JSON object. A field that names one of the model's inputs is that input:
//! a string, number or boolean is one element, a list its elements, in the input's declared
//! shape (its batch dimension 1, a variable dimension as long as the elements need). Every
//! other field, and each field of a `parameters` object, is a request parameter (a string,
//! number or boolean), which a Python model reads with `request.parameters()`. The request is
//! then written as a KServe request and decoded as every other one is ([`codec`]), so it is
//! checked, batched and answered on the same path.
//!
//! An answer is one JSON object: `model_name`, `model_version`, and each output by name, one
//! element as itself (a string for BYTES) and several as a list. `/generate` gives the one
//! answer (a streaming model must send exactly one); `/generate_stream` gives each answer as a
//! server-sent event as it comes (one for a model that does not stream), and an error after the
//! first as an event `{"error": ...}`. A request refused before any answer gets a plain HTTP
//! error. A generation model answers both routes as Triton's vLLM backend does
//! ([`super::generate_text`]).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use sheaf_core::{InferError, InferResponse, ModelHandle};
use std::sync::Arc;

use super::generate_text::{self, Route};
use super::handlers::ModelPath;
use crate::error::ApiError;
use crate::kserve::codec;
use crate::AppState;

/// `POST .../generate`: one answer.
pub async fn generate(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    use futures::StreamExt;
    let handle = model(&state, &p).await?;
    if handle.is_generator() {
        return generate_text::answer(&state, &handle, &body, Route::Generate).await;
    }
    let mut request = read(&state, &handle, &headers, &body)?;
    if !state.manager.streams(&handle).await {
        crate::trace::prepare(&state, &mut request);
        let mut response = state.manager.infer(&handle, request).await?;
        crate::trace::sample(&state, &mut response, sheaf_core::trace::Protocol::Http);
        let receipt = response.receipt.take();
        let mut http = Json(answer(&state, &response)?).into_response();
        // The account closes once the body is written (see crate::stages).
        if let Some(receipt) = receipt {
            http.extensions_mut().insert(receipt);
        }
        return Ok(http);
    }
    let _work = super::handlers::admit_stream(&state)?;
    let mut responses = state.manager.infer_stream(&handle, request).await?;
    let mut answers = Vec::with_capacity(1);
    while let Some(response) = responses.next().await {
        answers.push(response?);
    }
    match answers.as_slice() {
        [one] => Ok(Json(answer(&state, one)?).into_response()),
        many => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "generate expects the model to give exactly 1 response, and '{}' gave {}; \
                 use generate_stream for a model that streams",
                handle.name,
                many.len()
            ),
        )),
    }
}

/// `POST .../generate_stream`: each answer as a server-sent event.
pub async fn generate_stream(
    State(state): State<AppState>,
    Path(p): Path<ModelPath>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, Sse};
    use futures::StreamExt;
    let handle = model(&state, &p).await?;
    if handle.is_generator() {
        return generate_text::answer(&state, &handle, &body, Route::Stream).await;
    }
    let mut request = read(&state, &handle, &headers, &body)?;
    let event = |data: Value| Event::default().data(data.to_string());
    if !state.manager.streams(&handle).await {
        crate::trace::prepare(&state, &mut request);
        let mut response = state.manager.infer(&handle, request).await?;
        crate::trace::sample(&state, &mut response, sheaf_core::trace::Protocol::Http);
        let receipt = response.receipt.take();
        let one = event(answer(&state, &response)?);
        let events = futures::stream::iter([Ok::<_, std::convert::Infallible>(one)]);
        let mut http = Sse::new(events).into_response();
        if let Some(receipt) = receipt {
            http.extensions_mut().insert(receipt);
        }
        return Ok(http);
    }
    let work = super::handlers::admit_stream(&state)?;
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(16);
    // The events are formed on a task of its own, which holds the model and the drain's account
    // of the request until the stream ends.
    tokio::spawn(async move {
        let mut responses = match state.manager.infer_stream(&handle, request).await {
            Ok(r) => r,
            Err(e) => {
                let _ = started_tx.send(Err(e));
                return;
            }
        };
        // The status is sent with the first answer: an error before any is a plain error.
        let mut started_tx = Some(started_tx);
        while let Some(response) = responses.next().await {
            let data = match response.and_then(|r| answer(&state, &r)) {
                Ok(data) => data,
                Err(e) => match started_tx.take() {
                    Some(tx) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                    None => json!({ "error": e.message }),
                },
            };
            if let Some(tx) = started_tx.take() {
                let _ = tx.send(Ok(()));
            }
            if tx.send(Ok(event(data))).await.is_err() {
                break;
            }
        }
        // A model that gave no answer: an empty stream.
        if let Some(tx) = started_tx.take() {
            let _ = tx.send(Ok(()));
        }
        drop(work);
    });
    super::handlers::events_once_started(started, rx).await
}

/// The model the path names (loaded first in the `on_demand` control mode).
async fn model(state: &AppState, p: &ModelPath) -> Result<Arc<ModelHandle>, ApiError> {
    Ok(state
        .manager
        .get_or_load(&p.model, p.version.as_deref())
        .await?)
}

/// The request the body asks of the tensor model `handle`, decoded as a KServe request, with
/// the headers the server forwards ([`crate::forward`]).
fn read(
    state: &AppState,
    handle: &ModelHandle,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<sheaf_core::RawRequest, ApiError> {
    let Once(asked) = serde_json::from_slice::<Once<Box<RawValue>>>(body).map_err(|e| {
        InferError::invalid(format!("the generate request is not a JSON object: {e}"))
    })?;
    let kserve = kserve_request(handle, asked)?;
    let body = serde_json::to_vec(&kserve)
        .map_err(|e| InferError::internal(format!("cannot write the request: {e}")))?;
    let mut decoded = codec::decode_request(Bytes::from(body), None, &state.shm)?;
    crate::forward::Forwarded::from_http(state.forward_http.as_ref(), headers)?
        .add_to(&mut decoded.request)?;
    Ok(decoded.request)
}

/// A JSON object's fields in order, each given once: a name given twice is refused rather than
/// all but one of its values dropped (as a map keeps only the last).
pub(crate) struct Once<T>(pub(crate) Vec<(String, T)>);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Once<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = Once<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Once<T>, A::Error> {
                let mut fields: Vec<(String, T)> = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if fields.iter().any(|(n, _)| *n == name) {
                        return Err(serde::de::Error::custom(format!(
                            "'{}' is given twice",
                            sheaf_core::clip(&name)
                        )));
                    }
                    fields.push((name, map.next_value()?));
                }
                Ok(Once(fields))
            }
        }
        d.deserialize_map(Object(std::marker::PhantomData))
    }
}

/// The KServe request a generate request stands for (module docs).
fn kserve_request(
    handle: &ModelHandle,
    asked: Vec<(String, Box<RawValue>)>,
) -> Result<Value, InferError> {
    let mut inputs = Vec::new();
    let mut parameters = Map::new();
    let parameter = |parameters: &mut Map<String, Value>, name: String, value: Value| {
        if matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
            parameters.insert(name, value);
            Ok(())
        } else {
            Err(InferError::invalid(format!(
                "parameter '{}' has invalid type: give a string, a number or a boolean",
                sheaf_core::clip(&name)
            )))
        }
    };
    for (name, value) in asked {
        if name == "parameters" {
            let Once(given) = serde_json::from_str::<Once<Value>>(value.get()).map_err(|e| {
                InferError::invalid(format!("'parameters' must be a JSON object: {e}"))
            })?;
            for (name, value) in given {
                parameter(&mut parameters, name, value)?;
            }
            continue;
        }
        let value: Value = serde_json::from_str(value.get())
            .map_err(|e| InferError::invalid(format!("'{}': {e}", sheaf_core::clip(&name))))?;
        let Some(spec) = handle.signature.inputs.iter().find(|s| s.name == name) else {
            parameter(&mut parameters, name, value)?;
            continue;
        };
        let data = match value {
            Value::Array(items) => items,
            Value::Object(_) | Value::Null => {
                return Err(InferError::invalid(format!(
                    "input '{}' takes a value or a list of values, not an object or null",
                    spec.name
                )))
            }
            one => vec![one],
        };
        let shape = shape_for(&spec.shape, handle.max_batch_size > 0, data.len());
        inputs.push(json!({
            "name": spec.name,
            "shape": shape,
            "datatype": spec.dtype.as_str(),
            "data": data,
        }));
    }
    let mut request = json!({ "inputs": inputs });
    if !parameters.is_empty() {
        request["parameters"] = Value::Object(parameters);
    }
    Ok(request)
}

/// The shape `elements` values take in an input declared `declared`: the batch dimension 1, and
/// the last variable dimension what the elements need beyond the fixed ones (the others 1). A
/// count the fixed dimensions do not divide gives a shape that the request's checks refuse,
/// naming the input.
fn shape_for(declared: &[i64], batched: bool, elements: usize) -> Vec<i64> {
    let mut shape: Vec<i64> = declared.to_vec();
    if batched {
        if let Some(first) = shape.first_mut() {
            *first = 1;
        }
    }
    let fixed: i64 = shape.iter().filter(|&&d| d >= 0).product();
    let last_free = shape.iter().rposition(|&d| d < 0);
    for (i, d) in shape.iter_mut().enumerate() {
        if *d < 0 {
            *d = if Some(i) == last_free && fixed > 0 {
                elements as i64 / fixed
            } else {
                1
            };
        }
    }
    shape
}

/// An answer as the extension gives it: the model, and each output by name.
fn answer(state: &AppState, response: &InferResponse) -> Result<Value, InferError> {
    let json_only = codec::BinaryOutputs::default();
    let encoded = codec::encode_response(response, &json_only, &state.shm)?;
    if encoded.header_length.is_some() {
        return Err(InferError::internal(format!(
            "model '{}' answered with bytes that are not text, which generate cannot carry; \
             use the infer route",
            response.model_name
        )));
    }
    let written: Value = serde_json::from_slice(&encoded.body)
        .map_err(|e| InferError::internal(format!("cannot read the answer back: {e}")))?;
    let mut out = Map::new();
    out.insert("model_name".into(), json!(response.model_name));
    out.insert("model_version".into(), json!(response.model_version));
    for output in written["outputs"].as_array().into_iter().flatten() {
        let Some(name) = output["name"].as_str() else {
            continue;
        };
        let value = match &output["data"] {
            Value::Array(items) if items.len() == 1 => items[0].clone(),
            other => other.clone(),
        };
        out.insert(name.to_string(), value);
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::shape_for;

    #[test]
    fn a_generate_input_takes_its_declared_shape() {
        // Triton's mock LLM: PROMPT [1, 1] without batching.
        assert_eq!(shape_for(&[1, 1], false, 1), [1, 1]);
        // A batched text input: [-1, 1] is one item.
        assert_eq!(shape_for(&[-1, 1], true, 1), [1, 1]);
        // Token ids of any length, batched or not.
        assert_eq!(shape_for(&[-1, -1], true, 5), [1, 5]);
        assert_eq!(shape_for(&[1, -1], false, 3), [1, 3]);
        assert_eq!(shape_for(&[-1, -1, 2], false, 6), [1, 3, 2]);
        // A scalar-per-item input.
        assert_eq!(shape_for(&[-1], true, 1), [1]);
    }
}
