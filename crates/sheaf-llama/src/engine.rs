//! The engine thread: admission within the KV budget, and one batched `decode` per step.
//!
//! KV budget: the context holds `n_ctx` tokens shared by all sequences (a unified cache). A
//! request is admitted when a sequence slot is free and its prompt plus `max_tokens` fit in what
//! the admitted sequences have not reserved; otherwise it waits. A request is never started
//! that the cache could not finish, so none fails for lack of cache while others could finish.
//! A finished or disconnected sequence's cache is removed at once and its slot reused.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc;

use crate::text::TextState;
use crate::{Event, FinishReason, GenError, GenRequest, Prompt, Usage};

/// How the engine is sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Tokens the KV cache holds, over all sequences.
    pub n_ctx: u32,
    /// Sequences decoded together at most.
    pub max_seqs: u32,
    /// Tokens in one decode call at most (running sequences' next tokens plus prefill chunks).
    pub max_batch_tokens: u32,
    /// Requests waiting for a slot at most; more are refused at once.
    pub max_waiting: usize,
    /// CPU threads llama.cpp uses.
    pub threads: i32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 8192,
            max_seqs: 16,
            max_batch_tokens: 512,
            max_waiting: 256,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get() as i32),
        }
    }
}

/// What the engine reports about its model once loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Longest prompt plus completion of one request, in tokens.
    pub context_length: usize,
    pub n_params: u64,
    pub size_bytes: u64,
}

/// Live counters of an engine, readable from any thread.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Sequences being decoded now.
    pub running: AtomicUsize,
    /// Requests waiting for a slot or for KV room.
    pub waiting: AtomicUsize,
    /// KV tokens reserved by running sequences.
    pub kv_reserved: AtomicUsize,
    /// `decode` calls so far.
    pub steps: AtomicU64,
    /// Tokens sampled so far, over all sequences.
    pub generated_tokens: AtomicU64,
    /// Prompt tokens decoded so far.
    pub prompt_tokens: AtomicU64,
}

struct Submitted {
    request: GenRequest,
    events: mpsc::UnboundedSender<Event>,
    at: Instant,
}

/// A loaded generation model: a handle to its engine thread.
pub struct Engine {
    jobs: std_mpsc::SyncSender<Submitted>,
    pub info: EngineInfo,
    pub config: EngineConfig,
    pub stats: Arc<EngineStats>,
}

/// llama.cpp's backend may be initialised once per process.
fn backend() -> Result<&'static LlamaBackend, GenError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let mut b = LlamaBackend::init().map_err(|e| e.to_string())?;
            b.void_logs();
            Ok(b)
        })
        .as_ref()
        .map_err(|e| GenError::Internal(format!("llama.cpp backend: {e}")))
}

