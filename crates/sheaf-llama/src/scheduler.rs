//! The engine thread's scheduler: admission, one batched `decode` per step, KV cache management.
//!
//! - **Admission order.** Waiting requests are admitted by priority level (0 first), then in
//!   arrival order; preempted sequences go first of all. A request still waiting when its
//!   deadline passes is answered with a timeout at the next step; once started, it runs to its
//!   end.
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
//! - **Sampling.** A free sequence is sampled by llama.cpp in one call. One held to a format,
//!   or kept from ending (`min_tokens`, `ignore_eos`), is sampled in steps sheaf takes itself:
//!   the candidates (with barred tokens at -inf) and the sampler chain's pick among them. The
//!   format's grammar, held apart from the chain, checks that one token; only if it refuses it
//!   is the grammar applied to the whole vocabulary and the pick made again among what it
//!   allows (the same distribution, at a fraction of the cost: bench/RESULTS.md). llama.cpp's
//!   grammar throws a C++ exception for a token it cannot take (a format that allows nothing
//!   the model can write), which would abort the process from inside one call; here that
//!   sequence ends with an error and the others go on.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;
use sheaf_backend::generation::{
    Event, EventSink, FinishReason, GenError, GenerationSpec, GeneratorStats, PromptLogprobs,
    Sampling, StopBy, TokenLogprob, Usage, MAX_TOP_LOGPROBS,
};

use crate::grammar::Grammar;
use crate::job::{PendingGuard, Submitted};
use crate::logprobs::logprob;
use crate::prefix::PrefixCache;
use crate::text::TextState;

/// Cells of growth a sequence is promised at admission (or what it has left to generate).
const GROWTH_CELLS: usize = 32;

/// Most prompt tokens of one sequence whose log-probabilities one step reads: each is a row of
/// logits over the whole vocabulary in llama.cpp's output buffer.
const SCORED_CHUNK: usize = 64;

/// One request, from admission to its end.
struct Sequence {
    /// llama.cpp sequence id while running.
    id: i32,
    /// Admission order: the highest is the newest, preempted first.
    order: u64,
    events: Box<dyn EventSink>,
    /// Counts the choice as pending until the sequence is dropped.
    _pending: PendingGuard,
    /// Queue level: 0 is admitted first.
    priority: usize,
    /// A sequence never admitted yet is answered with a timeout once this passes.
    deadline: Option<Instant>,
    /// Whether it has run (a preempted sequence waits again, but its deadline no longer
    /// applies).
    started: bool,
    prompt_len: usize,
    /// The prompt, then every generated token (the last one not fed yet while decoding).
    tokens: Vec<LlamaToken>,
    /// Tokens whose KV is in the cache.
    fed: usize,
    generated: usize,
    max_tokens: usize,
    stop: Vec<String>,
    /// Token ids that end it, their text not returned.
    stop_tokens: Vec<LlamaToken>,
    /// Whether the stop string that ends it is returned with it.
    include_stop: bool,
    /// No end-of-generation or stop token is picked, and no stop string ends it, before this
    /// many tokens.
    min_tokens: usize,
    /// No end-of-generation token is ever picked.
    ignore_eos: bool,
    /// Whether special tokens are rendered in its text.
    special: bool,
    hold: usize,
    text: TextState,
    /// The sampler chain: biases, penalties, truncation, temperature, the pick.
    sampler: LlamaSampler,
    /// The grammar of the format the answer is held to, and the request field that asks.
    grammar: Option<(LlamaSampler, &'static str)>,
    /// Alternatives per token to report with each token's log-probability; none: no report.
    logprobs: Option<usize>,
    /// Alternatives per prompt token to report with the prompt's log-probabilities; none: no
    /// report.
    prompt_top: Option<usize>,
    /// The prompt's log-probabilities read so far (from its second token), until sent.
    prompt_probs: Vec<TokenLogprob>,
    prompt_sent: bool,
    /// The request it is a choice of (OpenAI's `n`), and whether it is the first choice, which
    /// prefills the prompt that the others then copy.
    group: u64,
    leader: bool,
    submitted: Instant,
    first_token: Option<Instant>,
}

impl Sequence {
    /// Whether its prompt is being read for its log-probabilities: every position's logits
    /// are kept, a chunk at a time.
    fn scoring(&self) -> bool {
        self.prompt_top.is_some() && !self.prompt_sent && self.fed < self.prompt_len
    }

