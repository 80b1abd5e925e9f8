//! Request headers forwarded to the model as request parameters (Triton's
//! `--http-header-forward-pattern` and `--grpc-header-forward-pattern`): each HTTP header or
//! gRPC metadata entry whose name the server's pattern matches becomes a string parameter of
//! the request, which a Python model reads with `request.parameters()` as it reads the
//! parameters of the body.
//!
//! The pattern is a regular expression that may match anywhere in the name, without regard to
//! case unless it starts with `(?-i)`; names arrive in lower case (HTTP/2 and gRPC write them
//! so, and the HTTP/1.1 server reads them so). A forwarded header named as a parameter the
//! server reads itself (`priority`, `timeout`, the sequence's, `headers`, any `triton_...`), or
//! as one the body also gives, is a 400 / INVALID_ARGUMENT naming it: a header never changes
//! how the server treats a request, nor silently replaces what the body says.
//!
//! A request a gateway sends through the queue (`--queue`) carries its forwarded headers with
//! it ([`Forwarded::to_json`], the `Sheaf-Forward` message header), and the worker that runs it
//! adds them as the gateway would have: the gateway's pattern decides, wherever the model runs.

use std::sync::Arc;

use sheaf_core::{InferError, RawRequest};

/// A compiled forwarding pattern.
#[derive(Debug, Clone)]
pub struct Pattern(regex::Regex);

impl Pattern {
    /// `pattern`, matched without regard to case (`(?-i)` at its start turns that off).
    pub fn new(pattern: &str) -> Result<Pattern, String> {
        regex::RegexBuilder::new(pattern)
            .case_insensitive(true)
            .build()
            .map(Pattern)
            .map_err(|e| format!("not a regular expression: {e}"))
    }

    /// The `headers` (name, value) whose names match, checked: a name the server reads itself
    /// or a value that is not text is an error naming it.
    pub fn pick<'a>(
        &self,
        headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Forwarded, InferError> {
        let mut picked = Vec::new();
        for (name, value) in headers {
            if !self.0.is_match(name) {
                continue;
            }
            if reserved(name) {
                return Err(InferError::invalid(format!(
                    "header '{}' matches the header forward pattern, but '{}' is a parameter \
                     the server reads itself, which a header does not set",
                    sheaf_core::clip(name),
                    sheaf_core::clip(name)
                )));
            }
            let value = std::str::from_utf8(value).map_err(|_| {
                InferError::invalid(format!(
                    "header '{}' is forwarded to the model as a parameter, and its value is not \
                     UTF-8 text",
                    sheaf_core::clip(name)
                ))
            })?;
            picked.push((name.to_string(), value.to_string()));
        }
        Ok(Forwarded(picked))
    }
}

/// Whether a parameter named `name` is one the server reads itself or Triton reserves.
fn reserved(name: &str) -> bool {
    sheaf_core::request::RESERVED.contains(&name)
        || name == "headers"
        || name.starts_with("triton_")
}

/// The headers one request (or one gRPC stream's requests) forwards.
#[derive(Debug, Clone, Default)]
pub struct Forwarded(Vec<(String, String)>);

