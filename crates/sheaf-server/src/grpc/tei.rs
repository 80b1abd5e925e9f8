//! Hugging Face text-embeddings-inference's gRPC API (package `tei.v1`, from
//! `proto/tei.proto`) for the repository's text encoders, on the gRPC port beside KServe's
//! service, so that clients generated from TEI's proto work against sheaf unchanged.
//!
//! Served: `Info`; `Embed.Embed` and `Embed.EmbedStream`; `Embed.EmbedAll` and
//! `Embed.EmbedAllStream` (each token's state, unpooled); `Rerank.Rerank` and
//! `Rerank.RerankStream`; `Tokenize.Tokenize`, `TokenizeStream`, `Decode` and `DecodeStream`.
//! TEI serves one model; here a call names its text encoder in the `model` metadata key, and may
//! leave it out when one encoder is loaded. Every answer is the core's
//! ([`sheaf_core::embed`]), as TEI's HTTP routes give it ([`crate::tei`]): a score is the
//! cosine of two texts' vectors. proto3 cannot tell an unset flag from `false`, so `truncate`
//! also follows the model's `embedding.truncate` (TEI's `--auto-truncate`), and `normalize` is
//! as sent; `truncation_direction` says which end of a long text is cut (`LEFT`: its start). `prompt_name` (`Embed`, `EmbedAll`, `Tokenize`) names one of the model's prompts,
//! put before the text. Sparse embeddings and classifiers (`EmbedSparse`, `Predict`) are
//! UNIMPLEMENTED, naming why; a request that does not validate is INVALID_ARGUMENT.
//!
//! A streamed call (`EmbedStream`, `EmbedAllStream`, `TokenizeStream`, `DecodeStream`) starts each message as it
//! arrives, so one stream's texts are batched with each other and with all other traffic, and
//! answers them in order; at most [`super::service::STREAM_IN_FLIGHT`] at once. A message that
//! fails ends the stream with its status, as TEI's does. `RerankStream` takes one (query, text)
//! pair a message and answers once, with every pair ranked.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::FuturesOrdered;
use futures::{Stream, StreamExt};
use sheaf_core::embed::{
    one_against_others, ranked, EmbedInput, EmbedRequest, EmbedTimes, Embeddings, TruncationSide,
};
use sheaf_core::{ErrorKind, InferError, ModelHandle};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::error::status;
use super::service::{allow, hold, STREAM_IN_FLIGHT};
use super::tei_pb as pb;
use crate::access::Scope;
use crate::drain::InFlight;
use crate::restricted::Api;
use crate::AppState;

type Answers<T> = std::pin::Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The five services over one state.
#[derive(Clone)]
pub struct TeiService {
    state: AppState,
}

impl TeiService {
    pub fn new(state: AppState) -> TeiService {
        TeiService { state }
    }

    /// Checks the call's key for `api`, then admits it as work unless a shutdown has begun.
    fn admit(&self, metadata: &MetadataMap, api: Api) -> Result<InFlight, Status> {
        allow(&self.state, metadata, api, Scope::of(api))?;
        self.state
            .drain
            .admit()
            .ok_or_else(|| Status::unavailable("the server is shutting down"))
    }

    /// A unary inference call: admitted, its bytes held while it is served, its message
    /// answered by `serve` on the encoder the call names.
    async fn unary<M, A, F, Fut>(
        &self,
        request: Request<M>,
        serve: F,
    ) -> Result<Response<A>, Status>
    where
        M: prost::Message + Send,
        F: FnOnce(Arc<ModelHandle>, M) -> Fut + Send,
        Fut: Future<Output = Result<A, Status>> + Send,
    {
        let _work = self.admit(request.metadata(), Api::Inference)?;
        let _held = hold(&self.state, request.get_ref())?;
        let handle = encoder(&self.state, request.metadata()).await?;
        serve(handle, request.into_inner()).await.map(Response::new)
    }

