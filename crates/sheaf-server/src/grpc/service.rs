//! `GRPCInferenceService` over the model manager. Each RPC converts with [`super::convert`],
//! [`super::views`] or the shared `kserve` helpers, asks the manager, and converts back.
//!
//! `ModelStreamInfer`: one task per stream reads requests and starts each at once, so requests
//! on one stream are batched with each other and with all other traffic; a request of a
//! sequence starts once the stream's previous request of that sequence is answered
//! ([`super::sequences`]). Answers are written in request order. A bad request is answered
//! with an `error_message` on the stream, which stays open. At most [`STREAM_IN_FLIGHT`] requests of one stream are outstanding; past that the
//! task stops reading, and HTTP/2 flow control pushes back on the client.

use std::pin::Pin;
use std::sync::Arc;

use futures::stream::FuturesOrdered;
use futures::{Stream, StreamExt};
use sheaf_core::ErrorKind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::error::status;
use super::pb::{self, grpc_inference_service_server::GrpcInferenceService};
use super::sequences::SequenceOrder;
use super::text;
use super::views::statistics;
use crate::access::{Denied, Scope};
use crate::drain::InFlight;
use crate::forward::Forwarded;
use crate::kserve::metadata;
use crate::kserve::repository::{unload, unload_dependents_not_bool};
use crate::request_memory::Held;
use crate::restricted::Api;
use crate::triton_text::{self, TextRequest};
use crate::AppState;

/// What a call that arrives during a shutdown is told.
const SHUTTING_DOWN: &str = "the server is shutting down; send the request to another replica";

/// UNAVAILABLE once the drain refuses work, with `retry-after` (seconds) as HTTP's 503 has.
fn shutting_down() -> Status {
    retry_after(Status::unavailable(SHUTTING_DOWN))
}

/// `status` with `retry-after` (seconds) as HTTP's 503 has.
fn retry_after(mut status: Status) -> Status {
    status.metadata_mut().insert(
        "retry-after",
        tonic::metadata::MetadataValue::from(crate::drain::RETRY_AFTER_S),
    );
    status
}

/// Holds `message`'s bytes in the server's request memory ([`crate::request_memory`]) until
/// the hold is dropped; past its limit, RESOURCE_EXHAUSTED with `retry-after`, as a full queue.
pub(super) fn hold(state: &AppState, message: &impl prost::Message) -> Result<Held, Status> {
    hold_bytes(state, message.encoded_len())
}

/// Holds `bytes` of a request, as [`hold`] does.
fn hold_bytes(state: &AppState, bytes: usize) -> Result<Held, Status> {
    state
        .request_memory
        .hold(bytes)
        .map_err(|full| retry_after(Status::resource_exhausted(full.to_string())))
}

/// The bytes a KServe request holds while it is served: its encoded length, and its numeric
/// typed contents (`fp32_contents`, `int64_contents`…) as they lie decoded, then as tensors.
/// On the wire a small integer takes one byte, decoded an INT64 takes eight; raw and BYTES
/// contents are slices of the message's own bytes.
fn request_bytes(request: &pb::ModelInferRequest) -> usize {
    let typed = request.inputs.iter().filter_map(|i| i.contents.as_ref());
    let decoded: usize = typed
        .map(|c| {
            c.bool_contents.len()
                + 4 * (c.int_contents.len() + c.uint_contents.len() + c.fp32_contents.len())
                + 8 * (c.int64_contents.len() + c.uint64_contents.len() + c.fp64_contents.len())
        })
        .sum();
    prost::Message::encoded_len(request).saturating_add(decoded)
}

/// Admits one request of a stream as work ([`Drain::admit`](crate::drain::Drain::admit)) and
/// holds its bytes ([`request_bytes`]), or says why not.
fn admit_message(
    state: &AppState,
    request: &pb::ModelInferRequest,
) -> Result<(InFlight, Held), String> {
    let work = state.drain.admit().ok_or(SHUTTING_DOWN)?;
    let held = hold_bytes(state, request_bytes(request)).map_err(|s| s.message().to_string())?;
    Ok((work, held))
}

