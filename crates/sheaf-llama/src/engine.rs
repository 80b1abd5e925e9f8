//! A generation engine: the handle the server holds, and the thread that owns the model.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use tokio::sync::{mpsc, oneshot};

use crate::scheduler::Scheduler;
use crate::{Event, GenError, GenRequest, Prompt};

/// How the engine is sized: the keys of a generation model's `config.yaml`, all optional.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Tokens the KV cache holds, over all sequences.
    pub n_ctx: u32,
    /// Sequences decoded together at most.
    pub max_seqs: u32,
    /// Tokens in one decode call at most (running sequences' next tokens plus prefill chunks).
    pub max_batch_tokens: u32,
    /// Requests waiting for a slot at most (and as many again in the engine's inbox); more are
    /// refused at once.
    pub max_waiting: usize,
    /// Finished prompts kept in the KV cache for reuse by prompts that start the same way.
    pub prefix_slots: u32,
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
            prefix_slots: 8,
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
    /// The weights, in bytes.
    pub size_bytes: u64,
    /// The KV cache: keys and values (16-bit) for `n_ctx` cells in every layer.
    pub kv_cache_bytes: u64,
}

impl EngineInfo {
    /// What the engine holds: weights and KV cache.
    pub fn memory_bytes(&self) -> u64 {
        self.size_bytes + self.kv_cache_bytes
    }
}

/// Live counters of an engine, readable from any thread.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Sequences being decoded now.
    pub running: AtomicUsize,
    /// Requests waiting for a slot or for KV room.
    pub waiting: AtomicUsize,
    /// KV cells in use (running sequences and kept prefixes).
    pub kv_used: AtomicUsize,
    /// KV cells in all.
    pub kv_capacity: AtomicUsize,
    /// Running sequences pushed out to make KV room (recomputed later).
    pub preemptions: AtomicU64,
    /// Admissions that looked for a cached prefix, and those that found one.
    pub prefix_lookups: AtomicU64,
    pub prefix_hits: AtomicU64,
    /// Prompt tokens whose prefill a cached prefix saved.
    pub prefix_tokens_reused: AtomicU64,
    /// `decode` calls so far, and the time they took.
    pub steps: AtomicU64,
    pub decode_ns: AtomicU64,
    /// Tokens sampled so far, over all sequences.
    pub generated_tokens: AtomicU64,
    /// Prompt tokens decoded so far.
    pub prompt_tokens: AtomicU64,
}

pub(crate) struct Submitted {
    pub request: GenRequest,
    /// One channel per choice.
    pub events: Vec<mpsc::UnboundedSender<Event>>,
    pub at: Instant,
}

/// What the engine thread is asked to do: generate, or use the model's tokenizer (which lives
/// on that thread with the model).
pub(crate) enum Job {
    Generate(Submitted),
    Tokenize {
        prompt: Prompt,
        reply: oneshot::Sender<Result<Vec<i32>, GenError>>,
    },
    Detokenize {
        tokens: Vec<i32>,
        reply: oneshot::Sender<Result<String, GenError>>,
    },
}

