//! A job on a NATS JetStream subject: items arrive as messages, and each item's answer leaves
//! as one message, through the same strategies, batcher and backends as a job on files.
//!
//! - `--input nats://HOST:PORT/SUBJECT`: one item of the model's input per message, as raw
//!   little-endian bytes of one item (the input's item shape must be fixed), or an encoded
//!   image for an input the model's `image_inputs` decodes. A durable consumer (`--consumer`,
//!   default `sheaf-run-<model>`) pulls up to `--batch-size` messages a chunk, as many as are
//!   there, so a chunk never waits for a full batch.
//! - `--output nats://HOST:PORT/SUBJECT`: one message per item, in input order: the KServe v2
//!   response of that item with the binary tensor extension (the JSON header, whose length is
//!   the `Inference-Header-Content-Length` header, then the outputs' bytes), with headers
//!   `Sheaf-Status` (200, or the status of the item's error, whose body is `{"error": ...}`) and
//!   `Sheaf-Source-Sequence` (the input message's stream sequence).
//!
//! A subject no stream holds gets one (`SHEAF_RUN_<subject>`). A source message is acked only
//! when its answer is stored in the sink's stream, so a stopped job, run again, goes on from
//! the messages it had not finished; the answers carry `Nats-Msg-Id` `<consumer>-<sequence>`,
//! so one published twice (the job stopped between publishing and acking) is stored once. A bad
//! item is answered with its error and acked; it does not stop the stream. Without `--follow`
//! the job ends when the source has no message left.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::pull, Message};
use bytes::Bytes;
use sheaf_backend::Tensor;
use sheaf_core::{
    ByteTensor, InferError, InferResponse, ModelHandle, ModelManager, NamedTensor, RawRequest,
};
use sheaf_server::broker::is_token;
use sheaf_server::broker::message::{Answer, MSG_ID};
use sheaf_server::error::ApiError;
use sheaf_server::kserve::codec::{self, BinaryOutputs};
use sheaf_server::shm::SharedMemory;
use tokio::sync::Mutex;

use super::strategy::{Stages, Task, Write};

/// The header that names the input message's stream sequence.
pub const SOURCE_SEQUENCE: &str = "Sheaf-Source-Sequence";

/// `nats://HOST:PORT/SUBJECT`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUrl {
    pub server: String,
    pub subject: String,
}

impl StreamUrl {
    /// `Some` for a `nats://` (or `tls://`) address: its server and subject, or why it is none.
    pub fn parse(text: &str) -> Option<anyhow::Result<StreamUrl>> {
        let scheme = ["nats://", "tls://"]
            .into_iter()
            .find(|s| text.starts_with(s))?;
        let rest = &text[scheme.len()..];
        Some(match rest.split_once('/') {
            Some((host, subject))
                if !host.is_empty() && !subject.is_empty() && subject.split('.').all(is_token) =>
            {
                Ok(StreamUrl {
                    server: format!("{scheme}{host}"),
                    subject: subject.to_string(),
                })
            }
            _ => Err(anyhow::anyhow!(
                "{text}: a stream is nats://HOST:PORT/SUBJECT, the subject dot-separated tokens \
                 of letters, digits, '-' and '_'"
            )),
        })
    }
}

/// How a stream job reaches its source and sink.
#[derive(Debug, Clone)]
pub struct StreamPlan {
    pub input: String,
    pub source: StreamUrl,
    pub sink: StreamUrl,
    pub consumer: String,
    pub follow: bool,
    pub ack_wait: Duration,
}

/// The stream that holds `subject`, made when there is none.
async fn stream_for(
    js: &jetstream::Context,
    subject: &str,
) -> anyhow::Result<jetstream::stream::Stream> {
    let name = match js.stream_by_subject(subject).await {
        Ok(name) => name,
        Err(_) => {
            let name = format!("SHEAF_RUN_{}", subject.replace('.', "_"));
            js.get_or_create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.to_string()],
                ..Default::default()
            })
            .await
            .with_context(|| {
                format!("cannot make a JetStream stream for '{subject}' (is the server started with -js?)")
            })?;
            name
        }
    };
    js.get_stream(&name)
        .await
        .with_context(|| format!("cannot open JetStream stream '{name}'"))
}