/// Most requests of one stream that are being served at once.
pub const STREAM_IN_FLIGHT: usize = 256;

pub struct InferenceService {
    state: AppState,
}

impl InferenceService {
    pub fn new(state: AppState) -> InferenceService {
        InferenceService { state }
    }

    /// Checks the call's `authorization` metadata (`Bearer KEY`) against the scope of `api`,
    /// and the header of the restricted group that holds `api`.
    fn allow<T>(&self, request: &Request<T>, api: Api) -> Result<(), Status> {
        self.allow_scoped(request, api, Scope::of(api))
    }

    /// As [`Self::allow`], with the key `scope` given.
    fn allow_scoped<T>(&self, request: &Request<T>, api: Api, scope: Scope) -> Result<(), Status> {
        allow(&self.state, request.metadata(), api, scope)
    }

    /// Checks the call as [`Self::allow`], then admits it as work unless a shutdown has begun.
    fn admit<T>(&self, request: &Request<T>, api: Api) -> Result<InFlight, Status> {
        self.allow(request, api)?;
        self.state.drain.admit().ok_or_else(shutting_down)
    }

    /// The ready model `name` (at `version`, unless empty), or its gRPC status.
    fn model(
        &self,
        name: &str,
        v: &str,
    ) -> Result<std::sync::Arc<sheaf_core::ModelHandle>, Status> {
        self.state.manager.get(name, version(v)).map_err(status)
    }
}

/// Checks a call's `authorization` metadata (`Bearer KEY`) against `scope`, and the header of
/// the restricted group that holds `api`.
pub(super) fn allow(
    state: &AppState,
    metadata: &tonic::metadata::MetadataMap,
    api: Api,
    scope: Scope,
) -> Result<(), Status> {
    let authorization = metadata.get("authorization").map(|v| v.as_bytes());
    state
        .access
        .check(scope, authorization)
        .map_err(|denied| match denied {
            Denied::Unauthenticated => Status::unauthenticated(denied.message()),
            Denied::NotAdmin => Status::permission_denied(denied.message()),
        })?;
    let header = |name: &str| metadata.get(name).map(|v| v.as_bytes());
    state
        .access
        .grpc_restricted
        .check(api, header)
        .map_err(Status::permission_denied)
}