impl Forwarded {
    /// The headers `pattern` picks from `headers`; none without a pattern.
    pub fn from_http(
        pattern: Option<&Pattern>,
        headers: &axum::http::HeaderMap,
    ) -> Result<Forwarded, InferError> {
        match pattern {
            None => Ok(Forwarded::default()),
            Some(p) => p.pick(headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))),
        }
    }

    /// The metadata entries `pattern` picks from `metadata` (its text entries); none without a
    /// pattern.
    pub fn from_grpc(
        pattern: Option<&Pattern>,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Forwarded, InferError> {
        use tonic::metadata::KeyAndValueRef;
        let Some(p) = pattern else {
            return Ok(Forwarded::default());
        };
        p.pick(metadata.iter().filter_map(|entry| match entry {
            KeyAndValueRef::Ascii(key, value) => Some((key.as_str(), value.as_bytes())),
            KeyAndValueRef::Binary(..) => None,
        }))
    }

    /// The headers as they travel with a request through the queue (`Sheaf-Forward` on the
    /// message: a JSON object of strings); `None` when there are none.
    pub fn to_json(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let object: serde_json::Map<String, serde_json::Value> = self
            .0
            .iter()
            .map(|(n, v)| (n.clone(), serde_json::Value::String(v.clone())))
            .collect();
        Some(serde_json::Value::Object(object).to_string())
    }

    /// The headers a gateway sent with a request through the queue, checked as headers are
    /// (a name the server reads itself is an error).
    pub fn from_json(text: &str) -> Result<Forwarded, InferError> {
        let bad = || InferError::invalid("Sheaf-Forward is not a JSON object of strings");
        let serde_json::Value::Object(object) =
            serde_json::from_str::<serde_json::Value>(text).map_err(|_| bad())?
        else {
            return Err(bad());
        };
        let mut picked = Vec::with_capacity(object.len());
        for (name, value) in object {
            let serde_json::Value::String(value) = value else {
                return Err(bad());
            };
            if reserved(&name) {
                return Err(InferError::invalid(format!(
                    "forwarded header '{}' names a parameter the server reads itself",
                    sheaf_core::clip(&name)
                )));
            }
            picked.push((name, value));
        }
        Ok(Forwarded(picked))
    }

    /// Adds the headers to `request`'s parameters; one its body names too is an error.
    pub fn add_to(&self, request: &mut RawRequest) -> Result<(), InferError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let parameters = Arc::make_mut(request.parameters.get_or_insert_with(Arc::default));
        for (name, value) in &self.0 {
            if parameters.contains_key(name) {
                return Err(InferError::invalid(format!(
                    "parameter '{}' is given by the request and by a forwarded header; give it \
                     once",
                    sheaf_core::clip(name)
                )));
            }
            parameters.insert(name.clone(), serde_json::Value::String(value.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_headers_become_string_parameters_and_reserved_names_are_refused() {
        let pattern = Pattern::new("my_header.*").unwrap();
        let picked = pattern
            .pick([
                ("my_header_1", &b"one"[..]),
                ("header_2", b"two"),
                ("x-my_header", b"three"),
            ])
            .unwrap();
        let mut request = RawRequest::default();
        picked.add_to(&mut request).unwrap();
        let parameters = request.parameters.unwrap();
        assert_eq!(parameters.len(), 2, "{parameters:?}");
        assert_eq!(parameters["my_header_1"], "one");
        assert_eq!(parameters["x-my_header"], "three");
        // Case: ignored unless the pattern turns it on.
        assert_eq!(
            Pattern::new("MY_HEADER")
                .unwrap()
                .pick([("my_header", &b"v"[..])])
                .unwrap()
                .0
                .len(),
            1
        );
        assert!(Pattern::new("(?-i)MY_HEADER")
            .unwrap()
            .pick([("my_header", &b"v"[..])])
            .unwrap()
            .0
            .is_empty());
        // Names the server reads itself, and values that are not text.
        let all = Pattern::new(".*").unwrap();
        for name in [
            "priority",
            "sequence_id",
            "triton_enable_empty_final_response",
            "headers",
        ] {
            let e = all.pick([(name, &b"1"[..])]).unwrap_err();
            assert!(
                e.message.contains("a parameter the server reads itself"),
                "{}",
                e.message
            );
        }
        assert!(all
            .pick([("h", &[0xff][..])])
            .unwrap_err()
            .message
            .contains("not UTF-8"));
        // A name the body gives too.
        let mut request = RawRequest {
            parameters: Some(Arc::new(serde_json::Map::from_iter([(
                "my_header_1".to_string(),
                serde_json::json!(1),
            )]))),
            ..RawRequest::default()
        };
        let e = picked.add_to(&mut request).unwrap_err();
        assert!(
            e.message
                .contains("given by the request and by a forwarded header"),
            "{}",
            e.message
        );
        assert!(Pattern::new("(").is_err());
    }

    #[test]
    fn headers_travel_through_the_queue_as_json_and_are_checked_again() {
        let pattern = Pattern::new("^my_").unwrap();
        let picked = pattern
            .pick([("my_a", &b"one \"quoted\""[..]), ("my_b", b"two")])
            .unwrap();
        let json = picked.to_json().unwrap();
        let mut request = RawRequest::default();
        Forwarded::from_json(&json)
            .unwrap()
            .add_to(&mut request)
            .unwrap();
        let parameters = request.parameters.unwrap();
        assert_eq!(parameters["my_a"], "one \"quoted\"");
        assert_eq!(parameters["my_b"], "two");
        assert_eq!(Forwarded::default().to_json(), None);
        for bad in ["[1]", "{\"a\": 1}", "not json", "{\"priority\": \"1\"}"] {
            assert!(Forwarded::from_json(bad).is_err(), "{bad}");
        }
    }
}
