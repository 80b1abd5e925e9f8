//! Text generation: a model whose backend generates (a GGUF language model) holds a
//! [`Generator`], an engine that batches the sequences of every request token by token.
//!
//! [`ModelHandle::generate`] gives a request its place in the engine's queue (its priority level
//! and deadline, from the request or the model's `priority_levels`, `default_priority_level`
//! and `default_timeout_us`, as for tensor requests), and submits it. The engine checks the
//! request (template, tokens, length, format) before it queues it, so a bad request fails here,
//! at once. Each choice's text then comes back over its own channel, which the protocol renders
//! (OpenAI's JSON or server-sent events). Dropping a channel cancels its choice.

use std::sync::Arc;

use sheaf_backend::generation::{Event, EventSink, GenRequest, Generator, Prompt, Rendering};
use tokio::sync::mpsc;

use crate::{InferError, ModelHandle};

/// One generation request, in protocol-neutral terms.
#[derive(Debug, Clone)]
pub struct Generate {
    pub request: GenRequest,
    /// Choices (OpenAI's `n`), sampled with seeds `seed`, `seed + 1`, …
    pub choices: usize,
    /// 1 is the highest level; none or 0: the model's default level.
    pub priority: Option<u64>,
    /// Microseconds it may wait for a sequence slot; none or 0: the model's default.
    pub timeout_us: Option<u64>,
}

/// Refuses `choices` outside 1 to `most` (the sequences the engine decodes together), which a
/// request declares before anything is made for them.
pub fn check_choices(choices: usize, most: usize) -> Result<(), InferError> {
    if choices == 0 || choices > most {
        return Err(InferError::invalid(format!(
            "n: {choices} choices; this model runs 1 to {most} at once"
        )));
    }
    Ok(())
}

/// `n` sinks, each passing a choice's events to the channel beside it.
pub fn channels(n: usize) -> (Vec<Box<dyn EventSink>>, Vec<mpsc::UnboundedReceiver<Event>>) {
    (0..n)
        .map(|_| {
            let (tx, rx) = mpsc::unbounded_channel();
            (Box::new(ChannelSink(tx)) as Box<dyn EventSink>, rx)
        })
        .unzip()
}

/// Passes a choice's events to the channel its request reads.
struct ChannelSink(mpsc::UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

impl ModelHandle {
    /// The engine of a generation model; a tensor model is refused, with the routes it takes.
    pub fn generator(&self) -> Result<&Arc<dyn Generator>, InferError> {
        self.generator.as_ref().ok_or_else(|| {
            InferError::invalid(format!(
                "model '{}' is a tensor model, which does not generate text: use POST \
                 /v2/models/{}/infer",
                self.name, self.name
            ))
        })
    }

    /// Whether the model generates text, served on the OpenAI-compatible routes.
    pub fn is_generator(&self) -> bool {
        self.generator.is_some()
    }

    /// Queues `g` and returns one channel per choice, each carrying its text, then its end.
    /// A request the engine refuses (a bad prompt, a full queue) fails here; so does one for
    /// more choices than the engine runs at once, before a channel is made for any.
    pub fn generate(&self, g: Generate) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, InferError> {
        let generator = self.generator()?;
        check_choices(g.choices, generator.info().max_choices)?;
        let admission = self.admission(g.priority, g.timeout_us)?;
        let mut request = g.request;
        request.priority = admission.level;
        request.deadline = admission.timeout.map(|t| std::time::Instant::now() + t);
        let (sinks, receivers) = channels(g.choices);
        generator.submit(request, sinks)?;
        Ok(receivers)
    }

    /// The token ids of `prompt` rendered as `rendering` says, as a generation request would
    /// feed them.
    pub fn tokenize(&self, prompt: &Prompt, rendering: Rendering) -> Result<Vec<i32>, InferError> {
        Ok(self.generator()?.tokenize(prompt, rendering)?)
    }

    /// The text of `tokens`.
    pub fn detokenize(&self, tokens: &[i32]) -> Result<String, InferError> {
        Ok(self.generator()?.detokenize(tokens)?)
    }
}