fn version(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

/// Runs one inference request through the manager. The model is looked up before the request
/// is decoded, as over HTTP, so that an unknown model is NOT_FOUND whatever the body holds.
async fn infer(
    state: &AppState,
    request: pb::ModelInferRequest,
    forwarded: &Forwarded,
) -> Result<Response<pb::ModelInferResponse>, Status> {
    let handle = match state
        .manager
        .get_or_load(&request.model_name, version(&request.model_version))
        .await
    {
        Ok(handle) => handle,
        // A model served elsewhere: the queue's workers answer it.
        Err(e) if e.kind == ErrorKind::ModelNotFound => match &state.broker {
            Some(broker) => {
                let sequence = convert::sequence_of(&request).map_err(status)?;
                return broker
                    .forward_grpc(&request, sequence.as_ref(), forwarded)
                    .await
                    .map(Response::new);
            }
            None => return Err(status(e)),
        },
        Err(e) => return Err(status(e)),
    };
    if handle.is_generator() {
        let id = request.id.clone();
        let decoded = convert::decode(request, &state.shm).map_err(status)?;
        let asked = TextRequest::from_tensors(&handle, &decoded.request).map_err(status)?;
        if asked.streams() {
            return Err(status(text::unary_stream()));
        }
        let answer = triton_text::run_once(state, &handle, asked)
            .await
            .map_err(status)?;
        return Ok(Response::new(text::response(&handle, &id, answer)));
    }
    let mut decoded = convert::decode(request, &state.shm).map_err(status)?;
    forwarded.add_to(&mut decoded.request).map_err(status)?;
    crate::trace::prepare(state, &mut decoded.request);
    let mut response = state
        .manager
        .infer(&handle, decoded.request)
        .await
        .map_err(status)?;
    crate::trace::sample(state, &mut response, sheaf_core::trace::Protocol::Grpc);
    let receipt = response.receipt.take();
    let encoded = convert::encode(response, decoded.typed, &decoded.shm_outputs, &state.shm)
        .map_err(status)?;
    let mut answer = Response::new(encoded);
    // The account closes once the message is written (see crate::stages).
    if let Some(receipt) = receipt {
        answer.extensions_mut().insert(receipt);
    }
    Ok(answer)
}

/// Answers one request on a stream: the response, or its error with the request's id.
async fn stream_one(
    state: AppState,
    request: pb::ModelInferRequest,
    forwarded: Arc<Forwarded>,
) -> pb::ModelStreamInferResponse {
    let (id, model_name, model_version) = (
        request.id.clone(),
        request.model_name.clone(),
        request.model_version.clone(),
    );
    let arrival = tokio::time::Instant::now();
    match infer(&state, request, &forwarded).await {
        Ok(mut response) => {
            // On a stream, the account closes when the answer is queued for the stream: the
            // stream's own writes are shared by its answers.
            if let Some(receipt) = response
                .extensions_mut()
                .remove::<sheaf_core::stages::Receipt>()
            {
                receipt.sent(arrival);
            }
            pb::ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(response.into_inner()),
            }
        }
        Err(e) => refused(model_name, model_version, id, e.message()),
    }
}

/// Whether `request` is for a model that streams its responses: a streaming model, or a
/// pipeline with a model step that is one ([`sheaf_core::ModelManager::streams`]). In the
/// `on_demand` control mode a model that is not loaded is loaded to find out, as the unary path
/// would load it; one that cannot load counts as not streaming, and its request fails there.
async fn streams(state: &AppState, request: &pb::ModelInferRequest) -> bool {
    match state
        .manager
        .loaded(&request.model_name, version(&request.model_version))
        .await
    {
        // A generation model answers on a stream as it is asked: in pieces or once.
        Ok(handle) => handle.is_generator() || state.manager.streams(&handle).await,
        Err(_) => false,
    }
}

/// Triton's request parameter that asks for an empty response flagged final after a streaming
/// model's last one, and the response parameter that flags it.
const ENABLE_EMPTY_FINAL: &str = "triton_enable_empty_final_response";
const FINAL_RESPONSE: &str = "triton_final_response";