    /// Tokens it feeds in a step with `budget` tokens left.
    fn chunk(&self, budget: usize) -> usize {
        let n = (self.tokens.len() - self.fed).min(budget);
        if self.scoring() {
            n.min(SCORED_CHUNK)
        } else {
            n
        }
    }
}

pub(crate) struct Scheduler<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    config: GenerationSpec,
    stats: Arc<GeneratorStats>,
    context_length: usize,
    running: Vec<Sequence>,
    /// Preempted sequences first, then new requests by priority level, each level in arrival
    /// order.
    waiting: VecDeque<Sequence>,
    prefixes: PrefixCache,
    /// The vocabulary's end-of-generation tokens, which `ignore_eos` and `min_tokens` keep from
    /// being picked.
    eog: Vec<LlamaToken>,
    admitted: u64,
    /// Requests received, numbering the groups of choices.
    received: u64,
}

impl<'m> Scheduler<'m> {
    pub fn new(
        model: &'m LlamaModel,
        ctx: LlamaContext<'m>,
        config: GenerationSpec,
        stats: Arc<GeneratorStats>,
        context_length: usize,
    ) -> Scheduler<'m> {
        let vocab = model.vocab();
        let eog = (0..model.n_vocab())
            .map(LlamaToken)
            .filter(|&t| vocab.is_eog(t))
            .collect();
        Scheduler {
            model,
            ctx,
            eog,
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

    pub fn serve(mut self, inbox: std_mpsc::Receiver<Submitted>) {
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
            self.expire();
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

    /// Queues the choices of a checked request behind the waiting ones of its level and
    /// above, or answers them with an error at once.
    fn receive(&mut self, job: Submitted) {
        let Submitted {
            request: r,
            tokens,
            grammar,
            sinks,
            at,
        } = job;
        let mut samplers = Vec::with_capacity(sinks.len());
        for i in 0..sinks.len() {
            let sampling = Sampling {
                seed: r.sampling.seed.wrapping_add(i as u32),
                ..r.sampling.clone()
            };
            let made = self
                .grammar(grammar.as_ref())
                .map(|g| (self.sampler(&sampling), g));
            match made {
                Ok(sampler) => samplers.push(sampler),
                Err(e) => {
                    for (sink, _) in &sinks {
                        sink.send(Event::Error(e.clone()));
                    }
                    return;
                }
            }
        }
        self.received += 1;
        let room = self.context_length - tokens.len();
        // After every waiting sequence of the same or a more urgent level.
        let place = self
            .waiting
            .iter()
            .position(|w| !w.started && w.priority > r.priority)
            .unwrap_or(self.waiting.len());
        for (i, ((events, pending), (sampler, grammar))) in
            sinks.into_iter().zip(samplers).enumerate()
        {
            self.waiting.insert(
                place + i,
                Sequence {
                    id: -1,
                    order: 0,
                    events,
                    _pending: pending,
                    priority: r.priority,
                    deadline: r.deadline,
                    started: false,
                    prompt_len: tokens.len(),
                    max_tokens: r.max_tokens.min(room),
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
                    stop_tokens: r.stop_tokens.iter().copied().map(LlamaToken).collect(),
                    include_stop: r.include_stop,
                    min_tokens: r.min_tokens,
                    ignore_eos: r.ignore_eos,
                    special: r.special_tokens,
                    text: TextState::default(),
                    sampler,
                    grammar,
                    logprobs: r.logprobs.map(|k| k.min(MAX_TOP_LOGPROBS)),
                    prompt_top: r.prompt_logprobs.map(|k| k.min(MAX_TOP_LOGPROBS)),
                    prompt_probs: Vec::new(),
                    prompt_sent: false,
                    group: self.received,
                    leader: i == 0,
                    submitted: at,
                    first_token: None,
                },
            );
        }
    }

    /// Answers the waiting requests whose deadline has passed before they started.
    fn expire(&mut self) {
        let now = Instant::now();
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for s in self.waiting.drain(..) {
            match s.deadline {
                Some(deadline) if !s.started && deadline <= now => {
                    self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                    s.events.send(Event::Error(GenError::Timeout(format!(
                        "timed out after {} ms waiting for a sequence slot",
                        (now - s.submitted).as_millis()
                    ))));
                }
                _ => kept.push_back(s),
            }
        }
        self.waiting = kept;
    }

    /// The grammar sampler of one sequence held to a format, and the field that asks for it.
    fn grammar(
        &self,
        grammar: Option<&Grammar>,
    ) -> Result<Option<(LlamaSampler, &'static str)>, GenError> {
        let Some(g) = grammar else {
            return Ok(None);
        };
        let sampler = match g.trigger {
            None => LlamaSampler::grammar(self.model, &g.rules, "root"),
            Some(word) => LlamaSampler::grammar_lazy(self.model, &g.rules, "root", [word], &[]),
        };
        let sampler = sampler.map_err(|e| {
            GenError::Invalid(format!("{}: the grammar does not load: {e}", g.field))
        })?;
        Ok(Some((sampler, g.field)))
    }

    /// The sampler chain of one sequence (the caller has checked `logit_bias` against the
    /// vocabulary).
    fn sampler(&self, sampling: &Sampling) -> LlamaSampler {
        let n_vocab = self.model.n_vocab();
        let mut chain = Vec::new();
        if !sampling.logit_bias.is_empty() {
            let biases: Vec<LlamaLogitBias> = sampling
                .logit_bias
                .iter()
                .map(|&(token, bias)| LlamaLogitBias::new(LlamaToken(token), bias))
                .collect();
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
        LlamaSampler::chain_simple(chain)
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
            s.started = true;
            s.fed = 0;
            // A prompt read for its log-probabilities is read whole.
            if !s.scoring() {
                self.reuse_prefix(&mut s);
            }
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
            if !s.prompt_sent {
                s.prompt_probs.clear();
            }
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
            let n = s.chunk(budget);
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
        // Prompt positions whose logits give the next prompt token's log-probability:
        // (sequence, position, row).
        let mut scored: Vec<(i32, usize, i32)> = Vec::new();
        let mut budget = max;
        let mut failed = None;
        'plan: for s in self.running.iter_mut() {
            let n = s.chunk(budget);
            if n == 0 {
                break;
            }
            let scoring = s.scoring();
            for k in 0..n {
                let i = s.fed + k;
                let last = i + 1 == s.tokens.len();
                let score = scoring && i + 1 < s.prompt_len;
                if let Err(e) = batch.add(s.tokens[i], i as i32, &[s.id], last || score) {
                    failed = Some(e.to_string());
                    break 'plan;
                }
                if last {
                    rows.push((s.id, batch.n_tokens() - 1));
                }
                if score {
                    scored.push((s.id, i, batch.n_tokens() - 1));
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
        self.score_prompts(scored);
        for (id, row) in rows {
            self.sample(id, row);
        }
    }

    /// Reads the log-probabilities of the prompt tokens after `scored`'s positions, and sends
    /// each prompt's once it is read whole, before anything generated.
    fn score_prompts(&mut self, scored: Vec<(i32, usize, i32)>) {
        let vocab = self.model.vocab();
        let piece = |t: i32| vocab.token_to_piece(LlamaToken(t), true, None);
        for (id, at, row) in scored {
            let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
                continue;
            };
            let logits = self.ctx.get_logits_ith(row);
            let top = s.prompt_top.unwrap_or(0);
            s.prompt_probs
                .push(logprob(logits, s.tokens[at + 1].0, top, piece));
        }
        for s in self.running.iter_mut() {
            if s.prompt_top.is_some() && !s.prompt_sent && s.fed >= s.prompt_len {
                s.prompt_sent = true;
                let first = s.tokens[0].0;
                s.events.send(Event::PromptLogprobs(PromptLogprobs {
                    first: (first, piece(first)),
                    rest: std::mem::take(&mut s.prompt_probs),
                }));
            }
        }
    }

    /// Picks the next token of sequence `id` from batch row `row`, and sends its text.
    fn sample(&mut self, id: i32, row: i32) {
        let vocab = self.model.vocab();
        let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
            return;
        };
        if s.max_tokens == 0 {
            // The prompt alone was asked for.
            let waited = s.submitted.elapsed();
            let usage = Usage {
                prompt_tokens: s.prompt_len,
                completion_tokens: 0,
                time_to_first_token: waited,
                total: waited,
            };
            self.finish(id, Some(Ok((FinishReason::Length, usage))));
            return;
        }
        // Before `min_tokens`, or with `ignore_eos`, the tokens that would end the answer are
        // kept from being picked: their logits are set to -inf before the sampler chain runs.
        // A sequence held to a format is sampled the same way, so that a format that allows no
        // token the model can write (a pattern of characters no token holds) ends the answer
        // with an error, where llama.cpp would be handed a token its grammar cannot take.
        let early = s.generated < s.min_tokens;
        let bar_ends = early || s.ignore_eos;
        let token = if bar_ends || s.grammar.is_some() {
            let banned = |t: &LlamaToken| {
                (bar_ends && self.eog.binary_search(t).is_ok())
                    || (early && s.stop_tokens.contains(t))
            };
            let candidates = || {
                LlamaTokenDataArray::from_iter(
                    self.ctx.candidates_ith(row).map(|mut d| {
                        if banned(&d.id()) {
                            d.set_logit(f32::NEG_INFINITY);
                        }
                        d
                    }),
                    false,
                )
            };
            // The chain's own pick first. Held to a format, it is kept if the grammar takes
            // it (one token checked, not the whole vocabulary: the usual case); otherwise the
            // grammar is applied to every candidate and the chain picks again among those it
            // allows, which gives each allowed token the probability it has among them.
            let mut picked = pick(candidates(), &mut s.sampler);
            if let Some((grammar, _)) = s.grammar.as_mut() {
                let allowed = picked.is_some_and(|d| {
                    let mut one = LlamaTokenDataArray::new(vec![d], false);
                    one.apply_sampler(grammar);
                    one.data[0].logit() > f32::NEG_INFINITY
                });
                if !allowed {
                    let mut all = candidates();
                    all.apply_sampler(grammar);
                    picked = pick(all, &mut s.sampler);
                }
            }
            let accepted = picked
                .map(|d| d.id())
                .filter(|&t| match s.grammar.as_mut() {
                    Some((grammar, _)) => grammar.try_accept(t).is_ok(),
                    None => true,
                });
            let Some(token) = accepted else {
                let e = match s.grammar.as_ref().map(|(_, field)| *field) {
                    Some(field) => GenError::Invalid(format!(
                        "{field}: after {} tokens, the format allows none that this model can \
                         write",
                        s.generated
                    )),
                    None => GenError::Internal("the sampler picked no token".into()),
                };
                self.finish(id, Some(Err(e)));
                return;
            };
            s.sampler.accept(token);
            token
        } else {
            s.sampler.sample(&self.ctx, row)
        };
        let now = Instant::now();
        s.first_token.get_or_insert(now);
        s.generated += 1;
        let end = if s.stop_tokens.contains(&token) {
            Some(FinishReason::Stop(Some(StopBy::Token(token.0))))
        } else if vocab.is_eog(token) {
            Some(FinishReason::Stop(None))
        } else {
            if let Some(top) = s.logprobs {
                let logits = self.ctx.get_logits_ith(row);
                let piece = |t: i32| vocab.token_to_piece(LlamaToken(t), false, None);
                s.events
                    .send(Event::Logprob(logprob(logits, token.0, top, piece)));
            }
            s.text.push(&vocab.token_to_piece(token, s.special, None));
            if s.generated < s.min_tokens {
                // Stop strings are looked for only in what comes after `min_tokens`.
                s.text.pass_stops();
            }
            if let Some((at, len, which)) = s.text.stop_at(&s.stop) {
                s.text.truncate(if s.include_stop { at + len } else { at });
                Some(FinishReason::Stop(Some(StopBy::String(which))))
            } else if s.generated >= s.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            }
        };
        match end {
            None => {
                if let Some(text) = s.text.take(s.hold) {
                    s.events.send(Event::Text(text));
                }
                s.tokens.push(token);
            }
            Some(reason) => {
                if let Some(text) = s.text.take(0) {
                    s.events.send(Event::Text(text));
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
                s.events.send(Event::Done(reason, usage));
            }
            Some(Err(e)) => {
                s.events.send(Event::Error(e));
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

/// The candidate `chain` picks among `candidates`, unless every one it could pick is barred
/// (its logit -inf).
fn pick(mut candidates: LlamaTokenDataArray, chain: &mut LlamaSampler) -> Option<LlamaTokenData> {
    candidates.apply_sampler(chain);
    candidates
        .selected
        .and_then(|i| candidates.data.get(i).copied())
        .filter(|d| d.logit() > f32::NEG_INFINITY)
}
