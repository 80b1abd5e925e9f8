//! The JSON body of a `/v1` route, read as axum's `Json` reads it, but with an error that names
//! the field a wrong value is in, as OpenAI's own errors do. serde names no field: a value in a
//! flattened struct (every field of [`Common`](super::wire::Common)) reads as "invalid value:
//! integer `-3`, expected usize at line 1 column 80", the column being the body's end. When a
//! body does not fit its type, each of its fields is tried alone in the least body that does
//! ([`Shape::least`]); the first that fails there is named. That costs nothing on a body that
//! reads.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// A request body type, with the least body of it that reads.
pub trait Shape: DeserializeOwned {
    /// The required fields, each with a value that reads; every other field may be absent.
    fn least() -> Value;
}

/// A body of type `T` ([`read`]); its rejection is the message to answer with.
pub struct Body<T>(pub T);

/// Why a body was not read: a message naming what is wrong, answered as each route answers a
/// bad request.
pub struct BodyError(pub String);

/// As the `/v1` routes answer it, should a route not map it itself.
impl axum::response::IntoResponse for BodyError {
    fn into_response(self) -> axum::response::Response {
        crate::error::bad(self.0).into_response()
    }
}

impl<S: Send + Sync, T: Shape> FromRequest<S> for Body<T> {
    type Rejection = BodyError;

    async fn from_request(request: Request, state: &S) -> Result<Self, BodyError> {
        if !declares_json(request.headers()) {
            return Err(BodyError(
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|e| BodyError(e.body_text()))?;
        read(&bytes).map(Body).map_err(BodyError)
    }
}

/// Whether the headers declare a JSON body, as axum's `Json` asks: `application/json` or
/// `application/*+json`, parameters allowed.
fn declares_json(headers: &HeaderMap) -> bool {
    use crate::http::gate::{is_json, media_type};
    let value = headers.get(header::CONTENT_TYPE).map(|v| v.to_str());
    matches!(value, Some(Ok(text)) if is_json(&media_type(text)))
}

/// `bytes` read as a `T`; a value that does not fit names its field.
pub fn read<T: Shape>(bytes: &[u8]) -> Result<T, String> {
    match Json::<T>::from_bytes(bytes) {
        Ok(Json(body)) => Ok(body),
        Err(axum::extract::rejection::JsonRejection::JsonDataError(e)) => {
            Err(blame::<T>(bytes).unwrap_or_else(|| e.body_text()))
        }
        Err(e) => Err(e.body_text()),
    }
}

/// The first field of the body that does not read alone in [`Shape::least`], named with
/// serde's message; none when the body is no object or every field reads alone (a required
/// field is missing).
fn blame<T: Shape>(bytes: &[u8]) -> Option<String> {
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    let Value::Object(least) = T::least() else {
        return None;
    };
    fields.into_iter().find_map(|(key, value)| {
        let mut probe = least.clone();
        probe.insert(key.clone(), value);
        T::deserialize(&Value::Object(probe))
            .err()
            .map(|e| format!("{key}: {e}"))
    })
}

impl Shape for super::wire::ChatRequest {
    fn least() -> Value {
        json!({"model": "", "messages": []})
    }
}

impl Shape for super::wire::CompletionRequest {
    fn least() -> Value {
        json!({"model": "", "prompt": ""})
    }
}

impl Shape for super::wire::TokenizeRequest {
    fn least() -> Value {
        json!({"model": ""})
    }
}

impl Shape for super::wire::DetokenizeRequest {
    fn least() -> Value {
        json!({"model": "", "tokens": []})
    }
}

impl Shape for super::batch::runs::CreateBatch {
    fn least() -> Value {
        json!({"input_file_id": "", "endpoint": "", "completion_window": ""})
    }
}

impl Shape for super::embeddings::EmbeddingsRequest {
    fn least() -> Value {
        json!({"model": "", "input": ""})
    }
}

impl Shape for super::scores::ScoreBody {
    fn least() -> Value {
        json!({"text_1": "", "text_2": ""})
    }
}

impl Shape for super::scores::RerankBody {
    fn least() -> Value {
        json!({"query": "", "documents": []})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::wire::{ChatRequest, CompletionRequest};
    use serde::Deserialize;

    /// A body type of two levels of flattening, as `ChatRequest`'s.
    #[derive(Debug, Deserialize)]
    struct Probe {
        #[serde(flatten)]
        inner: Inner,
        name: String,
    }

    #[derive(Debug, Deserialize)]
    struct Inner {
        count: Option<usize>,
        #[serde(flatten)]
        _rest: serde_json::Map<String, Value>,
    }

    impl Shape for Probe {
        fn least() -> Value {
            json!({"name": ""})
        }
    }

    fn chat(body: &str) -> String {
        read::<ChatRequest>(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn a_wrong_value_in_a_flattened_field_is_named() {
        let message = chat(r#"{"model": "m", "messages": [], "max_tokens": -3}"#);
        assert!(message.starts_with("max_tokens: "), "{message}");
        assert!(message.contains("-3"), "{message}");
        let message = chat(r#"{"model": "m", "messages": [], "temperature": "hot"}"#);
        assert!(message.starts_with("temperature: "), "{message}");
        let message = chat(r#"{"model": "m", "messages": [], "stop": 5}"#);
        assert!(message.starts_with("stop: "), "{message}");
        let message = chat(r#"{"model": "m", "messages": [], "guided_choice": "a"}"#);
        assert!(message.starts_with("guided_choice: "), "{message}");
        let message = chat(r#"{"model": "m", "messages": [], "stream_options": {"x": 1}}"#);
        assert!(message.starts_with("stream_options: "), "{message}");
        assert!(message.contains("`x`"), "{message}");
    }

    #[test]
    fn a_wrong_required_field_is_named() {
        let message = chat(r#"{"model": 7, "messages": []}"#);
        assert!(message.starts_with("model: "), "{message}");
        let message = chat(r#"{"model": "m", "messages": [{"content": "hi"}]}"#);
        assert!(message.starts_with("messages: "), "{message}");
        assert!(message.contains("role"), "{message}");
        let message = read::<CompletionRequest>(br#"{"model": "m", "prompt": 3.5}"#).unwrap_err();
        assert!(message.starts_with("prompt: "), "{message}");
    }

    #[test]
    fn a_missing_field_and_bad_json_keep_serdes_message() {
        let message = chat(r#"{"model": "m"}"#);
        assert!(message.contains("missing field `messages`"), "{message}");
        let message = chat(r#"{"model": "m", "#);
        assert!(message.contains("EOF"), "{message}");
        let message = chat("[1, 2]");
        assert!(message.contains("expected"), "{message}");
    }

    #[test]
    fn a_body_that_reads_is_read_whole() {
        let body = read::<ChatRequest>(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "user": "u"}"#,
        )
        .unwrap();
        assert_eq!(body.common.max_tokens, Some(3));
        assert_eq!(body.messages.len(), 1);
        assert!(body.common.rest.contains_key("user"));
        let probe = read::<Probe>(br#"{"name": "a", "count": 2}"#).unwrap();
        assert_eq!((probe.name.as_str(), probe.inner.count), ("a", Some(2)));
        let message = read::<Probe>(br#"{"name": "a", "count": -1}"#).unwrap_err();
        assert!(message.starts_with("count: "), "{message}");
    }

    #[test]
    fn json_is_declared_as_axum_asks() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
            declares_json(&headers)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/vnd.api+json"));
        assert!(!with("text/plain"));
        assert!(!with("application/octet-stream"));
        assert!(!declares_json(&HeaderMap::new()));
    }
}