/// Answers one request to a streaming model on a stream: each of its responses as it comes
/// (each flagged not final when the client asked for the empty final one), then that final
/// response, or the error that cut the stream short. `work` is held until the end. With
/// `remote`, the model is served by the queue's workers, asked for a stream; one that answers
/// once gives that answer alone, as on the unary path.
async fn stream_many(
    state: AppState,
    request: pb::ModelInferRequest,
    tx: mpsc::Sender<Result<pb::ModelStreamInferResponse, Status>>,
    work: impl Send + 'static,
    remote: Option<std::sync::Arc<crate::broker::Broker>>,
    forwarded: Arc<Forwarded>,
) {
    use crate::broker::gateway::{grpc_answer, Forwarded};
    use pb::infer_parameter::ParameterChoice;
    let (id, model_name, model_version) = (
        request.id.clone(),
        request.model_name.clone(),
        request.model_version.clone(),
    );
    let empty_final = matches!(
        request
            .parameters
            .get(ENABLE_EMPTY_FINAL)
            .and_then(|p| p.parameter_choice.as_ref()),
        Some(ParameterChoice::BoolParam(true))
    );
    let flag = |last: bool| {
        std::collections::HashMap::from([(
            FINAL_RESPONSE.to_string(),
            pb::InferParameter {
                parameter_choice: Some(ParameterChoice::BoolParam(last)),
            },
        )])
    };
    let send = |answer: pb::ModelStreamInferResponse| {
        let tx = tx.clone();
        async move { tx.send(Ok(answer)).await.is_ok() }
    };
    let refuse = |message: &str| {
        refused(
            model_name.clone(),
            model_version.clone(),
            id.clone(),
            message,
        )
    };
    let answered = |r: pb::ModelInferResponse| pb::ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(r),
    };
    let handle;
    let shm_outputs;
    let mut parts: futures::stream::BoxStream<'_, Result<pb::ModelInferResponse, String>> =
        match remote {
            Some(broker) => match broker.forward_grpc_stream(&request, &forwarded).await {
                Forwarded::Once(answer) => {
                    let answer = match grpc_answer(answer) {
                        Ok(r) => answered(r),
                        Err(status) => refuse(status.message()),
                    };
                    send(answer).await;
                    return;
                }
                Forwarded::Stream(answers) => ReceiverStream::new(answers)
                    .map(|a| grpc_answer(a).map_err(|s| s.message().to_string()))
                    .boxed(),
            },
            None => {
                handle = match state
                    .manager
                    .get_or_load(&request.model_name, version(&request.model_version))
                    .await
                {
                    Ok(h) => h,
                    Err(e) => {
                        send(refuse(&e.message)).await;
                        return;
                    }
                };
                if handle.is_generator() {
                    let asked = convert::decode(request, &state.shm)
                        .and_then(|d| TextRequest::from_tensors(&handle, &d.request));
                    let answers = match asked {
                        Ok(asked) => triton_text::run(&state, &handle, asked).await,
                        Err(e) => Err(e),
                    };
                    let answers = match answers {
                        Ok(answers) => answers,
                        Err(e) => {
                            send(refuse(&e.message)).await;
                            return;
                        }
                    };
                    let (model, id) = (handle.clone(), id.clone());
                    answers
                        .map(move |a| {
                            a.map(|a| text::response(&model, &id, a))
                                .map_err(|e| e.message)
                        })
                        .boxed()
                } else {
                    let decoded = match convert::decode(request, &state.shm).and_then(|mut d| {
                        forwarded.add_to(&mut d.request)?;
                        Ok(d)
                    }) {
                        Ok(d) => d,
                        Err(e) => {
                            send(refuse(&e.message)).await;
                            return;
                        }
                    };
                    let typed = decoded.typed;
                    shm_outputs = decoded.shm_outputs;
                    let responses = match state.manager.infer_stream(&handle, decoded.request).await
                    {
                        Ok(r) => r,
                        Err(e) => {
                            send(refuse(&e.message)).await;
                            return;
                        }
                    };
                    let (outputs, shm) = (&shm_outputs, &state.shm);
                    responses
                        .map(move |response| {
                            response
                                .and_then(|r| convert::encode(r, typed, outputs, shm))
                                .map_err(|e| e.message)
                        })
                        .boxed()
                }
            }
        };
    while let Some(part) = parts.next().await {
        let answer = match part {
            Ok(mut r) => {
                if empty_final {
                    // Beside the model's own parameters.
                    r.parameters.extend(flag(false));
                }
                answered(r)
            }
            Err(message) => refuse(&message),
        };
        if !send(answer).await {
            return;
        }
    }
    if empty_final {
        send(pb::ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(pb::ModelInferResponse {
                model_name: model_name.clone(),
                model_version: model_version.clone(),
                id: id.clone(),
                parameters: flag(true),
                ..Default::default()
            }),
        })
        .await;
    }
    drop(work);
}