impl Engine {
    /// Loads the GGUF model at `path` on a new thread and starts its scheduler. Blocks until the
    /// model is loaded (call it from a blocking context).
    pub fn start(path: &Path, config: EngineConfig) -> Result<Arc<Engine>, GenError> {
        let (jobs, inbox) = std_mpsc::sync_channel::<Submitted>(config.max_waiting);
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let path: PathBuf = path.to_path_buf();
        let thread_config = config.clone();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name(format!(
                "sheaf-llm-{}",
                path.file_stem().and_then(|s| s.to_str()).unwrap_or("model")
            ))
            .spawn(move || run(&path, thread_config, thread_stats, inbox, ready_tx))
            .map_err(|e| GenError::Internal(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx
            .recv()
            .map_err(|_| GenError::Internal("the engine thread ended while loading".into()))??;
        Ok(Arc::new(Engine {
            jobs,
            info,
            config,
            stats,
        }))
    }

    /// Queues `request`; its text, then its end, arrive on the returned channel. Dropping the
    /// receiver cancels the request and frees its sequence at the next step.
    pub fn submit(&self, request: GenRequest) -> Result<mpsc::UnboundedReceiver<Event>, GenError> {
        let (events, rx) = mpsc::unbounded_channel();
        let job = Submitted {
            request,
            events,
            at: Instant::now(),
        };
        self.jobs.try_send(job).map_err(|e| match e {
            std_mpsc::TrySendError::Full(_) => GenError::Overloaded(format!(
                "{} generation requests are already waiting; retry later",
                self.config.max_waiting
            )),
            std_mpsc::TrySendError::Disconnected(_) => {
                GenError::Internal("the generation engine has stopped".into())
            }
        })?;
        Ok(rx)
    }
}

/// One admitted sequence.
struct Sequence {
    id: i32,
    events: mpsc::UnboundedSender<Event>,
    prompt: Vec<LlamaToken>,
    /// Prompt tokens already decoded.
    prefilled: usize,
    /// Position of the next token fed.
    pos: i32,
    /// The sampled token to feed at the next step.
    next: Option<LlamaToken>,
    generated: usize,
    max_tokens: usize,
    stop: Vec<String>,
    hold: usize,
    text: TextState,
    sampler: LlamaSampler,
    submitted: Instant,
    first_token: Option<Instant>,
}

/// A tokenized request waiting for a slot.
struct Waiting {
    tokens: Vec<LlamaToken>,
    job: Submitted,
    max_tokens: usize,
}

fn run(
    path: &Path,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    inbox: std_mpsc::Receiver<Submitted>,
    ready: std_mpsc::Sender<Result<EngineInfo, GenError>>,
) {
    let loaded = backend().and_then(|backend| {
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|e| GenError::Internal(format!("cannot load {}: {e}", path.display())))?;
        Ok((backend, model))
    });
    let (backend, model) = match loaded {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(config.n_ctx))
        .with_n_batch(config.max_batch_tokens)
        .with_n_ubatch(config.max_batch_tokens)
        .with_n_seq_max(config.max_seqs)
        .with_kv_unified(true)
        .with_n_threads(config.threads)
        .with_n_threads_batch(config.threads);
    let ctx = match model.new_context(backend, params) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(GenError::Internal(format!(
                "cannot create a llama.cpp context: {e}"
            ))));
            return;
        }
    };
    let context_length = (config.n_ctx as usize).min(model.n_ctx_train() as usize);
    let info = EngineInfo {
        context_length,
        n_params: model.n_params(),
        size_bytes: model.size(),
    };
    if ready.send(Ok(info)).is_err() {
        return;
    }
    let template = model
        .chat_template(None)
        .ok()
        .or_else(|| LlamaChatTemplate::new("chatml").ok());
    Scheduler {
        model: &model,
        ctx,
        template,
        config,
        stats,
        context_length,
        running: Vec::new(),
        waiting: VecDeque::new(),
        reserved: 0,
    }
    .serve(inbox);
}

struct Scheduler<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    template: Option<LlamaChatTemplate>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    context_length: usize,
    running: Vec<Sequence>,
    waiting: VecDeque<Waiting>,
    /// KV tokens reserved by running sequences (prompt + max_tokens each).
    reserved: usize,
}

