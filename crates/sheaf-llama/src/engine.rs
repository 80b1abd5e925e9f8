//! A generation engine: the handle the scheduler holds, and the thread that owns the context.
//!
//! The model is shared: the handle reads it to render, tokenise and check each request on the
//! caller's thread, so that a bad request fails before it is queued; the engine thread decodes
//! with the one context, which borrows the model.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::{LlamaModelParams, LlamaSplitMode};
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use sheaf_backend::generation::{
    EventSink, Format, GenError, GenRequest, GenerationSpec, Generator, GeneratorInfo,
    GeneratorStats, Prompt, Rendering,
};
use sheaf_backend::threads::ModelThreads;
use sheaf_backend::Device;

use crate::grammar::Grammar;
use crate::job::{PendingGuard, Submitted};
use crate::prompt::{known, text_of, tokens_of};
use crate::scheduler::Scheduler;

/// A loaded generation model: a handle to its engine thread.
pub struct Engine {
    jobs: std_mpsc::SyncSender<Submitted>,
    model: Arc<LlamaModel>,
    template: Option<LlamaChatTemplate>,
    info: GeneratorInfo,
    spec: GenerationSpec,
    stats: Arc<GeneratorStats>,
    pending: Arc<AtomicUsize>,
    /// Disconnects when the engine thread has ended (see [`Engine::ended`]).
    ended: Mutex<Option<std_mpsc::Receiver<()>>>,
}

/// llama.cpp's backend may be initialised once per process.
pub(crate) fn backend() -> Result<&'static LlamaBackend, GenError> {
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
    /// Loads the GGUF model at `path` on `device` and starts its scheduler thread. Blocks until
    /// the model is loaded (call it from a blocking context).
    pub fn start(
        path: &Path,
        device: Device,
        spec: GenerationSpec,
    ) -> Result<Arc<Engine>, GenError> {
        let backend = backend()?;
        let params = match device {
            Device::Cuda(gpu) => {
                if !backend.supports_gpu_offload() {
                    return Err(GenError::Invalid(format!(
                        "cuda:{gpu}: this sheaf's llama.cpp runs on the CPU only (build sheaf \
                         with the `cuda` feature to offload layers to a GPU)"
                    )));
                }
                LlamaModelParams::default()
                    .with_n_gpu_layers(spec.gpu_layers.unwrap_or(u32::MAX))
                    .with_split_mode(LlamaSplitMode::None)
                    .with_main_gpu(gpu)
            }
            _ => LlamaModelParams::default().with_n_gpu_layers(0),
        };
        let model = LlamaModel::load_from_file(backend, path, &params)
            .map_err(|e| GenError::Internal(format!("cannot load {}: {e}", path.display())))?;
        let model = Arc::new(model);
        let context_length = (spec.n_ctx as usize).min(model.n_ctx_train() as usize);
        let head_dim = model.n_embd().max(0) as u64 / u64::from(model.n_head().max(1));
        let info = GeneratorInfo {
            context_length,
            n_params: model.n_params(),
            size_bytes: model.size(),
            // Keys and values, 16 bits each, for `n_ctx` cells in every layer.
            kv_cache_bytes: u64::from(model.n_layer())
                * u64::from(spec.n_ctx)
                * 2
                * head_dim
                * u64::from(model.n_head_kv())
                * 2,
            max_choices: spec.max_seqs as usize,
            max_waiting: spec.max_waiting,
        };
        let template = model
            .chat_template(None)
            .ok()
            .or_else(|| LlamaChatTemplate::new("chatml").ok());
        let stats = Arc::new(GeneratorStats::default());
        stats
            .kv_capacity
            .store(spec.n_ctx as usize, Ordering::Relaxed);
        let (jobs, inbox) = std_mpsc::sync_channel::<Submitted>(spec.max_waiting);
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let (alive, ended) = std_mpsc::channel::<()>();
        let thread_model = model.clone();
        let thread_spec = spec.clone();
        let thread_stats = stats.clone();
        let path: PathBuf = path.to_path_buf();
        let thread_name = format!(
            "sheaf-llm-{}",
            path.file_stem().and_then(|s| s.to_str()).unwrap_or("model")
        );
        std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                // Declared first, dropped last: after the model (see sheaf_backend::threads).
                let _registered = ModelThreads::process().enter(&thread_name);
                // Started from a protocol thread: back on every core (see `--io-cpus`).
                if let Err(e) = sheaf_backend::affinity::unpin_current_thread() {
                    tracing::warn!(engine = %thread_name, "{e}");
                }
                let model = thread_model;
                let _alive = alive;
                run(
                    &model,
                    thread_spec,
                    thread_stats,
                    context_length,
                    inbox,
                    ready_tx,
                );
            })
            .map_err(|e| GenError::Internal(format!("cannot start the engine thread: {e}")))?;
        ready_rx
            .recv()
            .map_err(|_| GenError::Internal("the engine thread ended while starting".into()))??;
        Ok(Arc::new(Engine {
            jobs,
            model,
            template,
            info,
            spec,
            stats,
            pending: Arc::default(),
            ended: Mutex::new(Some(ended)),
        }))
    }

    /// Once every handle to the engine is dropped, its thread finishes the sequences it holds
    /// and frees the model. This returns (once) a receiver whose `recv` returns when that has
    /// happened.
    pub fn ended(&self) -> Option<std_mpsc::Receiver<()>> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The checks that need the model: every `logit_bias` and stop token id in the vocabulary,
    /// and a grammar of the client's own that llama.cpp loads. The least length is checked
    /// against the most, and against a format, which ends where its grammar is complete.
    fn check(&self, request: &GenRequest) -> Result<(), GenError> {
        let biased = request.sampling.logit_bias.iter().map(|(t, _)| *t);
        known(&self.model, biased, "logit_bias: ")?;
        let stops = request.stop_tokens.iter().copied();
        known(&self.model, stops, "stop_token_ids: ")?;
        if request.min_tokens > request.max_tokens {
            return Err(GenError::Invalid(format!(
                "min_tokens: {} is more than max_tokens ({})",
                request.min_tokens, request.max_tokens
            )));
        }
        if request.format.is_some() && (request.min_tokens > 0 || request.ignore_eos) {
            let field = if request.ignore_eos {
                "ignore_eos"
            } else {
                "min_tokens"
            };
            return Err(GenError::Invalid(format!(
                "{field}: cannot be combined with a format (response_format, guided decoding or \
                 tools); a format's answer ends where it is complete"
            )));
        }
        if let Some(Format::Grammar(rules)) = &request.format {
            crate::gbnf::check_grammar(rules)
                .and_then(|()| {
                    LlamaSampler::grammar(&self.model, rules, "root")
                        .map(drop)
                        .map_err(|e| e.to_string())
                })
                .map_err(|e| {
                    GenError::Invalid(format!("guided_grammar: the grammar does not load: {e}"))
                })?;
        }
        Ok(())
    }
}