/// The queue that serves `request`'s model when this server does not (a gateway), unless the
/// request belongs to a sequence (those keep their own route, see [`crate::broker`]).
async fn remote(
    state: &AppState,
    request: &pb::ModelInferRequest,
) -> Option<std::sync::Arc<crate::broker::Broker>> {
    let broker = state.broker.as_ref()?;
    if !matches!(convert::sequence_of(request), Ok(None)) {
        return None;
    }
    match state
        .manager
        .loaded(&request.model_name, version(&request.model_version))
        .await
    {
        Err(e) if e.kind == ErrorKind::ModelNotFound => Some(broker.clone()),
        _ => None,
    }
}

/// The stream answer that refuses the request of `model_name`, `model_version` and `id` with
/// `message`.
fn refused(
    model_name: String,
    model_version: String,
    id: String,
    message: &str,
) -> pb::ModelStreamInferResponse {
    pb::ModelStreamInferResponse {
        error_message: message.to_string(),
        infer_response: Some(pb::ModelInferResponse {
            model_name,
            model_version,
            id,
            ..Default::default()
        }),
    }
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        request: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        self.allow(&request, Api::Health)?;
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        request: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        self.allow(&request, Api::Health)?;
        Ok(Response::new(pb::ServerReadyResponse {
            ready: self.state.ready_checked().await,
        }))
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        // Health, in Triton's categories; it names a model, so it takes an API key as the
        // model's metadata does.
        self.allow_scoped(&request, Api::Health, Scope::Inference)?;
        let r = request.into_inner();
        // The protocol has only a flag: a model nobody knows is not ready (as Triton answers,
        // and tritonclient's `is_model_ready` expects).
        let ready = matches!(
            self.state
                .manager
                .readiness_checked(&r.name, version(&r.version))
                .await,
            Ok(sheaf_core::Readiness::Ready)
        );
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        request: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        self.allow(&request, Api::Metadata)?;
        Ok(Response::new(pb::ServerMetadataResponse {
            name: self.state.id.to_string(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: metadata::EXTENSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        self.allow(&request, Api::Metadata)?;
        let r = request.into_inner();
        let m = self
            .state
            .manager
            .metadata(&r.name, version(&r.version))
            .map_err(status)?;
        let tensors = |specs: &[sheaf_backend::TensorSpec]| {
            specs
                .iter()
                .map(|s| pb::model_metadata_response::TensorMetadata {
                    name: s.name.clone(),
                    datatype: s.dtype.as_str().to_string(),
                    shape: s.shape.clone(),
                })
                .collect()
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            inputs: tensors(&m.inputs),
            outputs: tensors(&m.outputs),
            name: m.name,
            versions: m.versions,
            platform: m.platform.to_string(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let _work = self.admit(&request, Api::Inference)?;
        let _held = hold_bytes(&self.state, request_bytes(request.get_ref()))?;
        let forwarded = Forwarded::from_grpc(self.state.forward_grpc.as_ref(), request.metadata())
            .map_err(status)?;
        infer(&self.state, request.into_inner(), &forwarded).await
    }

    type ModelStreamInferStream = ResponseStream;

    async fn model_stream_infer(
        &self,
        request: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        self.allow(&request, Api::Inference)?;
        // The call's metadata, forwarded to each of its requests.
        let forwarded = Arc::new(
            Forwarded::from_grpc(self.state.forward_grpc.as_ref(), request.metadata())
                .map_err(status)?,
        );
        let mut inbound = request.into_inner();
        let state = self.state.clone();
        // Bounded: the task waits for the client to read before it answers more.
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut pending = FuturesOrdered::new();
            let mut order = SequenceOrder::default();
            let mut reading = true;
            loop {
                tokio::select! {
                    next = inbound.message(), if reading && pending.len() < STREAM_IN_FLIGHT => match next {
                        // Each request is admitted on its own, and counts as work, its bytes
                        // held, until its answer is written to the stream.
                        Ok(Some(request)) => match admit_message(&state, &request) {
                            // A streaming (decoupled) model's responses go out as they come,
                            // beside the other requests' answers; so do those of a model the
                            // queue's workers serve, which may stream.
                            Ok(work) if state.broker.is_some() && remote(&state, &request).await.is_some() => {
                                let broker = state.broker.clone();
                                tokio::spawn(stream_many(state.clone(), request, tx.clone(), work, broker, forwarded.clone()));
                            }
                            Ok(work) if streams(&state, &request).await => {
                                let turn = order.turn(&request);
                                tokio::spawn(turn.serve(stream_many(state.clone(), request, tx.clone(), work, None, forwarded.clone())));
                            }
                            Ok(work) => {
                                let answer = order.turn(&request).serve(stream_one(state.clone(), request, forwarded.clone()));
                                pending.push_back(futures::future::Either::Left(async move {
                                    (answer.await, Some(work))
                                }));
                            }
                            Err(why) => {
                                let answer = refused(
                                    request.model_name,
                                    request.model_version,
                                    request.id,
                                    &why,
                                );
                                pending.push_back(futures::future::Either::Right(
                                    futures::future::ready((answer, None)),
                                ));
                            }
                        },
                        Ok(None) => reading = false,
                        Err(e) => {
                            tracing::debug!(error = %e, "inference stream closed by the client");
                            reading = false;
                        }
                    },
                    Some((answer, work)) = pending.next(), if !pending.is_empty() => {
                        let sent = tx.send(Ok(answer)).await;
                        drop(work);
                        if sent.is_err() {
                            break;
                        }
                    }
                    else => break,
                }
            }
        });
        Ok(Response::new(
            Box::pin(ReceiverStream::new(rx)) as ResponseStream
        ))
    }

    async fn model_config(
        &self,
        request: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        self.allow(&request, Api::ModelConfig)?;
        let r = request.into_inner();
        let handle = self.model(&r.name, &r.version)?;
        let signature = self.state.manager.signature_of(&handle);
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(metadata::model_config(&handle, &signature).into()),
        }))
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        self.allow(&request, Api::Statistics)?;
        let r = request.into_inner();
        let model_stats = self
            .state
            .manager
            .statistics(&r.name, version(&r.version))
            .map_err(status)?
            .iter()
            .map(statistics)
            .collect();
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        self.allow(&request, Api::ModelRepository)?;
        let only_ready = request.into_inner().ready;
        let models = self
            .state
            .manager
            .index(only_ready)
            .into_iter()
            .map(|m| pb::repository_index_response::ModelIndex {
                name: m.name,
                version: m.version,
                state: m.state.as_str().into(),
                reason: m.reason.unwrap_or_default(),
                devices: m.devices,
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let _work = self.admit(&request, Api::ModelRepository)?;
        let request = request.into_inner();
        use crate::kserve::repository::LoadValue;
        use pb::model_repository_parameter::ParameterChoice;
        let params = request.parameters.iter().map(|(k, v)| {
            let value = match &v.parameter_choice {
                Some(ParameterChoice::StringParam(s)) => LoadValue::Text(s),
                Some(ParameterChoice::BytesParam(b)) => LoadValue::Bytes(b),
                _ => LoadValue::Other,
            };
            (k.as_str(), value)
        });
        let asked = crate::kserve::repository::load_parameters(params).map_err(status)?;
        if let Some(why) = crate::kserve::repository::files_refused(&self.state.access, &asked) {
            return Err(Status::permission_denied(why));
        }
        crate::kserve::repository::load(&self.state.manager, &request.model_name, asked)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        use pb::model_repository_parameter::ParameterChoice;
        let _work = self.admit(&request, Api::ModelRepository)?;
        let request = request.into_inner();
        let dependents = match request
            .parameters
            .get("unload_dependents")
            .and_then(|p| p.parameter_choice.as_ref())
        {
            None => false,
            Some(ParameterChoice::BoolParam(b)) => *b,
            Some(other) => return Err(status(unload_dependents_not_bool(&format!("{other:?}")))),
        };
        unload(&self.state.manager, &request.model_name, dependents)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn log_settings(
        &self,
        request: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        use crate::logging::Setting;
        use pb::log_settings_request::setting_value::ParameterChoice as Asked;
        use pb::log_settings_response::setting_value::ParameterChoice as Given;
        self.allow(&request, Api::Logging)?;
        let request = request.into_inner();
        let mut changes = Vec::with_capacity(request.settings.len());
        for (name, value) in &request.settings {
            let setting = match &value.parameter_choice {
                Some(Asked::BoolParam(b)) => Setting::Bool(*b),
                Some(Asked::Uint32Param(n)) => Setting::Number(u64::from(*n)),
                Some(Asked::StringParam(s)) => Setting::Text(s.as_str().into()),
                None => {
                    return Err(Status::invalid_argument(format!(
                        "log setting '{name}' has no value"
                    )))
                }
            };
            changes.push((name.as_str(), setting));
        }
        crate::logging::update(changes).map_err(status)?;
        let settings = crate::logging::current()
            .into_iter()
            .map(|(name, value)| {
                let given = match value {
                    Setting::Bool(b) => Given::BoolParam(b),
                    Setting::Number(n) => Given::Uint32Param(u32::try_from(n).unwrap_or(u32::MAX)),
                    Setting::Text(t) => Given::StringParam(t.into_owned()),
                };
                let value = pb::log_settings_response::SettingValue {
                    parameter_choice: Some(given),
                };
                (name.to_string(), value)
            })
            .collect();
        Ok(Response::new(pb::LogSettingsResponse { settings }))
    }

    async fn trace_setting(
        &self,
        request: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        use sheaf_core::trace::Change;
        self.allow(&request, Api::Trace)?;
        let request = request.into_inner();
        let model = Some(request.model_name.as_str());
        let changes: Vec<(String, Change)> = request
            .settings
            .into_iter()
            .map(|(name, value)| {
                let change = if value.value.is_empty() {
                    Change::Clear
                } else {
                    Change::Set(value.value)
                };
                (name, change)
            })
            .collect();
        if !changes.is_empty() {
            crate::trace::update(&self.state, model, &changes).map_err(status)?;
        }
        let settings = crate::trace::settings(&self.state, model)
            .map_err(status)?
            .into_iter()
            .map(|(name, value)| {
                (
                    name.to_string(),
                    pb::trace_setting_response::SettingValue { value },
                )
            })
            .collect();
        Ok(Response::new(pb::TraceSettingResponse { settings }))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        self.allow(&request, Api::SharedMemory)?;
        let name = request.into_inner().name;
        let regions = self
            .state
            .shm
            .status(&name)
            .map_err(status)?
            .into_iter()
            .map(|r| {
                (
                    r.name.clone(),
                    pb::system_shared_memory_status_response::RegionStatus {
                        name: r.name,
                        key: r.key,
                        offset: r.offset,
                        byte_size: r.byte_size,
                    },
                )
            })
            .collect();
        Ok(Response::new(pb::SystemSharedMemoryStatusResponse {
            regions,
        }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        self.allow(&request, Api::SharedMemory)?;
        let r = request.into_inner();
        self.state
            .shm
            .register(&r.name, &r.key, r.offset, r.byte_size)
            .map_err(status)?;
        Ok(Response::new(pb::SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        self.allow(&request, Api::SharedMemory)?;
        self.state.shm.unregister(&request.into_inner().name);
        Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        self.allow(&request, Api::SharedMemory)?;
        match request.into_inner().name.as_str() {
            "" => Ok(Response::new(pb::CudaSharedMemoryStatusResponse::default())),
            name => Err(status(crate::shm::no_cuda_region(name))),
        }
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        self.allow(&request, Api::SharedMemory)?;
        Err(Status::unimplemented(crate::shm::NO_CUDA))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        self.allow(&request, Api::SharedMemory)?;
        Ok(Response::new(pb::CudaSharedMemoryUnregisterResponse {}))
    }
}
