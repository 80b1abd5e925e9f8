//! What passes from an engine's handle to its thread: a checked request, and the count of
//! choices still pending.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::token::LlamaToken;
use sheaf_backend::generation::{EventSink, GenRequest};

use crate::grammar::Grammar;

/// One choice counted as pending from its submission until its sequence is dropped, whether it
/// finished, failed, or was never started.
pub(crate) struct PendingGuard(pub Arc<AtomicUsize>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request checked and tokenised, on its way to the engine thread.
pub(crate) struct Submitted {
    pub request: GenRequest,
    pub tokens: Vec<LlamaToken>,
    pub grammar: Option<Grammar>,
    /// One per choice, with its pending count.
    pub sinks: Vec<(Box<dyn EventSink>, PendingGuard)>,
    pub at: Instant,
}