async fn connect(url: &StreamUrl) -> anyhow::Result<jetstream::Context> {
    let client = async_nats::ConnectOptions::new()
        .name("sheaf run")
        .connection_timeout(Duration::from_secs(5))
        .connect(url.server.as_str())
        .await
        .with_context(|| format!("cannot reach {}", url.server))?;
    Ok(jetstream::new(client))
}

/// A chunk as loaded: its messages, each item's error (if it could not be read), and the
/// request of the items that could.
pub struct Loaded {
    messages: Vec<Message>,
    refused: Vec<Option<InferError>>,
    request: Option<RawRequest>,
}

/// A chunk as computed: its messages and each one's answer.
pub struct Answered {
    messages: Vec<Message>,
    answers: Vec<Answer>,
}

/// An item's error, as the queue's workers answer it.
fn refusal(e: &InferError) -> Answer {
    Answer::error(ApiError::from(e.clone()).status.as_u16(), &e.message)
}

/// Where the consumer stands.
struct Pulling {
    consumer: jetstream::consumer::Consumer<pull::Config>,
    ended: bool,
}

/// A job whose items come from a subject.
pub struct StreamJob {
    manager: Arc<ModelManager>,
    handle: Arc<ModelHandle>,
    input: String,
    /// Bytes of one raw item; `None` for encoded images.
    item: Option<(Vec<usize>, usize)>,
    chunk: usize,
    follow: bool,
    outputs: Option<Vec<String>>,
    pulling: Mutex<Pulling>,
}

