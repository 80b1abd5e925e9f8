//! Many sheaf instances behind one queue: a NATS JetStream work-queue stream carries KServe v2
//! inference requests, one subject per model, to whichever instance has room for them.
//!
//! - [`message`]: the wire format, the KServe v2 request body as it is sent over HTTP (JSON, or
//!   the binary tensor extension) with a few headers, and the answer likewise.
//! - [`worker`]: an instance that serves a model pulls its requests, never more than its queue
//!   has room for, and batches them with its own HTTP and gRPC traffic; it answers, then acks.
//! - [`gateway`]: an instance asked for a model it does not serve publishes the request and
//!   waits for the answer, so any sheaf (or any NATS client) can be the front door.
//!
//! Nothing accepted is lost: a request is acknowledged only after it has been answered, so the
//! requests a worker held when it died are delivered again, to another worker, once the ack
//! wait has passed. The gateway keeps the first answer and stops listening, so a request run
//! twice (its worker died between answering and acknowledging) still gives its client one.
//!
//! A request that asks for a stream (`Sheaf-Stream`, set by a gateway for `Accept:
//! text/event-stream` and for requests on a gRPC stream) gets a streaming model's responses as
//! messages of their own, numbered, then an end (see [`message`]); the gateway passes them on as
//! server-sent events or stream responses.
//!
//! A stateful model's sequence stays on one worker: its start request goes through the queue
//! like any other, and the worker that answers it listens on the sequence's own subject
//! (`<prefix>-sequence.<model>.<id>`, outside the stream) until the sequence ends or idles out.
//! The sequence's later requests are NATS requests on that subject, answered by that worker
//! alone; with no worker listening they are answered 400 (the sequence is not open), as a
//! single server answers them. They are not queued: the state they need lives in one process,
//! so a request that outlived its worker could not be run anywhere else. A client that sends a
//! sequence's requests back to back on a gRPC stream has each sent once the previous one is
//! answered (`grpc::sequences`), so the start is taken before the next request looks for its
//! worker, and the worker gets them in order.

pub mod gateway;
pub mod message;
pub mod worker;

use std::fmt::Write as _;
use std::time::Duration;

use sheaf_core::SequenceId;

use async_nats::jetstream::{self, stream};

/// How an instance reaches the queue.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The NATS server, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The JetStream stream that holds the requests (created on first use).
    pub stream: String,
    /// Subjects are `<prefix>.<model>`; the stream takes `<prefix>.>`.
    pub prefix: String,
    /// How long a pulled request may stay unacknowledged before it is delivered again.
    pub ack_wait: Duration,
    /// How many times a request is delivered before it is dropped.
    pub max_deliver: i64,
    /// How long a gateway waits for an answer (and so the deadline it gives requests).
    pub timeout: Duration,
    /// The most requests a worker holds per model at once; by default two full batches per
    /// device, and never more than the model's free queue room.
    pub window: Option<usize>,
}

impl BrokerConfig {
    /// The defaults for a queue at `url`.
    pub fn new(url: impl Into<String>) -> BrokerConfig {
        BrokerConfig {
            url: url.into(),
            stream: "SHEAF".into(),
            prefix: "sheaf.infer".into(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            timeout: Duration::from_secs(60),
            window: None,
        }
    }
}

/// A connection to the queue, shared by the worker loops and the gateway.
pub struct Broker {
    pub config: BrokerConfig,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    stream: stream::Stream,
}

impl Broker {
    /// Connects to the NATS server and opens (or creates) the work-queue stream.
    pub async fn connect(config: BrokerConfig) -> Result<Broker, String> {
        if !is_token(&config.stream) {
            return Err(format!(
                "queue stream name '{}' may hold only letters, digits, '-' and '_'",
                config.stream
            ));
        }
        if config.prefix.is_empty() || !config.prefix.split('.').all(is_token) {
            return Err(format!(
                "queue subject prefix '{}' must be dot-separated tokens of letters, digits, '-' \
                 and '_'",
                config.prefix
            ));
        }
        let client = async_nats::ConnectOptions::new()
            .name("sheaf")
            .connection_timeout(Duration::from_secs(5))
            .connect(config.url.as_str())
            .await
            .map_err(|e| format!("cannot reach the queue at {}: {e}", config.url))?;
        let jetstream = jetstream::new(client.clone());
        let stream = jetstream
            .get_or_create_stream(stream::Config {
                name: config.stream.clone(),
                subjects: vec![format!("{}.>", config.prefix)],
                retention: stream::RetentionPolicy::WorkQueue,
                // A request nobody pulls is of no use after its deadline; keep a margin.
                max_age: (config.timeout * 10).max(Duration::from_secs(600)),
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| {
                format!(
                    "cannot open JetStream stream '{}' at {} (is the server started with -js?): {e}",
                    config.stream, config.url
                )
            })?;
        tracing::info!(url = %config.url, stream = %config.stream, subjects = %format!("{}.>", config.prefix), "connected to the queue");
        Ok(Broker {
            config,
            client,
            jetstream,
            stream,
        })
    }

    /// The subject of `model`'s requests, or `None` for a name that cannot be one subject token.
    pub fn subject(&self, model: &str) -> Option<String> {
        is_token(model).then(|| format!("{}.{model}", self.config.prefix))
    }

    /// The subject that the worker holding sequence `id` of `model` listens on.
    pub fn sequence_subject(&self, model: &str, id: &SequenceId) -> Option<String> {
        is_token(model).then(|| sequence_subject(&self.config.prefix, model, id))
    }
}

/// `<prefix>-sequence.<model>.<key>`: the key is `n` and the number for an integer id, `s` and
/// the hexadecimal bytes for a string (which may hold any character).
fn sequence_subject(prefix: &str, model: &str, id: &SequenceId) -> String {
    let mut subject = format!("{prefix}-sequence.{model}.");
    match id {
        SequenceId::Number(n) => {
            let _ = write!(subject, "n{n}");
        }
        SequenceId::Text(t) => {
            subject.push('s');
            for b in t.bytes() {
                let _ = write!(subject, "{b:02x}");
            }
        }
    }
    subject
}

/// A NATS subject token (and stream or consumer name): letters, digits, `-` and `_`.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_make_subject_tokens() {
        assert!(is_token("mlp"));
        assert!(is_token("effnet-lite_0"));
        for bad in ["", "a.b", "a*", "a>", "a b", "ä"] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn sequence_subjects_stay_outside_the_stream_and_name_every_id_apart() {
        let n = sequence_subject("sheaf.infer", "gru", &SequenceId::Number(42));
        assert_eq!(n, "sheaf.infer-sequence.gru.n42");
        let s = sequence_subject("sheaf.infer", "gru", &SequenceId::Text("a.b *>".into()));
        assert_eq!(s, "sheaf.infer-sequence.gru.s612e62202a3e");
        assert!(
            !n.starts_with("sheaf.infer."),
            "the stream takes sheaf.infer.>"
        );
        assert!(s.rsplit('.').next().is_some_and(is_token));
        let text_42 = sequence_subject("p", "m", &SequenceId::Text("42".into()));
        assert_ne!(text_42, sequence_subject("p", "m", &SequenceId::Number(42)));
    }
}
