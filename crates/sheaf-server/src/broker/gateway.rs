//! The front door: a request for a model this instance does not serve is published on the
//! queue, and the first answer on its private reply subject is the client's.

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
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
    ) -> Answer {
        let mut headers = HeaderMap::new();
        if let Some(n) = header_length {
            headers.insert(message::HEADER_LENGTH, n.to_string().as_str());
        }
        self.publish(model, version, body, headers).await
    }

    /// Publishes a gRPC inference request for a model this instance does not serve, and
    /// returns the worker's answer as gRPC.
    pub async fn forward_grpc(
        &self,
        request: &pb::ModelInferRequest,
    ) -> Result<pb::ModelInferResponse, Status> {
        let mut headers = HeaderMap::new();
        headers.insert(message::ENCODING, message::GRPC);
        let version = Some(request.model_version.as_str()).filter(|v| !v.is_empty());
        let body = Bytes::from(request.encode_to_vec());
        let answer = self
            .publish(&request.model_name, version, body, headers)
            .await;
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

    /// Publishes `body` on `model`'s subject with `headers` and the reply, deadline and id
    /// headers, and waits for the first answer.
    async fn publish(
        &self,
        model: &str,
        version: Option<&str>,
        body: Bytes,
        mut headers: HeaderMap,
    ) -> Answer {
        let Some(subject) = self.subject(model) else {
            return Answer::error(404, &format!("unknown model '{model}'"));
        };
        let inbox = self.client.new_inbox();
        let mut answers = match self.client.subscribe(inbox.clone()).await {
            Ok(s) => s,
            Err(e) => return Answer::error(503, &format!("the queue is unreachable: {e}")),
        };
        headers.insert(message::REPLY, inbox.as_str());
        headers.insert(message::MSG_ID, inbox.as_str());
        headers.insert(
            message::DEADLINE,
            message::deadline_after(self.config.timeout)
                .to_string()
                .as_str(),
        );
        if let Some(v) = version {
            headers.insert(message::VERSION, v);
        }
        let published = match self
            .jetstream
            .publish_with_headers(subject, headers, body)
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = published {
            return Answer::error(503, &format!("the queue did not take the request: {e}"));
        }
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