/// Opens the source's consumer and the sink; checks the model can take the stream's items.
pub async fn open(
    manager: Arc<ModelManager>,
    handle: Arc<ModelHandle>,
    plan: &StreamPlan,
    chunk: usize,
    outputs: Option<Vec<String>>,
) -> anyhow::Result<(StreamJob, Sink)> {
    let spec = handle
        .signature
        .inputs
        .iter()
        .find(|s| s.name == plan.input)
        .with_context(|| format!("model '{}' has no input '{}'", handle.name, plan.input))?;
    anyhow::ensure!(
        handle.signature.inputs.len() == 1,
        "model '{}' takes {} inputs; a stream carries items of one",
        handle.name,
        handle.signature.inputs.len()
    );
    let item = if handle.config.image_inputs.contains_key(&plan.input) {
        None
    } else {
        let dims = if handle.max_batch_size > 0 {
            &spec.shape[1..]
        } else {
            &spec.shape[..]
        };
        let shape: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
        let shape = shape.with_context(|| {
            format!(
                "input '{}' has dynamic dimensions {dims:?}: items on a stream need a fixed \
                 shape",
                plan.input
            )
        })?;
        let bytes = shape.iter().product::<usize>() * spec.dtype.size();
        Some((shape, bytes))
    };
    let js = connect(&plan.source).await?;
    let stream = stream_for(&js, &plan.source.subject).await?;
    let consumer = stream
        .get_or_create_consumer(
            &plan.consumer,
            pull::Config {
                durable_name: Some(plan.consumer.clone()),
                filter_subject: plan.source.subject.clone(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: plan.ack_wait,
                max_ack_pending: -1,
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("cannot open consumer '{}'", plan.consumer))?;
    let sink_js = if plan.sink.server == plan.source.server {
        js.clone()
    } else {
        connect(&plan.sink).await?
    };
    stream_for(&sink_js, &plan.sink.subject).await?;
    let job = StreamJob {
        manager,
        handle,
        input: plan.input.clone(),
        item,
        chunk,
        follow: plan.follow,
        outputs,
        pulling: Mutex::new(Pulling {
            consumer,
            ended: false,
        }),
    };
    let sink = Sink {
        js: sink_js,
        subject: plan.sink.subject.clone(),
        consumer: plan.consumer.clone(),
        bar: super::outputs::counter(),
        items: 0,
    };
    Ok((job, sink))
}

impl StreamJob {
    /// The next messages: as many as are there (up to a chunk), waiting for the first.
    async fn pull(&self) -> anyhow::Result<Option<Vec<Message>>> {
        let mut pulling = self.pulling.lock().await;
        loop {
            if pulling.ended {
                return Ok(None);
            }
            let messages =
                collect(pulling.consumer.fetch().max_messages(self.chunk).messages()).await?;
            if !messages.is_empty() {
                return Ok(Some(messages));
            }
            if !self.follow {
                let info = pulling
                    .consumer
                    .info()
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot read the source's consumer: {e}"))?;
                if info.num_pending == 0 {
                    pulling.ended = true;
                    continue;
                }
            }
            // Wait for the next message, then take what else is there.
            let wait = pulling
                .consumer
                .batch()
                .max_messages(1)
                .expires(Duration::from_secs(1));
            let mut first = collect(wait.messages()).await?;
            if !first.is_empty() {
                if self.chunk > 1 {
                    let more = pulling.consumer.fetch().max_messages(self.chunk - 1);
                    first.extend(collect(more.messages()).await?);
                }
                return Ok(Some(first));
            }
        }
    }

    /// The request of a chunk's readable items, and each item's error.
    async fn request(&self, messages: &[Message]) -> (Vec<Option<InferError>>, Option<RawRequest>) {
        let mut refused: Vec<Option<InferError>> = Vec::with_capacity(messages.len());
        let mut raw = RawRequest {
            outputs: self.outputs.clone(),
            ..RawRequest::default()
        };
        let batching = self.handle.max_batch_size > 0;
        match &self.item {
            Some((shape, bytes)) => {
                let mut data = Vec::with_capacity(messages.len() * bytes);
                for m in messages {
                    if m.payload.len() == *bytes {
                        data.extend_from_slice(&m.payload);
                        refused.push(None);
                    } else {
                        refused.push(Some(InferError::invalid(format!(
                            "a message of input '{}' is one item of {bytes} bytes (shape \
                                 {shape:?}), not {}",
                            self.input,
                            m.payload.len()
                        ))));
                    }
                }
                let count = refused.iter().filter(|r| r.is_none()).count();
                if count == 0 {
                    return (refused, None);
                }
                let mut full = shape.clone();
                if batching {
                    full.insert(0, count);
                }
                let dtype = self
                    .handle
                    .signature
                    .inputs
                    .iter()
                    .find(|s| s.name == self.input)
                    .map(|s| s.dtype);
                match dtype.map(|d| Tensor::new(d, full, Bytes::from(data))) {
                    Some(Ok(tensor)) => raw.inputs.push(NamedTensor {
                        name: self.input.clone(),
                        tensor,
                    }),
                    _ => {
                        let e = InferError::invalid("the items do not make a tensor");
                        return (messages.iter().map(|_| Some(e.clone())).collect(), None);
                    }
                }
            }
            None => {
                // Each image on its own, so that one bad image refuses only itself.
                let decoded = futures::future::join_all(messages.iter().map(|m| {
                    self.handle.decode_images(vec![ByteTensor {
                        name: self.input.clone(),
                        shape: vec![1],
                        items: vec![m.payload.clone()],
                    }])
                }))
                .await;
                let mut good: Vec<Tensor> = Vec::new();
                for d in decoded {
                    match d.map(|mut t| t.pop()) {
                        Ok(Some(t)) => {
                            good.push(t.tensor);
                            refused.push(None);
                        }
                        Ok(None) => {
                            refused.push(Some(InferError::invalid("the image decoded to nothing")))
                        }
                        Err(e) => refused.push(Some(e)),
                    }
                }
                if good.is_empty() {
                    return (refused, None);
                }
                match concat(&good) {
                    Ok(tensor) => raw.inputs.push(NamedTensor {
                        name: self.input.clone(),
                        tensor,
                    }),
                    Err(e) => {
                        let e = InferError::invalid(e.to_string());
                        return (messages.iter().map(|_| Some(e.clone())).collect(), None);
                    }
                }
            }
        }
        (refused, Some(raw))
    }
}

/// Every message of one pull request.
async fn collect<S, E, F>(batch: F) -> anyhow::Result<Vec<Message>>
where
    F: std::future::Future<Output = Result<S, E>>,
    S: futures::Stream<Item = Result<Message, async_nats::Error>> + Unpin,
    E: std::fmt::Display,
{
    let mut batch = batch
        .await
        .map_err(|e| anyhow::anyhow!("cannot pull from the source: {e}"))?;
    let mut messages = Vec::new();
    while let Some(message) = futures::StreamExt::next(&mut batch).await {
        messages.push(message.map_err(|e| anyhow::anyhow!("pulling failed: {e}"))?);
    }
    Ok(messages)
}

/// Items of one shape, joined along dimension 0.
fn concat(items: &[Tensor]) -> anyhow::Result<Tensor> {
    let first = items.first().context("no items")?;
    let mut shape = first.shape().to_vec();
    let mut data = Vec::with_capacity(items.iter().map(|t| t.data().len()).sum());
    for t in items {
        anyhow::ensure!(
            t.shape()[1..] == shape[1..] && t.dtype() == first.dtype(),
            "decoded images differ in shape"
        );
        data.extend_from_slice(t.data());
    }
    shape[0] = items.iter().map(|t| t.shape()[0]).sum();
    Ok(Tensor::new(first.dtype(), shape, Bytes::from(data))?)
}

/// Item `i` of `count` of a batched response.
fn item_of(response: &InferResponse, i: usize, count: usize) -> anyhow::Result<InferResponse> {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    for o in &response.outputs {
        let data = o.tensor.data();
        let shape = o.tensor.shape();
        anyhow::ensure!(
            shape.first() == Some(&count) && data.len() % count == 0,
            "output '{}' has shape {shape:?} for {count} items",
            o.name
        );
        let size = data.len() / count;
        let mut one = shape.to_vec();
        one[0] = 1;
        outputs.push(NamedTensor {
            name: o.name.clone(),
            tensor: Tensor::new(o.tensor.dtype(), one, data.slice(i * size..(i + 1) * size))?,
        });
    }
    let mut byte_outputs = Vec::with_capacity(response.byte_outputs.len());
    for o in &response.byte_outputs {
        let per = super::outputs::strings_per_item(o, count)?;
        let mut shape = o.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = 1;
        }
        byte_outputs.push(ByteTensor {
            name: o.name.clone(),
            shape,
            items: o.items[i * per..(i + 1) * per].to_vec(),
        });
    }
    Ok(InferResponse {
        id: None,
        model_name: response.model_name.clone(),
        model_version: response.model_version.clone(),
        outputs,
        byte_outputs,
        receipt: None,
        parameters: response.parameters.clone(),
    })
}

impl Stages for StreamJob {
    type Input = Loaded;
    type Output = Answered;

    fn load(&self, _k: usize) -> Task<'_, Option<Loaded>> {
        Box::pin(async move {
            let Some(messages) = self.pull().await? else {
                return Ok(None);
            };
            let (refused, request) = self.request(&messages).await;
            Ok(Some(Loaded {
                messages,
                refused,
                request,
            }))
        })
    }

    fn compute(&self, loaded: Loaded) -> Task<'_, Answered> {
        Box::pin(async move {
            let Loaded {
                messages,
                refused,
                request,
            } = loaded;
            let count = refused.iter().filter(|r| r.is_none()).count();
            let response = match request {
                Some(raw) => Some(self.manager.infer(&self.handle, raw).await),
                None => None,
            };
            let batching = self.handle.max_batch_size > 0;
            let no_shm = SharedMemory::default();
            let binary = BinaryOutputs {
                default: true,
                ..BinaryOutputs::default()
            };
            let mut answers = Vec::with_capacity(messages.len());
            let mut next = 0;
            for r in &refused {
                let answer = match (r, &response) {
                    (Some(e), _) => refusal(e),
                    (None, Some(Err(e))) => refusal(e),
                    (None, Some(Ok(response))) => {
                        let one = if batching {
                            item_of(response, next, count)
                        } else {
                            Ok(response.clone())
                        };
                        next += 1;
                        let encoded = one
                            .map_err(|e| InferError::internal(e.to_string()))
                            .and_then(|one| codec::encode_response(&one, &binary, &no_shm));
                        match encoded {
                            Ok(e) => Answer {
                                status: 200,
                                header_length: e.header_length,
                                body: e.body,
                            },
                            Err(e) => refusal(&e),
                        }
                    }
                    (None, None) => refusal(&InferError::internal("the item was not run")),
                };
                answers.push(answer);
            }
            Ok(Answered { messages, answers })
        })
    }
}