impl Scheduler<'_> {
    fn serve(mut self, inbox: std_mpsc::Receiver<Submitted>) {
        let mut batch = LlamaBatch::new(self.config.max_batch_tokens as usize, 1);
        loop {
            // Idle: block for work. Busy: take what has arrived, without waiting.
            if self.running.is_empty() && self.waiting.is_empty() {
                match inbox.recv() {
                    Ok(job) => self.receive(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = inbox.try_recv() {
                self.receive(job);
            }
            self.drop_disconnected();
            self.admit();
            self.step(&mut batch);
            self.stats
                .running
                .store(self.running.len(), Ordering::Relaxed);
            self.stats
                .waiting
                .store(self.waiting.len(), Ordering::Relaxed);
            self.stats
                .kv_reserved
                .store(self.reserved, Ordering::Relaxed);
        }
    }

    /// Tokenizes a request and queues it, or answers it with an error at once.
    fn receive(&mut self, job: Submitted) {
        let text = match &job.request.prompt {
            Prompt::Text(t) => Ok(t.clone()),
            Prompt::Chat(messages) => self.render(messages),
        };
        let tokens = text.map(|t| {
            self.model.vocab().tokenize(
                t.as_bytes(),
                matches!(job.request.prompt, Prompt::Text(_)),
                true,
            )
        });
        let tokens = match tokens {
            Ok(t) if t.is_empty() => Err(GenError::Invalid("the prompt is empty".into())),
            Ok(t) if t.len() >= self.context_length => Err(GenError::PromptTooLong {
                tokens: t.len(),
                limit: self.context_length,
            }),
            other => other,
        };
        match tokens {
            Ok(tokens) => {
                let room = self.context_length - tokens.len();
                let max_tokens = job.request.max_tokens.clamp(1, room);
                self.waiting.push_back(Waiting {
                    tokens,
                    job,
                    max_tokens,
                });
            }
            Err(e) => {
                let _ = job.events.send(Event::Error(e));
            }
        }
    }

    fn render(&self, messages: &[(String, String)]) -> Result<String, GenError> {
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| GenError::Invalid("this model has no chat template".into()))?;
        let chat = messages
            .iter()
            .map(|(role, content)| LlamaChatMessage::new(role.clone(), content.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| GenError::Invalid(format!("bad chat message: {e}")))?;
        self.model
            .apply_chat_template(template, &chat, true)
            .map_err(|e| GenError::Invalid(format!("cannot apply the chat template: {e}")))
    }

    /// Frees the sequences (and forgets the waiting requests) whose client has gone.
    fn drop_disconnected(&mut self) {
        self.waiting.retain(|w| !w.job.events.is_closed());
        let gone: Vec<i32> = self
            .running
            .iter()
            .filter(|s| s.events.is_closed())
            .map(|s| s.id)
            .collect();
        for id in gone {
            self.finish(id, None);
        }
    }

    /// Starts waiting requests, in arrival order, while a slot is free and the KV cache can hold
    /// their prompt and completion.
    fn admit(&mut self) {
        while let Some(front) = self.waiting.front() {
            let need = front.tokens.len() + front.max_tokens;
            let slots = self.running.len() < self.config.max_seqs as usize;
            if !slots || self.reserved + need > self.config.n_ctx as usize {
                return;
            }
            let Some(w) = self.waiting.pop_front() else {
                return;
            };
            let id = (0..self.config.max_seqs as i32)
                .find(|id| self.running.iter().all(|s| s.id != *id))
                .unwrap_or(0);
            self.reserved += need;
            let s = &w.job.request.sampling;
            let sampler = if s.temperature <= 0.0 {
                LlamaSampler::greedy()
            } else {
                LlamaSampler::chain_simple([
                    LlamaSampler::top_p(s.top_p.clamp(0.0, 1.0), 1),
                    LlamaSampler::temp(s.temperature),
                    LlamaSampler::dist(s.seed),
                ])
            };
            let stop = w.job.request.stop.clone();
            self.running.push(Sequence {
                id,
                events: w.job.events,
                prompt: w.tokens,
                prefilled: 0,
                pos: 0,
                next: None,
                generated: 0,
                max_tokens: w.max_tokens,
                hold: stop
                    .iter()
                    .map(String::len)
                    .max()
                    .unwrap_or(1)
                    .saturating_sub(1),
                stop,
                text: TextState::default(),
                sampler,
                submitted: w.job.at,
                first_token: None,
            });
        }
    }

    /// One decode over all running sequences: their next tokens first, then prefill chunks.
    fn step(&mut self, batch: &mut LlamaBatch) {
        batch.clear();
        let mut budget = self.config.max_batch_tokens as usize;
        // (sequence id, batch row) of the rows whose logits pick a token.
        let mut rows: Vec<(i32, i32)> = Vec::new();
        let mut failed = None;
        for s in self.running.iter_mut().filter(|s| s.next.is_some()) {
            let Some(token) = s.next.take() else { continue };
            if let Err(e) = batch.add(token, s.pos, &[s.id], true) {
                failed = Some(e.to_string());
                break;
            }
            rows.push((s.id, batch.n_tokens() - 1));
            s.pos += 1;
            budget -= 1;
        }
        for s in self
            .running
            .iter_mut()
            .filter(|s| s.prefilled < s.prompt.len())
        {
            if budget == 0 || failed.is_some() {
                break;
            }
            let n = budget.min(s.prompt.len() - s.prefilled);
            for k in 0..n {
                let i = s.prefilled + k;
                let last = i + 1 == s.prompt.len();
                if let Err(e) = batch.add(s.prompt[i], s.pos, &[s.id], last) {
                    failed = Some(e.to_string());
                    break;
                }
                if last {
                    rows.push((s.id, batch.n_tokens() - 1));
                }
                s.pos += 1;
            }
            s.prefilled += n;
            budget -= n;
            self.stats
                .prompt_tokens
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        if batch.n_tokens() == 0 {
            return;
        }
        if let Some(e) = failed.or_else(|| self.ctx.decode(batch).err().map(|e| e.to_string())) {
            tracing::error!(error = %e, "decode failed; failing the sequences in the batch");
            let ids: Vec<i32> = self.running.iter().map(|s| s.id).collect();
            for id in ids {
                self.finish(
                    id,
                    Some(Err(GenError::Internal(format!("decode failed: {e}")))),
                );
            }
            return;
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .generated_tokens
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        for (id, row) in rows {
            self.sample(id, row);
        }
    }

    /// Picks the next token of sequence `id` from batch row `row`, and sends its text.
    fn sample(&mut self, id: i32, row: i32) {
        let vocab = self.model.vocab();
        let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
            return;
        };
        let token = s.sampler.sample(&self.ctx, row);
        let now = Instant::now();
        s.first_token.get_or_insert(now);
        s.generated += 1;
        let end = if vocab.is_eog(token) {
            Some(FinishReason::Stop)
        } else {
            s.text.push(&vocab.token_to_piece(token, false, None));
            if let Some(at) = s.text.stop_at(&s.stop) {
                s.text.truncate(at);
                Some(FinishReason::Stop)
            } else if s.generated >= s.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            }
        };
        match end {
            None => {
                if let Some(text) = s.text.take(s.hold) {
                    let _ = s.events.send(Event::Text(text));
                }
                s.next = Some(token);
            }
            Some(reason) => {
                if let Some(text) = s.text.take(0) {
                    let _ = s.events.send(Event::Text(text));
                }
                let usage = Usage {
                    prompt_tokens: s.prompt.len(),
                    completion_tokens: s.generated,
                    time_to_first_token: s.first_token.unwrap_or(now) - s.submitted,
                    total: now - s.submitted,
                };
                self.finish(id, Some(Ok((reason, usage))));
            }
        }
    }

    /// Ends sequence `id`: tells its client (unless it has gone), removes its KV cache and
    /// frees its slot and reservation.
    fn finish(&mut self, id: i32, outcome: Option<Result<(FinishReason, Usage), GenError>>) {
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return;
        };
        let s = self.running.swap_remove(i);
        match outcome {
            Some(Ok((reason, usage))) => {
                let _ = s.events.send(Event::Done(reason, usage));
            }
            Some(Err(e)) => {
                let _ = s.events.send(Event::Error(e));
            }
            None => tracing::debug!(sequence = id, "client gone; sequence freed"),
        }
        let _ = self.ctx.clear_kv_cache_seq(Some(id as u32), None, None);
        self.reserved = self.reserved.saturating_sub(s.prompt.len() + s.max_tokens);
    }
}