    /// A streamed inference call: admitted, and each message answered by `serve` on the
    /// encoder the call names, in order ([`ordered`]).
    async fn streamed<M, A, F, Fut>(
        &self,
        request: Request<Streaming<M>>,
        serve: F,
    ) -> Result<Response<Answers<A>>, Status>
    where
        M: prost::Message + Send + 'static,
        A: Send + 'static,
        F: Fn(Arc<ModelHandle>, M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<A, Status>> + Send + 'static,
    {
        let work = self.admit(request.metadata(), Api::Inference)?;
        let handle = encoder(&self.state, request.metadata()).await?;
        Ok(Response::new(ordered(
            self.state.clone(),
            request.into_inner(),
            work,
            move |m| serve(handle.clone(), m),
        )))
    }
}

/// The text encoder the call names in its `model` metadata, or the only one loaded.
async fn encoder(state: &AppState, metadata: &MetadataMap) -> Result<Arc<ModelHandle>, Status> {
    let model = match metadata.get("model") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| Status::invalid_argument("the `model` metadata is not text"))?
                .to_string(),
        ),
        None => None,
    };
    crate::texts::encoder(state, model).await.map_err(status)
}

fn invalid(message: impl Into<String>) -> Status {
    status(InferError::new(ErrorKind::InvalidInput, message))
}

/// The side `truncation_direction` names; a number the enum does not hold is refused.
fn truncation_side(direction: i32) -> Result<TruncationSide, Status> {
    match pb::TruncationDirection::try_from(direction) {
        Ok(pb::TruncationDirection::Right) => Ok(TruncationSide::Right),
        Ok(pb::TruncationDirection::Left) => Ok(TruncationSide::Left),
        Err(_) => Err(invalid(format!(
            "truncation_direction {direction} is neither RIGHT (0) nor LEFT (1)"
        ))),
    }
}

/// Refuses an empty text by the field's name.
fn non_empty(text: &str, field: &str) -> Result<(), Status> {
    if text.is_empty() {
        return Err(invalid(format!(
            "`{field}` is an empty string: there is nothing to embed"
        )));
    }
    Ok(())
}

/// `truncate` as sent, or the model's own default when the call leaves it false, and the side
/// `truncation_direction` names.
fn truncate(request: &mut EmbedRequest, asked: bool, side: TruncationSide) {
    request.truncate = asked.then_some(true);
    request.truncation_side = side;
}

/// The characters of `texts`.
fn chars(texts: &[String]) -> usize {
    texts.iter().map(|t| t.chars().count()).sum()
}

/// TEI's account of a call: its texts' characters and tokens, and where its time went.
fn metadata(chars: usize, tokens: usize, times: EmbedTimes, started: Instant) -> pb::Metadata {
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    pb::Metadata {
        compute_chars: u32::try_from(chars).unwrap_or(u32::MAX),
        compute_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
        total_time_ns: ns(started.elapsed()),
        tokenization_time_ns: ns(times.tokenization),
        queue_time_ns: ns(times.queue),
        inference_time_ns: ns(times.inference),
    }
}

