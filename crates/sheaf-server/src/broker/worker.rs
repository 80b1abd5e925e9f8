//! A worker: for each model it serves, one loop pulls that model's requests off the queue,
//! never holding more than the model's queue has room for, and runs each through the model
//! manager like an HTTP request, so pulled requests batch with local traffic. Each is answered
//! on its `Sheaf-Reply` subject, then acknowledged; a streaming model's request that asks for a
//! stream is answered response by response, and acknowledged after its end.
//!
//! A sequence that a pulled request starts is then followed: the worker listens on the
//! sequence's subject, and answers the sequence's later requests there, one at a time in the
//! order they came, until the sequence ends or is closed for idleness.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::AckKind;
use async_nats::jetstream::Message;
use async_nats::{HeaderMap, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use sheaf_core::{ModelHandle, SequenceId};
use tokio::sync::Notify;

use super::message::{self, header, Answer};
use super::Broker;
use prost::Message as _;

use crate::error::ApiError;
use crate::grpc::{self, pb};
use crate::kserve::codec;
use crate::shm::SharedMemory;
use crate::AppState;

/// How long one pull waits for requests before it is renewed.
const PULL_EXPIRES: Duration = Duration::from_secs(1);

/// Starts a pull loop for each of `models`; each ends when the server begins to drain.
pub fn spawn(state: AppState, broker: Arc<Broker>, models: Vec<String>) {
    for model in models {
        if broker.subject(&model).is_none() {
            tracing::warn!(%model, "not served from the queue: a model name on the queue may hold only letters, digits, '-' and '_'");
            continue;
        }
        tokio::spawn(pull_loop(state.clone(), broker.clone(), model));
    }
}

/// Requests pulled and not yet answered, and a signal when one is.
#[derive(Default)]
struct Held {
    count: AtomicUsize,
    freed: Notify,
}

async fn pull_loop(state: AppState, broker: Arc<Broker>, model: String) {
    let consumer = loop {
        match consumer(&broker, &model).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(%model, "cannot open the queue's consumer, retrying: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if state.drain.is_draining() {
            return;
        }
    };
    tracing::info!(%model, subject = ?broker.subject(&model), "pulling requests from the queue");
    let held = Arc::new(Held::default());
    let no_shm = Arc::new(SharedMemory::default());
    while !state.drain.is_draining() {
        let room = room(&state, &broker, &model, held.count.load(Ordering::Acquire));
        if room == 0 {
            // Wait for an answer to free room (or re-check now and then: the model's queue
            // also drains local traffic).
            let _ = tokio::time::timeout(Duration::from_millis(50), held.freed.notified()).await;
            continue;
        }
        let batch = consumer
            .batch()
            .max_messages(room)
            .expires(PULL_EXPIRES)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(%model, "pulling from the queue failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        while let Some(next) = batch.next().await {
            match next {
                Ok(msg) => {
                    held.count.fetch_add(1, Ordering::AcqRel);
                    let (state, broker, model, held, no_shm) = (
                        state.clone(),
                        broker.clone(),
                        model.clone(),
                        held.clone(),
                        no_shm.clone(),
                    );
                    tokio::spawn(async move {
                        handle(&state, &broker, &model, msg, &no_shm).await;
                        held.count.fetch_sub(1, Ordering::AcqRel);
                        held.freed.notify_one();
                    });
                }
                Err(e) => {
                    tracing::debug!(%model, "pull ended: {e}");
                    break;
                }
            }
        }
    }
    tracing::info!(%model, "stopped pulling from the queue: the server is draining");
}

/// The model's durable consumer, shared by every worker that serves it.
async fn consumer(broker: &Broker, model: &str) -> Result<PullConsumer, String> {
    let subject = broker
        .subject(model)
        .ok_or_else(|| format!("model name '{model}' cannot be a subject"))?;
    let durable = format!("sheaf-{model}");
    broker
        .stream
        .get_or_create_consumer(
            &durable,
            pull::Config {
                durable_name: Some(durable.clone()),
                filter_subject: subject,
                ack_policy: AckPolicy::Explicit,
                ack_wait: broker.config.ack_wait,
                max_deliver: broker.config.max_deliver,
                max_ack_pending: 100_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())
}

/// How many more requests this worker may pull for `model`, holding `held`.
fn room(state: &AppState, broker: &Broker, model: &str, held: usize) -> usize {
    let Ok(handle) = state.manager.get(model, None) else {
        // Not loaded (on demand): one request loads it.
        return usize::from(held == 0);
    };
    let lanes = handle.lanes().len();
    let window = broker
        .config
        .window
        .unwrap_or(2 * handle.max_batch_size.max(1) * lanes.max(1));
    let free = if lanes == 0 {
        window
    } else {
        handle.free_room()
    };
    window.saturating_sub(held).min(free)
}

/// Answers one request and acknowledges it; a server that is draining hands it back at once.
async fn handle(
    state: &AppState,
    broker: &Arc<Broker>,
    model: &str,
    msg: Message,
    no_shm: &Arc<SharedMemory>,
) {
    let headers = msg.headers.as_ref();
    let Some(reply) = header(headers, message::REPLY).map(str::to_string) else {
        tracing::warn!(%model, "a queued request without a Sheaf-Reply header was dropped");
        let _ = msg.ack_with(AckKind::Term).await;
        return;
    };
    let Some(_in_flight) = state.drain.admit() else {
        let _ = msg.ack_with(AckKind::Nak(None)).await;
        return;
    };
    if header(headers, message::STREAM).is_some() {
        let work = stream(
            state,
            broker,
            model,
            headers,
            msg.payload.clone(),
            &reply,
            no_shm,
        );
        if keep_alive(&msg, broker, work).await {
            if let Err(e) = msg.ack().await {
                tracing::warn!(%model, "cannot acknowledge an answered request: {e}");
            }
        }
        return;
    }
    let work = answer(state, model, headers, msg.payload.clone(), no_shm);
    let (answer, opened) = keep_alive(&msg, broker, work).await;
    if let Some(opened) = opened {
        // Listening before the answer goes out: the client's next request of the sequence
        // cannot come sooner than the answer, and the queue server takes the subscription
        // before the answer that follows it on this connection.
        follow(state, broker, model, opened, no_shm).await;
    }
    if let Err(e) = broker
        .client
        .publish_with_headers(reply, answer.headers(), answer.body)
        .await
    {
        // Not acknowledged: the request is delivered again after the ack wait.
        tracing::warn!(%model, "cannot publish an answer: {e}");
        return;
    }
    if let Err(e) = msg.ack().await {
        tracing::warn!(%model, "cannot acknowledge an answered request: {e}");
    }
}

/// A sequence that a request opened on this worker, to be followed.
struct Opened {
    id: SequenceId,
    handle: Arc<ModelHandle>,
}

/// The time left before a request's `Sheaf-Deadline` (none without one), or the answer to a
/// request whose deadline is malformed or past.
fn time_left(headers: Option<&HeaderMap>) -> Result<Option<Duration>, Answer> {
    match header(headers, message::DEADLINE).map(str::parse::<u64>) {
        Some(Err(_)) => Err(Answer::error(
            400,
            "Sheaf-Deadline must be Unix time in milliseconds",
        )),
        Some(Ok(deadline)) => match message::remaining(deadline) {
            None => Err(Answer::error(
                504,
                "the request's deadline passed while it waited in the queue; it was not run",
            )),
            Some(left) => Ok(Some(left)),
        },
        None => Ok(None),
    }
}

/// Runs one request within its `Sheaf-Deadline`; also says which sequence it opened, if any.
async fn answer(
    state: &AppState,
    model: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    no_shm: &SharedMemory,
) -> (Answer, Option<Opened>) {
    let left = match time_left(headers) {
        Ok(left) => left,
        Err(answer) => return (answer, None),
    };
    let ran = if header(headers, message::ENCODING) == Some(message::GRPC) {
        run_grpc(state, model, headers, payload, left, no_shm).await
    } else {
        run(state, model, headers, payload, left, no_shm).await
    };
    match ran {
        Ok((answer, Some((flags, handle)))) if flags.start && !flags.end => {
            let opened = Opened {
                id: flags.id,
                handle,
            };
            (answer, Some(opened))
        }
        Ok((answer, _)) => (answer, None),
        Err(e) => (Answer::error(e.status.as_u16(), &e.message), None),
    }
}

/// Listens on the subject of a sequence this worker opened, and answers its requests there
/// until it closes (or the server drains).
async fn follow(
    state: &AppState,
    broker: &Arc<Broker>,
    model: &str,
    opened: Opened,
    no_shm: &Arc<SharedMemory>,
) {
    let Some(subject) = broker.sequence_subject(model, &opened.id) else {
        return;
    };
    match broker.client.subscribe(subject.clone()).await {
        Ok(requests) => {
            let (state, broker, model, no_shm) = (
                state.clone(),
                broker.clone(),
                model.to_string(),
                no_shm.clone(),
            );
            tokio::spawn(async move {
                follow_loop(&state, &broker, &model, opened, requests, &no_shm).await;
            });
        }
        Err(e) => tracing::warn!(
            %model, %subject,
            "cannot listen for the sequence's requests; they will be answered 'not open': {e}"
        ),
    }
}

/// How often a followed sequence is checked for having closed while nothing came.
const FOLLOW_CHECK: Duration = Duration::from_millis(500);

async fn follow_loop(
    state: &AppState,
    broker: &Broker,
    model: &str,
    opened: Opened,
    mut requests: Subscriber,
    no_shm: &SharedMemory,
) {
    let mut check = tokio::time::interval(FOLLOW_CHECK);
    loop {
        tokio::select! {
            next = requests.next() => {
                let Some(request) = next else { break };
                let Some(reply) = request.reply.clone() else { continue };
                let answer = match state.drain.admit() {
                    Some(_in_flight) => {
                        answer(state, model, request.headers.as_ref(), request.payload, no_shm)
                            .await
                            .0
                    }
                    None => Answer::error(503, "the worker is shutting down"),
                };
                if let Err(e) = broker
                    .client
                    .publish_with_headers(reply, answer.headers(), answer.body)
                    .await
                {
                    tracing::warn!(%model, "cannot publish a sequence's answer: {e}");
                }
                if !opened.handle.sequence_open(&opened.id) {
                    break;
                }
            }
            _ = check.tick() => {
                if !opened.handle.sequence_open(&opened.id) {
                    break;
                }
            }
        }
    }
    let _ = requests.unsubscribe().await;
    tracing::debug!(%model, sequence = %opened.id, "stopped following a closed sequence");
}

/// Answers a request that asks for a stream (`Sheaf-Stream`): a streaming model's responses as
/// parts, each published as it comes, then the end; any other model's one answer, as without
/// the header. Returns whether every message was published (if not, the request is not
/// acknowledged and runs again; the gateway drops the parts it already has).
async fn stream(
    state: &AppState,
    broker: &Broker,
    model: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    reply: &str,
    no_shm: &SharedMemory,
) -> bool {
    let publish = |answer: Answer, mark: Option<(&'static str, usize)>| async move {
        let mut headers = answer.headers();
        if let Some((name, n)) = mark {
            headers.insert(name, n.to_string().as_str());
        }
        let sent = broker
            .client
            .publish_with_headers(reply.to_string(), headers, answer.body)
            .await;
        if let Err(e) = &sent {
            tracing::warn!(%model, "cannot publish a streamed answer: {e}");
        }
        sent.is_ok()
    };
    let refused = |e: ApiError| Answer::error(e.status.as_u16(), &e.message);
    let left = match time_left(headers) {
        Ok(left) => left,
        Err(answer) => return publish(answer, None).await,
    };
    let handle = match state
        .manager
        .get_or_load(model, header(headers, message::VERSION))
        .await
    {
        Ok(handle) => handle,
        Err(e) => return publish(refused(e.into()), None).await,
    };
    if !state.manager.streams(&handle).await {
        let (answer, _) = answer(state, model, headers, payload, no_shm).await;
        return publish(answer, None).await;
    }
    let grpc = header(headers, message::ENCODING) == Some(message::GRPC);
    let decoded = if grpc {
        decode_grpc(payload, no_shm).map(|d| (d.request, Some(d.typed)))
    } else {
        decode_http(headers, payload, no_shm).map(|d| (d.request, None))
    };
    let (mut request, typed) = match decoded {
        Ok(d) => d,
        Err(e) => return publish(refused(e), None).await,
    };
    if let Err(e) = ready(&mut request, headers, left) {
        return publish(refused(e), None).await;
    }
    let mut responses = match state.manager.infer_stream(&handle, request).await {
        Ok(r) => r,
        Err(e) => return publish(refused(e.into()), None).await,
    };
    // Over HTTP each part is JSON, as a server-sent event carries it; over gRPC a protobuf
    // ModelInferResponse.
    let json_only = codec::BinaryOutputs {
        default: false,
        by_name: Vec::new(),
        shm: Vec::new(),
    };
    let mut parts = 0;
    while let Some(response) = responses.next().await {
        let encoded = response.map_err(ApiError::from).and_then(|r| match typed {
            Some(typed) => grpc::convert::encode(r, typed, &[], no_shm)
                .map(|m| Bytes::from(m.encode_to_vec()))
                .map_err(ApiError::from),
            None => codec::encode_response(&r, &json_only, no_shm)
                .map(|e| e.body)
                .map_err(ApiError::from),
        });
        match encoded {
            Ok(body) => {
                let answer = Answer {
                    status: 200,
                    header_length: None,
                    body,
                };
                if !publish(answer, Some((message::PART, parts))).await {
                    return false;
                }
                parts += 1;
            }
            Err(e) => return publish(refused(e), Some((message::END, parts))).await,
        }
    }
    let end = Answer {
        status: 200,
        header_length: None,
        body: Bytes::new(),
    };
    publish(end, Some((message::END, parts))).await
}

/// Runs `work`, telling the queue the request is still in progress every third of the ack
/// wait, so that a long batch is not delivered to another worker meanwhile.
async fn keep_alive<T>(
    msg: &Message,
    broker: &Broker,
    work: impl std::future::Future<Output = T>,
) -> T {
    let every = (broker.config.ack_wait / 3).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tokio::pin!(work);
    loop {
        tokio::select! {
            answer = &mut work => return answer,
            _ = tick.tick() => {
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        }
    }
}

/// What a request ran: its answer, and the sequence it belongs to on which model.
type Ran = (
    Answer,
    Option<(sheaf_core::SequenceFlags, Arc<ModelHandle>)>,
);

/// Runs one request through the model manager, as `POST /v2/models/{model}/infer` would.
async fn run(
    state: &AppState,
    model: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    left: Option<Duration>,
    no_shm: &SharedMemory,
) -> Result<Ran, ApiError> {
    let version = header(headers, message::VERSION);
    let handle = state.manager.get_or_load(model, version).await?;
    let mut decoded = decode_http(headers, payload, no_shm)?;
    ready(&mut decoded.request, headers, left)?;
    let sequence = decoded.request.sequence.clone();
    let response = state.manager.infer(&handle, decoded.request).await?;
    let encoded = codec::encode_response(&response, &decoded.binary, no_shm)?;
    let answer = Answer {
        status: 200,
        header_length: encoded.header_length,
        body: encoded.body,
    };
    Ok((answer, sequence.map(|s| (s, handle))))
}

/// Runs one protobuf `ModelInferRequest`, as the gRPC `ModelInfer` call would; a success is a
/// protobuf `ModelInferResponse`, an error the KServe JSON body with its HTTP status.
async fn run_grpc(
    state: &AppState,
    model: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    left: Option<Duration>,
    no_shm: &SharedMemory,
) -> Result<Ran, ApiError> {
    let request = parse_grpc(payload)?;
    let version = Some(request.model_version.as_str()).filter(|v| !v.is_empty());
    let handle = state.manager.get_or_load(model, version).await?;
    let mut decoded = grpc::convert::decode(request, no_shm)?;
    ready(&mut decoded.request, headers, left)?;
    let sequence = decoded.request.sequence.clone();
    let response = state.manager.infer(&handle, decoded.request).await?;
    let encoded = grpc::convert::encode(response, decoded.typed, &decoded.shm_outputs, no_shm)?;
    let answer = Answer {
        status: 200,
        header_length: None,
        body: Bytes::from(encoded.encode_to_vec()),
    };
    Ok((answer, sequence.map(|s| (s, handle))))
}

/// Readies a request from the queue as the gateway would have: the headers it forwarded
/// become parameters ([`message::FORWARD`]), and the request must start in time.
fn ready(
    request: &mut sheaf_core::RawRequest,
    headers: Option<&HeaderMap>,
    left: Option<Duration>,
) -> Result<(), ApiError> {
    if let Some(json) = header(headers, message::FORWARD) {
        crate::forward::Forwarded::from_json(json)?.add_to(request)?;
    }
    limit_start(request, left);
    Ok(())
}

/// The request must start before its deadline, and within its own timeout.
fn limit_start(request: &mut sheaf_core::RawRequest, left: Option<Duration>) {
    if let Some(left) = left {
        let us = u64::try_from(left.as_micros()).unwrap_or(u64::MAX).max(1);
        let own = request.timeout_us.filter(|&t| t > 0);
        request.timeout_us = Some(own.map_or(us, |t| t.min(us)));
    }
}

/// Decodes a KServe v2 HTTP body, its JSON length in `Inference-Header-Content-Length`.
fn decode_http(
    headers: Option<&HeaderMap>,
    payload: Bytes,
    no_shm: &SharedMemory,
) -> Result<codec::DecodedRequest, ApiError> {
    let header_length = match header(headers, message::HEADER_LENGTH) {
        None => None,
        Some(v) => Some(v.parse::<usize>().map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::BAD_REQUEST,
                "Inference-Header-Content-Length must be a non-negative integer",
            )
        })?),
    };
    Ok(codec::decode_request(payload, header_length, no_shm)?)
}

/// Reads a protobuf `ModelInferRequest`.
fn parse_grpc(payload: Bytes) -> Result<pb::ModelInferRequest, ApiError> {
    pb::ModelInferRequest::decode(payload).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            format!("the payload is no protobuf ModelInferRequest: {e}"),
        )
    })
}

/// Reads and decodes a protobuf `ModelInferRequest`.
fn decode_grpc(payload: Bytes, no_shm: &SharedMemory) -> Result<grpc::convert::Decoded, ApiError> {
    Ok(grpc::convert::decode(parse_grpc(payload)?, no_shm)?)
}
