//! The front door: a request for a model this instance does not serve is published on the
//! queue, and the first answer on its private reply subject is the client's. A request of an
//! open sequence goes instead to the one worker that holds the sequence (see [`super`]).

use async_nats::{HeaderMap, RequestErrorKind};
use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use sheaf_core::SequenceFlags;
use tonic::{Code, Status};

use super::message::{self, Answer};
use super::Broker;
use crate::grpc::pb;

impl Broker {
    /// Publishes a KServe v2 request body for `model` and waits for its answer, up to the
    /// configured timeout (504 after; 503 when the queue cannot take it).
    pub async fn forward(
        &self,
        model: &str,
        version: Option<&str>,
        body: Bytes,
        header_length: Option<usize>,
        sequence: Option<&SequenceFlags>,
        forwarded: &crate::forward::Forwarded,
    ) -> Answer {
        let headers = http_headers(header_length, forwarded);
        self.route(model, version, body, headers, sequence).await
    }

    /// Publishes a KServe v2 request body for `model` that asks for a stream (see
    /// [`message`]). A streaming model's answers come as [`Forwarded::Stream`]: each part as it
    /// comes, then the error that cut the stream short, if any. Any other model's answer, or a
    /// refusal before the stream began, is [`Forwarded::Once`]. The configured timeout bounds
    /// the wait for each message.
    pub async fn forward_stream(
        &self,
        model: &str,
        version: Option<&str>,
        body: Bytes,
        header_length: Option<usize>,
        forwarded: &crate::forward::Forwarded,
    ) -> Forwarded {
        let headers = http_headers(header_length, forwarded);
        self.stream_of(model, version, body, headers).await
    }