/// Answers each message of `inbound` with `serve`, started as it arrives and written in order;
/// the first error ends the stream. The call counts as work until its stream ends, and each
/// message's bytes are held until its answer is written.
fn ordered<M, A, F, Fut>(
    state: AppState,
    inbound: Streaming<M>,
    work: InFlight,
    serve: F,
) -> Answers<A>
where
    M: prost::Message + Send + 'static,
    A: Send + 'static,
    F: Fn(M) -> Fut + Send + 'static,
    Fut: Future<Output = Result<A, Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let _work = work;
        let mut inbound = inbound;
        let mut pending = FuturesOrdered::new();
        let mut reading = true;
        loop {
            tokio::select! {
                next = inbound.message(), if reading && pending.len() < STREAM_IN_FLIGHT => match next {
                    Ok(Some(message)) => {
                        let answer = hold(&state, &message).map(|held| (held, serve(message)));
                        pending.push_back(async move {
                            let (_held, answer) = answer?;
                            answer.await
                        });
                    }
                    Ok(None) => reading = false,
                    Err(e) => {
                        tracing::debug!(error = %e, "TEI stream closed by the client");
                        reading = false;
                    }
                },
                Some(answer) = pending.next(), if !pending.is_empty() => {
                    let failed = answer.is_err();
                    if tx.send(answer).await.is_err() || failed {
                        break;
                    }
                }
                else => break,
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

/// The request for one message's text (not empty, cut on the side it names where `truncate`
/// asks), and the text, for the call's account.
fn one_text(
    inputs: String,
    direction: i32,
    truncate_asked: bool,
    prompt_name: Option<String>,
) -> Result<(Vec<String>, EmbedRequest), Status> {
    let side = truncation_side(direction)?;
    non_empty(&inputs, "inputs")?;
    let texts = vec![inputs];
    let mut request = EmbedRequest::new(EmbedInput::Texts(texts.clone()));
    request.prompt_name = prompt_name;
    truncate(&mut request, truncate_asked, side);
    Ok((texts, request))
}

/// Embeds one `Embed` message's text.
async fn embed_one(
    handle: Arc<ModelHandle>,
    message: pb::EmbedRequest,
) -> Result<pb::EmbedResponse, Status> {
    let started = Instant::now();
    let (texts, mut request) = one_text(
        message.inputs,
        message.truncation_direction,
        message.truncate,
        message.prompt_name,
    )?;
    request.normalize = Some(message.normalize);
    let mut answer = handle.embed(request).await.map_err(status)?;
    Ok(pb::EmbedResponse {
        metadata: Some(metadata(
            chars(&texts),
            answer.tokens,
            answer.times,
            started,
        )),
        embeddings: answer.vectors.pop().unwrap_or_default(),
    })
}

/// The token states of one `EmbedAll` message's text.
async fn embed_all_one(
    handle: Arc<ModelHandle>,
    message: pb::EmbedAllRequest,
) -> Result<pb::EmbedAllResponse, Status> {
    let started = Instant::now();
    let (texts, request) = one_text(
        message.inputs,
        message.truncation_direction,
        message.truncate,
        message.prompt_name,
    )?;
    let mut answer = handle.embed_tokens(request).await.map_err(status)?;
    Ok(pb::EmbedAllResponse {
        metadata: Some(metadata(
            chars(&texts),
            answer.tokens,
            answer.times,
            started,
        )),
        token_embeddings: answer
            .states
            .pop()
            .unwrap_or_default()
            .into_iter()
            .map(|embeddings| pb::TokenEmbedding { embeddings })
            .collect(),
    })
}

#[tonic::async_trait]
impl pb::info_server::Info for TeiService {
    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let _work = self.admit(request.metadata(), Api::Metadata)?;
        let handle = encoder(&self.state, request.metadata()).await?;
        let e = handle.encoder_info().map_err(status)?;
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(pb::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            sha: None,
            docker_label: None,
            model_id: e.name.clone(),
            model_sha: None,
            model_dtype: crate::tei::dtype_name(e.dtype),
            model_type: pb::ModelType::Embedding as i32,
            max_concurrent_requests: count(e.max_queue_size),
            max_input_length: count(e.max_input_tokens),
            max_batch_tokens: count(e.max_batch_tokens),
            max_batch_requests: (e.max_batch_size > 0).then(|| count(e.max_batch_size)),
            max_client_batch_size: count(e.max_inputs),
            tokenization_workers: count(crate::tei::tokenization_workers()),
        }))
    }
}

/// What the unserved calls are told.
fn no_sparse() -> Status {
    Status::unimplemented(crate::tei::NO_SPARSE)
}

fn no_classifier() -> Status {
    Status::unimplemented(crate::tei::NO_CLASSIFIER)
}

#[tonic::async_trait]
impl pb::embed_server::Embed for TeiService {
    async fn embed(
        &self,
        request: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedResponse>, Status> {
        self.unary(request, embed_one).await
    }

    type EmbedStreamStream = Answers<pb::EmbedResponse>;

    async fn embed_stream(
        &self,
        request: Request<Streaming<pb::EmbedRequest>>,
    ) -> Result<Response<Self::EmbedStreamStream>, Status> {
        self.streamed(request, embed_one).await
    }

    async fn embed_sparse(
        &self,
        _: Request<pb::EmbedSparseRequest>,
    ) -> Result<Response<pb::EmbedSparseResponse>, Status> {
        Err(no_sparse())
    }

    type EmbedSparseStreamStream = Answers<pb::EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        _: Request<Streaming<pb::EmbedSparseRequest>>,
    ) -> Result<Response<Self::EmbedSparseStreamStream>, Status> {
        Err(no_sparse())
    }