/// Publishes each item's answer, in order, then acks its source message.
pub struct Sink {
    js: jetstream::Context,
    subject: String,
    consumer: String,
    bar: indicatif::ProgressBar,
    pub items: usize,
}

impl Sink {
    pub fn finish(&self) {
        self.bar.finish();
    }
}

impl Write<Answered> for Sink {
    fn write(&mut self, _k: usize, chunk: Answered) -> Task<'_, ()> {
        Box::pin(async move {
            let mut acks = Vec::with_capacity(chunk.messages.len());
            for (message, answer) in chunk.messages.iter().zip(&chunk.answers) {
                let sequence = message
                    .info()
                    .map_err(|e| anyhow::anyhow!("a source message has no sequence: {e}"))?
                    .stream_sequence;
                let mut headers = answer.headers();
                headers.insert(SOURCE_SEQUENCE, sequence.to_string().as_str());
                headers.insert(MSG_ID, format!("{}-{sequence}", self.consumer).as_str());
                let ack = self
                    .js
                    .publish_with_headers(self.subject.clone(), headers, answer.body.clone())
                    .await
                    .with_context(|| format!("cannot publish to '{}'", self.subject))?;
                acks.push(ack);
            }
            for ack in acks {
                ack.await
                    .with_context(|| format!("'{}' did not store an answer", self.subject))?;
            }
            for message in &chunk.messages {
                message
                    .ack()
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot ack a source message: {e}"))?;
            }
            self.items += chunk.messages.len();
            self.bar.inc(chunk.messages.len() as u64);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_addresses_name_a_server_and_a_subject() {
        assert_eq!(
            StreamUrl::parse("nats://127.0.0.1:4222/frames.in").map(Result::ok),
            Some(Some(StreamUrl {
                server: "nats://127.0.0.1:4222".into(),
                subject: "frames.in".into(),
            }))
        );
        assert!(StreamUrl::parse("frames.npy").is_none());
        for bad in [
            "nats://host:4222",
            "nats://host:4222/",
            "nats:///x",
            "nats://h/a.>",
            "nats://h/a b",
        ] {
            assert!(matches!(StreamUrl::parse(bad), Some(Err(_))), "{bad}");
        }
    }

    #[test]
    fn a_batched_answer_splits_into_items() {
        let response = InferResponse {
            id: None,
            model_name: "m".into(),
            model_version: "1".into(),
            outputs: vec![NamedTensor {
                name: "y".into(),
                tensor: Tensor::new(
                    sheaf_backend::DataType::U8,
                    vec![3, 2],
                    Bytes::from_static(&[1, 2, 3, 4, 5, 6]),
                )
                .unwrap(),
            }],
            byte_outputs: vec![ByteTensor {
                name: "c".into(),
                shape: vec![3, 2],
                items: ["a", "b", "c", "d", "e", "f"]
                    .map(|s| Bytes::from_static(s.as_bytes()))
                    .to_vec(),
            }],
            receipt: None,
            parameters: None,
        };
        let one = item_of(&response, 1, 3).unwrap();
        assert_eq!(one.outputs[0].tensor.shape(), [1, 2]);
        assert_eq!(&one.outputs[0].tensor.data()[..], [3, 4]);
        assert_eq!(one.byte_outputs[0].shape, [1, 2]);
        assert_eq!(one.byte_outputs[0].items, ["c", "d"]);
        assert!(item_of(&response, 0, 4).is_err());
    }
}