/// A loaded generation model: a handle to its engine thread.
pub struct Engine {
    jobs: std_mpsc::SyncSender<Job>,
    pub info: EngineInfo,
    pub config: EngineConfig,
    pub stats: Arc<EngineStats>,
    /// Disconnects when the engine thread has ended (see [`Engine::ended`]).
    ended: Mutex<Option<std_mpsc::Receiver<()>>>,
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
        let (jobs, inbox) = std_mpsc::sync_channel::<Job>(config.max_waiting);
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let path: PathBuf = path.to_path_buf();
        let thread_config = config.clone();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        let (alive, ended) = std_mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(format!(
                "sheaf-llm-{}",
                path.file_stem().and_then(|s| s.to_str()).unwrap_or("model")
            ))
            .spawn(move || {
                let _alive = alive;
                run(&path, thread_config, thread_stats, inbox, ready_tx)
            })
            .map_err(|e| GenError::Internal(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx
            .recv()
            .map_err(|_| GenError::Internal("the engine thread ended while loading".into()))??;
        Ok(Arc::new(Engine {
            jobs,
            info,
            config,
            stats,
            ended: Mutex::new(Some(ended)),
        }))
    }

    /// Once every handle to the engine is dropped, its thread finishes the sequences it holds
    /// and frees the model. This returns (once) a receiver whose `recv` returns when that has
    /// happened.
    pub fn ended(&self) -> Option<std_mpsc::Receiver<()>> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Queues `request`; its text, then its end, arrive on the returned channel. Dropping the
    /// receiver cancels the request and frees its sequence at the next step.
    pub fn submit(&self, request: GenRequest) -> Result<mpsc::UnboundedReceiver<Event>, GenError> {
        self.submit_n(request, 1)?
            .pop()
            .ok_or_else(|| GenError::Internal("no channel for the request".into()))
    }

    /// Queues `n` choices of `request` (OpenAI's `n`), one channel each. The choices share the
    /// prompt's KV cells: the first prefills the prompt, the others copy its cells and decode
    /// only their last prompt token. Choice `i` samples with seed `seed + i`.
    pub fn submit_n(
        &self,
        request: GenRequest,
        n: usize,
    ) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, GenError> {
        if n == 0 || n > self.config.max_seqs as usize {
            return Err(GenError::Invalid(format!(
                "n: {n} choices; this model runs 1 to {} at once",
                self.config.max_seqs
            )));
        }
        let (events, receivers): (Vec<_>, Vec<_>) =
            (0..n).map(|_| mpsc::unbounded_channel()).unzip();
        self.send(Job::Generate(Submitted {
            request,
            events,
            at: Instant::now(),
        }))?;
        Ok(receivers)
    }

    /// The token ids of `prompt`, as a generation request would feed them (a chat rendered with
    /// the model's template; a text with its start token).
    pub async fn tokenize(&self, prompt: Prompt) -> Result<Vec<i32>, GenError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Tokenize { prompt, reply })?;
        answer.await.map_err(|_| stopped())?
    }

    /// The text of `tokens`; an id outside the vocabulary is refused.
    pub async fn detokenize(&self, tokens: Vec<i32>) -> Result<String, GenError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Detokenize { tokens, reply })?;
        answer.await.map_err(|_| stopped())?
    }

    fn send(&self, job: Job) -> Result<(), GenError> {
        self.jobs.try_send(job).map_err(|e| match e {
            std_mpsc::TrySendError::Full(_) => GenError::Overloaded(format!(
                "{} generation requests are already waiting; retry later",
                self.config.max_waiting
            )),
            std_mpsc::TrySendError::Disconnected(_) => stopped(),
        })
    }
}

fn stopped() -> GenError {
    GenError::Internal("the generation engine has stopped".into())
}

fn run(
    path: &Path,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    inbox: std_mpsc::Receiver<Job>,
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
        .with_n_seq_max(config.max_seqs + config.prefix_slots)
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
    let head_dim = model.n_embd().max(0) as u64 / u64::from(model.n_head().max(1));
    let info = EngineInfo {
        context_length,
        n_params: model.n_params(),
        size_bytes: model.size(),
        kv_cache_bytes: u64::from(model.n_layer())
            * u64::from(config.n_ctx)
            * 2
            * head_dim
            * u64::from(model.n_head_kv())
            * 2,
    };
    if ready.send(Ok(info)).is_err() {
        return;
    }
    let template = model
        .chat_template(None)
        .ok()
        .or_else(|| LlamaChatTemplate::new("chatml").ok());
    stats
        .kv_capacity
        .store(config.n_ctx as usize, Ordering::Relaxed);
    Scheduler::new(&model, ctx, template, config, stats, context_length).serve(inbox);
}