impl Generator for Engine {
    fn info(&self) -> &GeneratorInfo {
        &self.info
    }

    fn stats(&self) -> &GeneratorStats {
        &self.stats
    }

    fn submit(&self, request: GenRequest, sinks: Vec<Box<dyn EventSink>>) -> Result<(), GenError> {
        let n = sinks.len();
        if n == 0 || n > self.spec.max_seqs as usize {
            return Err(GenError::Invalid(format!(
                "n: {n} choices; this model runs 1 to {} at once",
                self.spec.max_seqs
            )));
        }
        self.check(&request)?;
        let tokens = tokens_of(
            &self.model,
            self.template.as_ref(),
            &request.prompt,
            request.rendering,
        )?;
        if tokens.is_empty() {
            return Err(GenError::Invalid("the prompt is empty".into()));
        }
        if tokens.len() >= self.info.context_length {
            return Err(GenError::PromptTooLong {
                tokens: tokens.len(),
                limit: self.info.context_length,
            });
        }
        let grammar = request.format.as_ref().map(Grammar::of).transpose()?;
        self.pending.fetch_add(n, Ordering::Relaxed);
        let sinks = sinks
            .into_iter()
            .map(|sink| (sink, PendingGuard(self.pending.clone())))
            .collect();
        let job = Submitted {
            request,
            tokens,
            grammar,
            sinks,
            at: Instant::now(),
        };
        self.jobs.try_send(job).map_err(|e| match e {
            std_mpsc::TrySendError::Full(_) => GenError::Overloaded(format!(
                "{} generation requests are already waiting; retry later",
                self.spec.max_waiting
            )),
            std_mpsc::TrySendError::Disconnected(_) => {
                GenError::Internal("the generation engine has stopped".into())
            }
        })
    }

    fn tokenize(&self, prompt: &Prompt, rendering: Rendering) -> Result<Vec<i32>, GenError> {
        let tokens = tokens_of(&self.model, self.template.as_ref(), prompt, rendering)?;
        Ok(tokens.iter().map(|t| t.0).collect())
    }

    fn detokenize(&self, tokens: &[i32]) -> Result<String, GenError> {
        text_of(&self.model, tokens)
    }

    fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

fn run(
    model: &LlamaModel,
    spec: GenerationSpec,
    stats: Arc<GeneratorStats>,
    context_length: usize,
    inbox: std_mpsc::Receiver<Submitted>,
    ready: std_mpsc::Sender<Result<(), GenError>>,
) {
    let threads = spec
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        as i32;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(spec.n_ctx))
        .with_n_batch(spec.max_batch_tokens)
        .with_n_ubatch(spec.max_batch_tokens)
        .with_n_seq_max(spec.max_seqs + spec.prefix_slots)
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let ctx = match backend().and_then(|b| {
        model
            .new_context(b, params)
            .map_err(|e| GenError::Internal(format!("cannot create a llama.cpp context: {e}")))
    }) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    Scheduler::new(model, ctx, spec, stats, context_length).serve(inbox);
}