    async fn embed_all(
        &self,
        request: Request<pb::EmbedAllRequest>,
    ) -> Result<Response<pb::EmbedAllResponse>, Status> {
        self.unary(request, embed_all_one).await
    }

    type EmbedAllStreamStream = Answers<pb::EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        request: Request<Streaming<pb::EmbedAllRequest>>,
    ) -> Result<Response<Self::EmbedAllStreamStream>, Status> {
        self.streamed(request, embed_all_one).await
    }
}

#[tonic::async_trait]
impl pb::predict_server::Predict for TeiService {
    async fn predict(
        &self,
        _: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        Err(no_classifier())
    }

    async fn predict_pair(
        &self,
        _: Request<pb::PredictPairRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        Err(no_classifier())
    }

    type PredictStreamStream = Answers<pb::PredictResponse>;

    async fn predict_stream(
        &self,
        _: Request<Streaming<pb::PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        Err(no_classifier())
    }

    type PredictPairStreamStream = Answers<pb::PredictResponse>;

    async fn predict_pair_stream(
        &self,
        _: Request<Streaming<pb::PredictPairRequest>>,
    ) -> Result<Response<Self::PredictPairStreamStream>, Status> {
        Err(no_classifier())
    }
}

/// Refuses `raw_scores`: a cosine has no logits before it.
fn scored(raw_scores: bool) -> Result<(), Status> {
    if raw_scores {
        return Err(invalid(
            "raw_scores is not supported: a score is the cosine of two texts' vectors, with no \
             logits before it",
        ));
    }
    Ok(())
}

/// The ranks of `scores` (the text at each place scored against its query), best first.
fn ranks(scores: &[f32], texts: &[String], return_text: bool) -> Vec<pb::Rank> {
    ranked(scores, 0)
        .into_iter()
        .map(|(index, score)| pb::Rank {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            text: return_text.then(|| texts[index].clone()),
            score,
        })
        .collect()
}

#[tonic::async_trait]
impl pb::rerank_server::Rerank for TeiService {
    async fn rerank(
        &self,
        request: Request<pb::RerankRequest>,
    ) -> Result<Response<pb::RerankResponse>, Status> {
        let started = Instant::now();
        let _work = self.admit(request.metadata(), Api::Inference)?;
        let _held = hold(&self.state, request.get_ref())?;
        let handle = encoder(&self.state, request.metadata()).await?;
        let m = request.into_inner();
        let side = truncation_side(m.truncation_direction)?;
        scored(m.raw_scores)?;
        let texts =
            one_against_others(m.query, m.texts.iter().cloned(), ("query", "texts"), "rank")
                .map_err(status)?;
        let mut request = EmbedRequest::new(EmbedInput::Texts(texts.clone()));
        truncate(&mut request, m.truncate, side);
        let answer = handle.embed(request).await.map_err(status)?;
        Ok(Response::new(pb::RerankResponse {
            ranks: ranks(&answer.scores(1), &m.texts, m.return_text),
            metadata: Some(metadata(
                chars(&texts),
                answer.tokens,
                answer.times,
                started,
            )),
        }))
    }

