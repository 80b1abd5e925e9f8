//! The queue's wire format.
//!
//! A request is published on `<prefix>.<model>` (default `sheaf.infer.<model>`). Its payload is
//! the body of `POST /v2/models/<model>/infer`: KServe v2 JSON, or the binary tensor extension
//! with the JSON length in an `Inference-Header-Content-Length` header. Its headers:
//! - `Sheaf-Reply` (required): the subject the answer is published on;
//! - `Sheaf-Deadline`: Unix time in milliseconds; a request still unstarted then is answered
//!   504 and not run;
//! - `Sheaf-Model-Version`: the version to run (default: the newest);
//! - `Nats-Msg-Id`: a unique id, so that JetStream drops a repeated publish;
//! - `Sheaf-Forward`: the client's headers the gateway's `--http-header-forward-pattern` (or
//!   gRPC's) picked, a JSON object of strings, which become request parameters as on the
//!   gateway (see [`crate::forward`]).
//!
//! - `Sheaf-Encoding: kserve-grpc`: the payload is instead a protobuf `inference.ModelInferRequest`
//!   (KServe v2 gRPC), and a successful answer a protobuf `inference.ModelInferResponse`.
//!
//! Priority and the request's own `timeout` travel as KServe request parameters, as over HTTP.
//!
//! The answer's payload is the HTTP response body (JSON, or JSON and binary outputs with
//! `Inference-Header-Content-Length`), and its `Sheaf-Status` header is the HTTP status: 200, or
//! the status of the error, whose body is `{"error": "..."}`.
//!
//! A request with `Sheaf-Stream: 1` asks for a stream, as `Accept: text/event-stream` does over
//! HTTP. To a streaming (decoupled) model, or a pipeline with one, each response is then an
//! answer of its own with `Sheaf-Stream-Part: N` (0, 1, …; JSON outputs, or a protobuf
//! `ModelInferResponse` for `Sheaf-Encoding: kserve-grpc`), and a last message
//! with `Sheaf-Stream-End: N` (the number of parts before it) closes the stream: status 200 and
//! no body, or the error that cut it short. Any other model answers once, as without the header.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use bytes::Bytes;

/// The subject the answer goes to.
pub const REPLY: &str = "Sheaf-Reply";
/// Unix milliseconds after which the request is not run.
pub const DEADLINE: &str = "Sheaf-Deadline";
/// The model version to run.
pub const VERSION: &str = "Sheaf-Model-Version";
/// The answer's HTTP status.
pub const STATUS: &str = "Sheaf-Status";
/// The JSON length of a binary-extension body (as the HTTP header).
pub const HEADER_LENGTH: &str = "Inference-Header-Content-Length";
/// The payload's encoding when it is not the HTTP body.
pub const ENCODING: &str = "Sheaf-Encoding";
/// [`ENCODING`]'s value for protobuf KServe v2 gRPC messages.
pub const GRPC: &str = "kserve-grpc";
/// The headers forwarded to the model as request parameters.
pub const FORWARD: &str = "Sheaf-Forward";
/// JetStream's de-duplication id.
pub const MSG_ID: &str = "Nats-Msg-Id";
/// On a request: the client asked for a stream of responses.
pub const STREAM: &str = "Sheaf-Stream";
/// On an answer: one response of a stream, its index; more follow.
pub const PART: &str = "Sheaf-Stream-Part";
/// On an answer: the end of a stream, after this many parts.
pub const END: &str = "Sheaf-Stream-End";

/// An answer: the HTTP status, the body, and the JSON length when binary data follows it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub header_length: Option<usize>,
    pub body: Bytes,
}

impl Answer {
    /// An error answer with the KServe body.
    pub fn error(status: u16, message: &str) -> Answer {
        let message = sheaf_core::clip_to(message, sheaf_core::MESSAGE_CHARS);
        Answer {
            status,
            header_length: None,
            body: Bytes::from(serde_json::json!({ "error": message }).to_string()),
        }
    }

    /// The answer's headers.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(STATUS, self.status.to_string().as_str());
        if let Some(n) = self.header_length {
            headers.insert(HEADER_LENGTH, n.to_string().as_str());
        }
        headers
    }

    /// Reads an answer off the queue; a reply without a readable status is a bad gateway.
    pub fn from_message(message: async_nats::Message) -> Answer {
        let headers = message.headers.as_ref();
        let status = header(headers, STATUS).and_then(|s| s.parse::<u16>().ok());
        let Some(status) = status.filter(|s| (100..600).contains(s)) else {
            return Answer::error(502, "the worker's answer carried no Sheaf-Status");
        };
        Answer {
            status,
            header_length: header(headers, HEADER_LENGTH).and_then(|s| s.parse().ok()),
            body: message.payload,
        }
    }
}

/// A header's value as text.
pub fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get(name).map(|v| v.as_str().trim())
}

/// The Unix time in milliseconds `after` from now.
pub fn deadline_after(after: Duration) -> u64 {
    unix_ms(SystemTime::now() + after)
}

/// How long until the Unix-millisecond `deadline`: `None` once it has passed.
pub fn remaining(deadline: u64) -> Option<Duration> {
    let now = unix_ms(SystemTime::now());
    (deadline > now).then(|| Duration::from_millis(deadline - now))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().try_into().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_ahead_leaves_time_and_one_behind_none() {
        let ahead = deadline_after(Duration::from_secs(5));
        let left = remaining(ahead).unwrap_or_default();
        assert!(left > Duration::from_secs(4) && left <= Duration::from_secs(5));
        assert_eq!(remaining(unix_ms(SystemTime::now()) - 1), None);
    }

    #[test]
    fn answers_round_trip_their_status_and_binary_length() {
        let answer = Answer {
            status: 200,
            header_length: Some(12),
            body: Bytes::from_static(b"{\"x\":1}"),
        };
        let message = async_nats::Message {
            subject: "inbox".into(),
            reply: None,
            payload: answer.body.clone(),
            headers: Some(answer.headers()),
            status: None,
            description: None,
            length: 0,
        };
        let back = Answer::from_message(message);
        assert_eq!((back.status, back.header_length), (200, Some(12)));
        assert_eq!(back.body, answer.body);
    }

    #[test]
    fn an_answer_without_a_status_is_a_bad_gateway() {
        let message = async_nats::Message {
            subject: "inbox".into(),
            reply: None,
            payload: Bytes::from_static(b"{}"),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        assert_eq!(Answer::from_message(message).status, 502);
    }
}