    /// Publishes `body` with `headers` and the stream, deadline and version headers, and
    /// gathers its answers (see [`Broker::forward_stream`]).
    async fn stream_of(
        &self,
        model: &str,
        version: Option<&str>,
        body: Bytes,
        mut headers: HeaderMap,
    ) -> Forwarded {
        headers.insert(message::STREAM, "1");
        self.stamp(&mut headers, version);
        let mut answers = match self.send(model, body, headers).await {
            Ok(answers) => answers,
            Err(answer) => return Forwarded::Once(answer),
        };
        let timeout = self.config.timeout;
        let Some(first) = within(timeout, &mut answers).await else {
            return Forwarded::Once(Answer::error(
                504,
                &format!(
                    "no worker answered model '{model}' within {:.0} s",
                    timeout.as_secs_f64()
                ),
            ));
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        if ended(&first) {
            // A stream that ended before its first response: nothing, or its error.
            let answer = Answer::from_message(first);
            if answer.status != 200 {
                let _ = tx.try_send(answer);
            }
            return Forwarded::Stream(rx);
        }
        if part(&first) != Some(0) {
            return Forwarded::Once(Answer::from_message(first));
        }
        let model = model.to_string();
        tokio::spawn(async move {
            if tx.send(Answer::from_message(first)).await.is_err() {
                return;
            }
            // A request run again (its worker stopped before acknowledging it) sends its parts
            // again from the first: those already passed on are dropped.
            let mut expected = 1;
            loop {
                let Some(reply) = within(timeout, &mut answers).await else {
                    let _ = tx
                        .send(Answer::error(
                            504,
                            &format!("the stream of model '{model}' stopped without its end"),
                        ))
                        .await;
                    return;
                };
                if let Some(n) = part(&reply) {
                    if n == expected {
                        expected += 1;
                        if tx.send(Answer::from_message(reply)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                let answer = Answer::from_message(reply);
                if answer.status != 200 {
                    let _ = tx.send(answer).await;
                }
                return;
            }
        });
        Forwarded::Stream(rx)
    }

    /// Publishes a gRPC inference request for a model this instance does not serve, and
    /// returns the worker's answer as gRPC.
    pub async fn forward_grpc(
        &self,
        request: &pb::ModelInferRequest,
        sequence: Option<&SequenceFlags>,
        forwarded: &crate::forward::Forwarded,
    ) -> Result<pb::ModelInferResponse, Status> {
        let mut headers = forward_headers(forwarded);
        headers.insert(message::ENCODING, message::GRPC);
        let version = Some(request.model_version.as_str()).filter(|v| !v.is_empty());
        let body = Bytes::from(request.encode_to_vec());
        let answer = self
            .route(&request.model_name, version, body, headers, sequence)
            .await;
        grpc_answer(answer)
    }

    /// Publishes a gRPC inference request that asks for a stream, as [`Broker::forward_stream`]
    /// does for HTTP bodies: its answers are protobuf `ModelInferResponse`s.
    pub async fn forward_grpc_stream(
        &self,
        request: &pb::ModelInferRequest,
        forwarded: &crate::forward::Forwarded,
    ) -> Forwarded {
        let mut headers = forward_headers(forwarded);
        headers.insert(message::ENCODING, message::GRPC);
        let version = Some(request.model_version.as_str()).filter(|v| !v.is_empty());
        let body = Bytes::from(request.encode_to_vec());
        self.stream_of(&request.model_name, version, body, headers)
            .await
    }
}

/// The headers of a KServe v2 HTTP body: its JSON length, and the forwarded headers.
fn http_headers(header_length: Option<usize>, forwarded: &crate::forward::Forwarded) -> HeaderMap {
    let mut headers = forward_headers(forwarded);
    if let Some(n) = header_length {
        headers.insert(message::HEADER_LENGTH, n.to_string().as_str());
    }
    headers
}

/// A message's headers with the client's forwarded headers, if any (see [`message::FORWARD`]).
fn forward_headers(forwarded: &crate::forward::Forwarded) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(json) = forwarded.to_json() {
        headers.insert(message::FORWARD, json.as_str());
    }
    headers
}

/// A worker's answer to a gRPC request as gRPC: the protobuf `ModelInferResponse`, or the
/// status of its error.
pub fn grpc_answer(answer: Answer) -> Result<pb::ModelInferResponse, Status> {
    if answer.status == 200 {
        return pb::ModelInferResponse::decode(answer.body).map_err(|e| {
            Status::internal(format!("the worker's answer is no ModelInferResponse: {e}"))
        });
    }
    let message = serde_json::from_slice::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("the worker answered {}", answer.status));
    let code = match answer.status {
        400 | 413 | 415 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    };
    Err(Status::new(code, message))
}

impl Broker {
    /// Sends a request where it is run: a request of an open sequence to the worker that holds
    /// the sequence, any other (a sequence's start included) through the queue.
    async fn route(
        &self,
        model: &str,
        version: Option<&str>,
        body: Bytes,
        mut headers: HeaderMap,
        sequence: Option<&SequenceFlags>,
    ) -> Answer {
        self.stamp(&mut headers, version);
        let Some(flags) = sequence else {
            return self.publish(model, body, headers).await;
        };
        let Some(subject) = self.sequence_subject(model, &flags.id) else {
            return Answer::error(404, &format!("unknown model '{model}'"));
        };
        if flags.start {
            return self.publish(model, body, headers).await;
        }
        self.follow(model, &flags.id, &subject, body, headers).await
    }

    /// The gateway's deadline, and the version to run, which go with a request wherever it
    /// goes.
    fn stamp(&self, headers: &mut HeaderMap, version: Option<&str>) {
        headers.insert(
            message::DEADLINE,
            message::deadline_after(self.config.timeout)
                .to_string()
                .as_str(),
        );
        if let Some(v) = version {
            headers.insert(message::VERSION, v);
        }
    }

    /// Sends a request of an open sequence to the worker listening on the sequence's subject,
    /// and waits for its answer.
    async fn follow(
        &self,
        model: &str,
        id: &sheaf_core::SequenceId,
        subject: &str,
        body: Bytes,
        headers: HeaderMap,
    ) -> Answer {
        let request = async_nats::Request::new()
            .headers(headers)
            .payload(body)
            .timeout(Some(self.config.timeout));
        match self.client.send_request(subject.to_string(), request).await {
            Ok(reply) => Answer::from_message(reply),
            Err(e) => match e.kind() {
                RequestErrorKind::NoResponders => Answer::error(
                    400,
                    &format!(
                        "sequence {id} of model '{model}' is not open on any worker: its first \
                         request must carry sequence_start (a sequence that ended, idled out or \
                         whose worker stopped is gone)"
                    ),
                ),
                RequestErrorKind::TimedOut => Answer::error(
                    504,
                    &format!(
                        "the worker holding sequence {id} of model '{model}' did not answer \
                         within {:.0} s",
                        self.config.timeout.as_secs_f64()
                    ),
                ),
                RequestErrorKind::MaxPayloadExceeded => Answer::error(
                    413,
                    &format!("the request is larger than the queue server takes: {e}"),
                ),
                RequestErrorKind::InvalidSubject | RequestErrorKind::Other => {
                    Answer::error(503, &format!("the queue is unreachable: {e}"))
                }
            },
        }
    }

    /// Publishes `body` on `model`'s subject with `headers` and the reply and id headers, and
    /// waits for the first answer.
    async fn publish(&self, model: &str, body: Bytes, headers: HeaderMap) -> Answer {
        let mut answers = match self.send(model, body, headers).await {
            Ok(answers) => answers,
            Err(answer) => return answer,
        };
        match tokio::time::timeout(self.config.timeout, answers.next()).await {
            Ok(Some(reply)) => Answer::from_message(reply),
            Ok(None) => Answer::error(503, "the queue connection closed before an answer came"),
            Err(_) => Answer::error(
                504,
                &format!(
                    "no worker answered model '{model}' within {:.0} s",
                    self.config.timeout.as_secs_f64()
                ),
            ),
        }
    }
}

impl Broker {
    /// Publishes `body` on `model`'s subject with `headers` and the reply and id headers, and
    /// returns the subscription its answers come on; or the answer when the queue does not take
    /// it.
    async fn send(
        &self,
        model: &str,
        body: Bytes,
        mut headers: HeaderMap,
    ) -> Result<async_nats::Subscriber, Answer> {
        let Some(subject) = self.subject(model) else {
            return Err(Answer::error(404, &format!("unknown model '{model}'")));
        };
        let inbox = self.client.new_inbox();
        let answers = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| Answer::error(503, &format!("the queue is unreachable: {e}")))?;
        headers.insert(message::REPLY, inbox.as_str());
        headers.insert(message::MSG_ID, inbox.as_str());
        let published = match self
            .jetstream
            .publish_with_headers(subject, headers, body)
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        published
            .map_err(|e| Answer::error(503, &format!("the queue did not take the request: {e}")))?;
        Ok(answers)
    }
}

/// The next message on `answers`, if one comes within `timeout`.
async fn within(
    timeout: std::time::Duration,
    answers: &mut async_nats::Subscriber,
) -> Option<async_nats::Message> {
    tokio::time::timeout(timeout, answers.next())
        .await
        .ok()
        .flatten()
}

/// What a request that asks for a stream got from the queue.
pub enum Forwarded {
    /// One answer: a model that answers once, or a refusal.
    Once(Answer),
    /// A streaming model's answers, each as it comes.
    Stream(tokio::sync::mpsc::Receiver<Answer>),
}

/// Whether a streamed answer ends its stream.
fn ended(reply: &async_nats::Message) -> bool {
    message::header(reply.headers.as_ref(), message::END).is_some()
}

/// A streamed answer's part index, if it is one.
fn part(reply: &async_nats::Message) -> Option<usize> {
    message::header(reply.headers.as_ref(), message::PART)?
        .parse()
        .ok()
}