    async fn rerank_stream(
        &self,
        request: Request<Streaming<pb::RerankStreamRequest>>,
    ) -> Result<Response<pb::RerankResponse>, Status> {
        let started = Instant::now();
        let _work = self.admit(request.metadata(), Api::Inference)?;
        let handle = encoder(&self.state, request.metadata()).await?;
        let mut inbound = request.into_inner();
        // The pairs are checked as they arrive and embedded together once the stream ends, so
        // they share batches; the first message says whether to return the texts.
        let mut pending = FuturesOrdered::new();
        let mut texts = Vec::new();
        let mut first = None;
        let mut all_chars = 0;
        let mut held = Vec::new();
        while let Some(m) = inbound.message().await? {
            held.push(hold(&self.state, &m)?);
            let side = truncation_side(m.truncation_direction)?;
            let (raw_scores, _) = *first.get_or_insert((m.raw_scores, m.return_text));
            scored(raw_scores)?;
            non_empty(&m.query, "query")?;
            non_empty(&m.text, "text")?;
            if texts.len() >= sheaf_core::embed::MAX_INPUTS {
                return Err(invalid(format!(
                    "the stream holds more than {} pairs; at most that many fit one ranking",
                    sheaf_core::embed::MAX_INPUTS
                )));
            }
            texts.push(m.text.clone());
            all_chars += m.query.chars().count() + m.text.chars().count();
            let mut request = EmbedRequest::new(EmbedInput::Texts(vec![m.query, m.text]));
            truncate(&mut request, m.truncate, side);
            let handle = handle.clone();
            pending.push_back(async move { handle.embed(request).await });
        }
        if texts.is_empty() {
            return Err(invalid("the stream held no pair: there is nothing to rank"));
        }
        let answers: Vec<Embeddings> = pending
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, InferError>>()
            .map_err(status)?;
        let scores: Vec<f32> = answers
            .iter()
            .map(|a| a.scores(1).first().copied().unwrap_or(0.0))
            .collect();
        let tokens = answers.iter().map(|a| a.tokens).sum();
        let times = answers
            .iter()
            .fold(EmbedTimes::default(), |t, a| EmbedTimes {
                tokenization: t.tokenization + a.times.tokenization,
                queue: t.queue.max(a.times.queue),
                inference: t.inference.max(a.times.inference),
            });
        Ok(Response::new(pb::RerankResponse {
            ranks: ranks(&scores, &texts, first.is_some_and(|f| f.1)),
            metadata: Some(metadata(all_chars, tokens, times, started)),
        }))
    }
}

/// Tokenises one `Tokenize` message's text.
async fn tokenize_one(
    handle: Arc<ModelHandle>,
    message: pb::EncodeRequest,
) -> Result<pb::EncodeResponse, Status> {
    non_empty(&message.inputs, "inputs")?;
    let encoder = handle.text_encoder().map_err(status)?;
    let tokens = encoder
        .tokens(
            &message.inputs,
            message.add_special_tokens,
            message.prompt_name.as_deref(),
        )
        .map_err(status)?;
    let place = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(pb::EncodeResponse {
        tokens: tokens
            .into_iter()
            .map(|t| pb::SimpleToken {
                id: t.id,
                text: t.text,
                special: t.special,
                start: t.span.map(|s| place(s.0)),
                stop: t.span.map(|s| place(s.1)),
            })
            .collect(),
    })
}

/// Decodes one `Decode` message's ids.
async fn decode_one(
    handle: Arc<ModelHandle>,
    message: pb::DecodeRequest,
) -> Result<pb::DecodeResponse, Status> {
    if message.ids.is_empty() {
        return Err(invalid("`ids` is empty: there is nothing to decode"));
    }
    let encoder = handle.text_encoder().map_err(status)?;
    let text = encoder
        .decode(&message.ids, message.skip_special_tokens)
        .map_err(status)?;
    Ok(pb::DecodeResponse { text })
}

#[tonic::async_trait]
impl pb::tokenize_server::Tokenize for TeiService {
    async fn tokenize(
        &self,
        request: Request<pb::EncodeRequest>,
    ) -> Result<Response<pb::EncodeResponse>, Status> {
        self.unary(request, tokenize_one).await
    }

    type TokenizeStreamStream = Answers<pb::EncodeResponse>;

    async fn tokenize_stream(
        &self,
        request: Request<Streaming<pb::EncodeRequest>>,
    ) -> Result<Response<Self::TokenizeStreamStream>, Status> {
        self.streamed(request, tokenize_one).await
    }

    async fn decode(
        &self,
        request: Request<pb::DecodeRequest>,
    ) -> Result<Response<pb::DecodeResponse>, Status> {
        self.unary(request, decode_one).await
    }

    type DecodeStreamStream = Answers<pb::DecodeResponse>;

    async fn decode_stream(
        &self,
        request: Request<Streaming<pb::DecodeRequest>>,
    ) -> Result<Response<Self::DecodeStreamStream>, Status> {
        self.streamed(request, decode_one).await
    }
}
