//! The engine thread's scheduler: admission, one batched `decode` per step, KV cache management.
//!
//! - **Steps.** Each step makes one `decode` call: first the next token of every running
//!   sequence (so running streams never stall), then prefill chunks of admitted prompts, within
//!   `max_batch_tokens`. Sequences leave the moment they finish; waiting ones join at the next
//!   step.
//! - **KV cache.** The context holds `n_ctx` cells shared by all sequences (a unified cache).
//!   A waiting request is admitted when a sequence slot is free and its tokens fit in the cells
//!   left. Before a step, if its new tokens do not fit, kept prefixes are dropped first (least
//!   recently used), then the newest running sequence is preempted: its cache is removed and it
//!   goes back to the head of the queue, to be recomputed from its prompt and the tokens it has
//!   generated (its client notices nothing but a pause). So no request fails for lack of cache
//!   while others could finish. A finished or disconnected sequence's cells are freed at once.
//! - **Prefix cache** ([`crate::prefix`]): a finished sequence's prompt stays in the cache under
//!   its own sequence id; a new prompt that starts with the same tokens (a shared system prompt)
//!   copies those cells (llama.cpp shares them in a unified cache) and prefills only the rest.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc;

use crate::engine::{EngineConfig, EngineStats, Job};
use crate::grammar::Grammar;
use crate::logprobs::logprob;
use crate::prefix::PrefixCache;
use crate::text::TextState;
use crate::{Event, FinishReason, GenError, Prompt, Sampling, Usage, MAX_TOP_LOGPROBS};

/// Cells of growth a sequence is promised at admission (or what it has left to generate).
const GROWTH_CELLS: usize = 32;

/// One request, from admission to its end.
struct Sequence {
    /// llama.cpp sequence id while running.
    id: i32,
    /// Admission order: the highest is the newest, preempted first.
    order: u64,
    events: mpsc::UnboundedSender<Event>,
    prompt_len: usize,
    /// The prompt, then every generated token (the last one not fed yet while decoding).
    tokens: Vec<LlamaToken>,
    /// Tokens whose KV is in the cache.
    fed: usize,
    generated: usize,
    max_tokens: usize,
    stop: Vec<String>,
    hold: usize,
    text: TextState,
    sampler: LlamaSampler,
    /// Alternatives per token to report with each token's log-probability; none: no report.
    logprobs: Option<usize>,
    /// The request it is a choice of (OpenAI's `n`), and whether it is the first choice, which
    /// prefills the prompt that the others then copy.
    group: u64,
    leader: bool,
    submitted: Instant,
    first_token: Option<Instant>,
}

pub(crate) struct Scheduler<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    template: Option<LlamaChatTemplate>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    context_length: usize,
    running: Vec<Sequence>,
    /// Preempted sequences first, then new requests in arrival order.
    waiting: VecDeque<Sequence>,
    prefixes: PrefixCache,
    admitted: u64,
    /// Requests received, numbering the groups of choices.
    received: u64,
}

