//! gRPC messages held in the server's request memory ([`crate::request_memory`]) while they
//! arrive, before tonic has decoded them (the handlers hold each decoded message from then on).
//!
//! A call's body is a run of messages, each a flag byte, a 4-byte big-endian length and that
//! many bytes. [`Receiving`] reads those prefixes as the body's frames pass, and holds a
//! message's declared length as soon as its prefix has arrived, so that a message that would
//! pass `--max-request-memory` is refused before the rest of it is sent (the call ends with
//! RESOURCE_EXHAUSTED and the reason); once the message's last byte has passed, its hold is
//! given back. A length over the message size limit is not held: tonic refuses that message by
//! its prefix. A call that streams its requests (`ModelStreamInfer`, TEI's `*Stream`) has its
//! messages counted the same way but not refused here: the handler refuses such a message
//! alone once it is decoded, and the stream serves on (ending the call's body would end it).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Frame;

use crate::request_memory::{Held, RequestMemory};

/// What [`hold_while_receiving`] needs: the memory, and the largest message tonic accepts.
#[derive(Clone)]
pub(super) struct Limits {
    pub(super) memory: Arc<RequestMemory>,
    pub(super) max_message_bytes: usize,
}

/// The gRPC port's middleware: every call's body is [`Receiving`].
pub(super) async fn hold_while_receiving(
    State(limits): State<Limits>,
    request: Request,
    next: Next,
) -> Response {
    let refuse = !streams_requests(request.uri().path());
    let request = request.map(|body| Body::new(Receiving::new(body, &limits, refuse)));
    next.run(request).await
}

/// Whether the call at `path` (`/package.Service/Method`) streams its requests: every such
/// method here has `Stream` in its name, and no other has.
fn streams_requests(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|m| m.contains("Stream"))
}

/// A call's body whose messages are held while they arrive (see the module doc).
pub(super) struct Receiving {
    body: Body,
    framing: Framing,
    held: Held,
    max_message_bytes: usize,
    /// Whether a message past the memory ends the call; else it is counted all the same.
    refuse: bool,
}

/// Where the body is in its run of messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Reading a message's 5-byte prefix, of which `got` bytes have come, the length's bytes
    /// gathered in `length`.
    Prefix { got: u8, length: u32 },
    /// Inside a message, `left` bytes of it still to come.
    Message { left: usize },
}

const START: Framing = Framing::Prefix { got: 0, length: 0 };

impl Receiving {
    pub(super) fn new(body: Body, limits: &Limits, refuse: bool) -> Receiving {
        Receiving {
            body,
            framing: START,
            held: limits.memory.nothing(),
            max_message_bytes: limits.max_message_bytes,
            refuse,
        }
    }

    /// Follows `data` through the framing: holds each message's length when its prefix is
    /// complete, and gives it back after its last byte.
    fn pass(&mut self, mut data: &[u8]) -> Result<(), crate::request_memory::Full> {
        while !data.is_empty() {
            match self.framing {
                Framing::Prefix { got, length } => {
                    // The first byte flags compression; the next four are the length.
                    let length = match got {
                        0 => 0,
                        _ => length << 8 | u32::from(data[0]),
                    };
                    data = &data[1..];
                    if got < 4 {
                        self.framing = Framing::Prefix {
                            got: got + 1,
                            length,
                        };
                        continue;
                    }
                    let length = length as usize;
                    if length <= self.max_message_bytes {
                        match self.refuse {
                            true => self.held.grow_to(length)?,
                            false => self.held.count_to(length),
                        }
                    }
                    self.framing = Framing::Message { left: length };
                }
                Framing::Message { left } => {
                    let passed = left.min(data.len());
                    data = &data[passed..];
                    self.framing = Framing::Message {
                        left: left - passed,
                    };
                }
            }
            if self.framing == (Framing::Message { left: 0 }) {
                self.held.shrink_to(0);
                self.framing = START;
            }
        }
        Ok(())
    }
}

impl HttpBody for Receiving {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let data = data.clone();
                if let Err(full) = self.pass(&data) {
                    let status = tonic::Status::resource_exhausted(full.to_string());
                    return Poll::Ready(Some(Err(axum::Error::new(status))));
                }
            }
        }
        polled
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

    fn receiving(limit: usize) -> (Receiving, Arc<RequestMemory>) {
        let memory = Arc::new(RequestMemory::new(limit));
        let limits = Limits {
            memory: memory.clone(),
            max_message_bytes: 1000,
        };
        (Receiving::new(Body::empty(), &limits, true), memory)
    }

    fn prefix(length: u32) -> Vec<u8> {
        let mut p = vec![0];
        p.extend(length.to_be_bytes());
        p
    }

    #[test]
    fn a_message_is_held_from_its_prefix_to_its_last_byte() {
        let (mut body, memory) = receiving(500);
        // The prefix split across frames: nothing is held until it is whole.
        let p = prefix(300);
        body.pass(&p[..2]).unwrap();
        assert_eq!(memory.held(), 0);
        body.pass(&p[2..]).unwrap();
        assert_eq!(memory.held(), 300);
        body.pass(&[7; 299]).unwrap();
        assert_eq!(memory.held(), 300);
        // Its last byte and the next message's prefix and first bytes in one frame.
        let mut frame = vec![7];
        frame.extend(prefix(100));
        frame.extend([1; 10]);
        body.pass(&frame).unwrap();
        assert_eq!(memory.held(), 100);
        body.pass(&[1; 90]).unwrap();
        assert_eq!(memory.held(), 0);
        // An empty message holds nothing.
        body.pass(&prefix(0)).unwrap();
        assert_eq!((memory.held(), body.framing), (0, START));
    }

    #[test]
    fn a_message_past_the_memory_is_refused_by_its_prefix() {
        let (mut body, memory) = receiving(500);
        let _other = memory.hold(300).unwrap();
        let refused = body.pass(&prefix(201)).unwrap_err();
        assert_eq!((refused.asked, refused.held), (201, 300));
        // A length over the message limit is left to tonic, which refuses it by its prefix.
        let (mut body, memory) = receiving(500);
        body.pass(&prefix(5000)).unwrap();
        assert_eq!(memory.held(), 0);
        // A stream's message is counted, not refused: its handler refuses it once decoded.
        let (mut body, memory) = receiving(500);
        body.refuse = false;
        let _other = memory.hold(300).unwrap();
        body.pass(&prefix(400)).unwrap();
        assert_eq!(memory.held(), 700);
        body.pass(&[0; 400]).unwrap();
        assert_eq!(memory.held(), 300);
    }

    #[test]
    fn the_calls_that_stream_requests_are_named_so() {
        for path in [
            "/inference.GRPCInferenceService/ModelStreamInfer",
            "/tei.v1.Embed/EmbedStream",
            "/tei.v1.Rerank/RerankStream",
            "/tei.v1.Tokenize/DecodeStream",
        ] {
            assert!(streams_requests(path), "{path}");
        }
        for path in [
            "/inference.GRPCInferenceService/ModelInfer",
            "/tei.v1.Embed/Embed",
            "/grpc.health.v1.Health/Watch",
        ] {
            assert!(!streams_requests(path), "{path}");
        }
    }
}