impl<'m> Scheduler<'m> {
    pub fn new(
        model: &'m LlamaModel,
        ctx: LlamaContext<'m>,
        template: Option<LlamaChatTemplate>,
        config: EngineConfig,
        stats: Arc<EngineStats>,
        context_length: usize,
    ) -> Scheduler<'m> {
        Scheduler {
            model,
            ctx,
            template,
            prefixes: PrefixCache::new(config.prefix_slots as usize),
            config,
            stats,
            context_length,
            running: Vec::new(),
            waiting: VecDeque::new(),
            admitted: 0,
            received: 0,
        }
    }

    pub fn serve(mut self, inbox: std_mpsc::Receiver<Job>) {
        let mut batch = LlamaBatch::new(self.config.max_batch_tokens as usize, 1);
        loop {
            // Idle: block for work. Busy: take what has arrived, without waiting.
            if self.running.is_empty() && self.waiting.is_empty() {
                match inbox.recv() {
                    Ok(job) => self.receive(job),
                    Err(_) => return,
                }
            }
            // Requests beyond `max_waiting` stay in the (bounded) channel, so that a full
            // engine refuses new ones at once instead of queueing without bound.
            while self.waiting.len() < self.config.max_waiting {
                match inbox.try_recv() {
                    Ok(job) => self.receive(job),
                    Err(_) => break,
                }
            }
            self.drop_disconnected();
            self.admit();
            self.step(&mut batch);
            self.publish();
        }
    }

    fn publish(&self) {
        let s = &self.stats;
        s.running.store(self.running.len(), Ordering::Relaxed);
        s.waiting.store(self.waiting.len(), Ordering::Relaxed);
        s.kv_used.store(self.kv_used(), Ordering::Relaxed);
    }

    /// Cells held: running sequences' fed tokens plus kept prefixes.
    fn kv_used(&self) -> usize {
        self.running.iter().map(|s| s.fed).sum::<usize>() + self.prefixes.cells()
    }

    /// Answers a tokenizer job at once; tokenizes a generation request and queues it, or
    /// answers it with an error at once.
    fn receive(&mut self, job: Job) {
        let job = match job {
            Job::Generate(job) => job,
            Job::Tokenize { prompt, reply } => {
                let tokens = self.tokens_of(&prompt);
                let _ = reply.send(tokens.map(|t| t.iter().map(|t| t.0).collect()));
                return;
            }
            Job::Detokenize { tokens, reply } => {
                let _ = reply.send(self.text_of(&tokens));
                return;
            }
        };
        let tokens = self.tokens_of(&job.request.prompt);
        let tokens = match tokens {
            Ok(t) if t.is_empty() => Err(GenError::Invalid("the prompt is empty".into())),
            Ok(t) if t.len() >= self.context_length => Err(GenError::PromptTooLong {
                tokens: t.len(),
                limit: self.context_length,
            }),
            other => other,
        };
        let fail = |events: &[mpsc::UnboundedSender<Event>], e: GenError| {
            for tx in events {
                let _ = tx.send(Event::Error(e.clone()));
            }
        };
        let tokens = match tokens {
            Ok(tokens) => tokens,
            Err(e) => return fail(&job.events, e),
        };
        let r = &job.request;
        let grammar = match r.format.as_ref().map(Grammar::of).transpose() {
            Ok(g) => g,
            Err(e) => return fail(&job.events, e),
        };
        let mut samplers = Vec::with_capacity(job.events.len());
        for i in 0..job.events.len() {
            let sampling = Sampling {
                seed: r.sampling.seed.wrapping_add(i as u32),
                ..r.sampling.clone()
            };
            match self.sampler(&sampling, grammar.as_ref()) {
                Ok(sampler) => samplers.push(sampler),
                Err(e) => return fail(&job.events, e),
            }
        }
        self.received += 1;
        let room = self.context_length - tokens.len();
        for (i, (events, sampler)) in job.events.into_iter().zip(samplers).enumerate() {
            self.waiting.push_back(Sequence {
                id: -1,
                order: 0,
                events,
                prompt_len: tokens.len(),
                max_tokens: r.max_tokens.clamp(1, room),
                tokens: tokens.clone(),
                fed: 0,
                generated: 0,
                hold: r
                    .stop
                    .iter()
                    .map(String::len)
                    .max()
                    .unwrap_or(1)
                    .saturating_sub(1),
                stop: r.stop.clone(),
                text: TextState::default(),
                sampler,
                logprobs: r.logprobs.map(|k| k.min(MAX_TOP_LOGPROBS)),
                group: self.received,
                leader: i == 0,
                submitted: job.at,
                first_token: None,
            });
        }
    }

    /// The tokens of a prompt: a chat rendered with the model's template, a text with its start
    /// token; special tokens written in the text are parsed.
    fn tokens_of(&self, prompt: &Prompt) -> Result<Vec<LlamaToken>, GenError> {
        let (text, add_bos) = match prompt {
            Prompt::Text(t) => (t.clone(), true),
            Prompt::Chat(messages) => (self.render(messages)?, false),
        };
        Ok(self.model.vocab().tokenize(text.as_bytes(), add_bos, true))
    }

    /// The text of token ids, special tokens included as text.
    fn text_of(&self, tokens: &[i32]) -> Result<String, GenError> {
        let n_vocab = self.model.n_vocab();
        if let Some(bad) = tokens.iter().find(|t| !(0..n_vocab).contains(*t)) {
            return Err(GenError::Invalid(format!(
                "token {bad} is not in this model's vocabulary of {n_vocab} tokens"
            )));
        }
        if tokens.is_empty() {
            return Ok(String::new());
        }
        let tokens: Vec<LlamaToken> = tokens.iter().map(|&t| LlamaToken(t)).collect();
        let bytes = self.model.vocab().detokenize(&tokens, false, true);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The sampler chain of one sequence, constrained by `grammar` when one is given.
    /// Token ids in `logit_bias` must be in the vocabulary.
    fn sampler(
        &self,
        sampling: &Sampling,
        grammar: Option<&Grammar>,
    ) -> Result<LlamaSampler, GenError> {
        let n_vocab = self.model.n_vocab();
        let mut chain = Vec::new();
        if let Some(g) = grammar {
            // First, so that every later sampler sees only tokens the format allows.
            let constrained = match g.trigger {
                None => LlamaSampler::grammar(self.model, &g.rules, "root"),
                Some(word) => LlamaSampler::grammar_lazy(self.model, &g.rules, "root", [word], &[]),
            };
            chain.push(constrained.map_err(|e| {
                GenError::Invalid(format!("{}: the grammar does not load: {e}", g.field))
            })?);
        }
        if !sampling.logit_bias.is_empty() {
            let mut biases = Vec::with_capacity(sampling.logit_bias.len());
            for &(token, bias) in &sampling.logit_bias {
                if !(0..n_vocab).contains(&token) {
                    return Err(GenError::Invalid(format!(
                        "logit_bias: token {token} is not in this model's vocabulary of {n_vocab} tokens"
                    )));
                }
                biases.push(LlamaLogitBias::new(LlamaToken(token), bias));
            }
            chain.push(LlamaSampler::logit_bias(n_vocab, &biases));
        }
        if sampling.penalizes() {
            // Over every token generated so far (the context's length bounds the window).
            chain.push(LlamaSampler::penalties(
                n_vocab,
                self.context_length as i32,
                sampling.repetition_penalty,
                sampling.frequency_penalty,
                sampling.presence_penalty,
            ));
        }
        if sampling.temperature <= 0.0 {
            chain.push(LlamaSampler::greedy());
        } else {
            if let Some(k) = sampling.top_k {
                chain.push(LlamaSampler::top_k(k.min(i32::MAX as u32) as i32));
            }
            chain.push(LlamaSampler::top_p(sampling.top_p.clamp(0.0, 1.0), 1));
            if let Some(p) = sampling.min_p {
                chain.push(LlamaSampler::min_p(p.clamp(0.0, 1.0), 1));
            }
            chain.push(LlamaSampler::temp(sampling.temperature));
            chain.push(LlamaSampler::dist(sampling.seed));
        }
        Ok(LlamaSampler::chain_simple(chain))
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
        self.waiting.retain(|w| !w.events.is_closed());
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

    /// A sequence id used by no running sequence and no kept prefix.
    fn free_id(&self) -> i32 {
        let total = (self.config.max_seqs + self.config.prefix_slots) as i32;
        (0..total)
            .find(|id| self.running.iter().all(|s| s.id != *id) && !self.prefixes.holds(*id))
            .unwrap_or(0)
    }

    /// Starts waiting sequences, in order, while a slot is free and their tokens fit.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_seqs as usize {
            let Some(front) = self.waiting.front() else {
                return;
            };
            // A later choice waits until the first one has its prompt in the cache, to copy it.
            if !front.leader && self.leader_prefilling(front.group) {
                return;
            }
            // Room for its tokens, plus some growth for it and each running sequence, so that
            // admitting it does not force a preemption a few steps later.
            let growth = |s: &Sequence| (s.max_tokens - s.generated).min(GROWTH_CELLS);
            let need =
                front.tokens.len() + growth(front) + self.running.iter().map(growth).sum::<usize>();
            let capacity = self.config.n_ctx as usize;
            while self.kv_used() + need > capacity {
                let Some(id) = self.prefixes.evict_oldest() else {
                    break;
                };
                let _ = self.ctx.clear_kv_cache_seq(Some(id as u32), None, None);
            }
            if self.kv_used() + need > capacity {
                return;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                return;
            };
            s.id = self.free_id();
            self.admitted += 1;
            s.order = self.admitted;
            s.fed = 0;
            self.reuse_prefix(&mut s);
            self.running.push(s);
        }
    }

    /// Whether the first choice of `group` is running and has not yet fed its prompt (all but
    /// its last token, which each choice decodes itself).
    fn leader_prefilling(&self, group: u64) -> bool {
        self.running
            .iter()
            .any(|l| l.group == group && l.leader && l.fed + 1 < l.prompt_len)
    }

    /// Starts `s` from its prompt's cells held by the first choice of its request, or else from
    /// the longest kept prefix of its tokens, if one is long enough.
    fn reuse_prefix(&mut self, s: &mut Sequence) {
        self.stats.prefix_lookups.fetch_add(1, Ordering::Relaxed);
        // At least one token must be decoded, for the logits of the next one.
        let shared = s.prompt_len - 1;
        let leader = self
            .running
            .iter()
            .find(|l| l.group == s.group && l.leader && l.fed >= shared)
            .filter(|_| !s.leader && shared > 0 && s.fed == 0)
            .map(|l| (l.id, shared));
        let Some((from, common)) =
            leader.or_else(|| self.prefixes.lookup(&s.tokens[..s.tokens.len() - 1]))
        else {
            return;
        };
        let copied = self
            .ctx
            .copy_kv_cache_seq(from, s.id, Some(0), Some(common as u32));
        if copied.is_ok() {
            s.fed = common;
            self.stats.prefix_hits.fetch_add(1, Ordering::Relaxed);
            self.stats
                .prefix_tokens_reused
                .fetch_add(common as u64, Ordering::Relaxed);
        }
    }

    /// Makes room for `need` more cells: drops kept prefixes, then preempts the newest running
    /// sequences (never the last one). Returns whether it fits.
    fn make_room(&mut self, need: usize) -> bool {
        let capacity = self.config.n_ctx as usize;
        while self.kv_used() + need > capacity {
            if let Some(id) = self.prefixes.evict_oldest() {
                let _ = self.ctx.clear_kv_cache_seq(Some(id as u32), None, None);
                continue;
            }
            if self.running.len() <= 1 {
                return false;
            }
            let Some(newest) = self
                .running
                .iter()
                .enumerate()
                .max_by_key(|(_, s)| s.order)
                .map(|(i, _)| i)
            else {
                return false;
            };
            let mut s = self.running.swap_remove(newest);
            let _ = self.ctx.clear_kv_cache_seq(Some(s.id as u32), None, None);
            tracing::debug!(
                sequence = s.id,
                tokens = s.tokens.len(),
                "preempted for KV room"
            );
            s.fed = 0;
            s.id = -1;
            self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
            self.waiting.push_front(s);
        }
        true
    }

    /// One decode over all running sequences: their next tokens first, then prefill chunks.
    fn step(&mut self, batch: &mut LlamaBatch) {
        let max = self.config.max_batch_tokens as usize;
        // Plan: every decoding sequence's token, then prefill chunks in admission order.
        self.running
            .sort_by_key(|s| (s.tokens.len() - s.fed > 1, s.order));
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut budget = max;
        for (i, s) in self.running.iter().enumerate() {
            let n = (s.tokens.len() - s.fed).min(budget);
            if n == 0 {
                break;
            }
            plan.push((i, n));
            budget -= n;
        }
        let need: usize = plan.iter().map(|(_, n)| n).sum();
        if need == 0 {
            return;
        }
        if !self.make_room(need) {
            tracing::error!(need, "one sequence does not fit the KV cache");
        }
        // Preemption may have removed sequences: plan again over those left.
        batch.clear();
        let mut rows: Vec<(i32, i32)> = Vec::new();
        let mut budget = max;
        let mut failed = None;
        'plan: for s in self.running.iter_mut() {
            let n = (s.tokens.len() - s.fed).min(budget);
            if n == 0 {
                break;
            }
            for k in 0..n {
                let i = s.fed + k;
                let last = i + 1 == s.tokens.len();
                if let Err(e) = batch.add(s.tokens[i], i as i32, &[s.id], last) {
                    failed = Some(e.to_string());
                    break 'plan;
                }
                if last {
                    rows.push((s.id, batch.n_tokens() - 1));
                }
            }
            let prompt_part = s.prompt_len.saturating_sub(s.fed).min(n);
            self.stats
                .prompt_tokens
                .fetch_add(prompt_part as u64, Ordering::Relaxed);
            s.fed += n;
            budget -= n;
        }
        if batch.n_tokens() == 0 {
            return;
        }
        let started = Instant::now();
        let decoded = self.ctx.decode(batch);
        self.stats
            .decode_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(e) = failed.or_else(|| decoded.err().map(|e| e.to_string())) {
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
            if let Some(top) = s.logprobs {
                let logits = self.ctx.get_logits_ith(row);
                let piece = |t: i32| vocab.token_to_piece(LlamaToken(t), false, None);
                let _ = s
                    .events
                    .send(Event::Logprob(logprob(logits, token.0, top, piece)));
            }
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
                s.tokens.push(token);
            }
            Some(reason) => {
                if let Some(text) = s.text.take(0) {
                    let _ = s.events.send(Event::Text(text));
                }
                let usage = Usage {
                    prompt_tokens: s.prompt_len,
                    completion_tokens: s.generated,
                    time_to_first_token: s.first_token.unwrap_or(now) - s.submitted,
                    total: now - s.submitted,
                };
                self.finish(id, Some(Ok((reason, usage))));
            }
        }
    }

    /// Ends sequence `id`: tells its client (unless it has gone), and frees its cells. A
    /// finished prompt is kept as a prefix; the generated part of its cache is removed.
    fn finish(&mut self, id: i32, outcome: Option<Result<(FinishReason, Usage), GenError>>) {
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return;
        };
        let s = self.running.swap_remove(i);
        let keep = matches!(outcome, Some(Ok(_))) && s.fed >= s.prompt_len;
        match outcome {
            Some(Ok((reason, usage))) => {
                let _ = s.events.send(Event::Done(reason, usage));
            }
            Some(Err(e)) => {
                let _ = s.events.send(Event::Error(e));
            }
            None => tracing::debug!(sequence = id, "client gone; sequence freed"),
        }
        if keep && self.config.prefix_slots > 0 {
            let _ = self
                .ctx
                .clear_kv_cache_seq(Some(id as u32), Some(s.prompt_len as u32), None);
            let mut prompt = s.tokens;
            prompt.truncate(s.prompt_len);
            for evicted in self.prefixes.insert(id, prompt) {
                let _ = self
                    .ctx
                    .clear_kv_cache_seq(Some(evicted as u32), None, None);
            }
        } else {
            let _ = self.ctx.clear_kv_cache_seq(Some(id as u32), None, None);
        }
    }
}
