//! The traces a batch's requests are kept for, by the number the model process knows each
//! one by: a request of the batch message that may be traced carries a `trace` number, the
//! model passes it on with `InferenceRequest(..., trace=request.trace())`, and the request it
//! sends with `exec()` names it, so that the server leaves that call's account with the first
//! request's (see [`sheaf_backend::caller`]). A number is forgotten once its batch has been
//! answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sheaf_backend::TraceCalls;

/// The numbers of one process's requests that may be traced; clones share them.
#[derive(Clone, Default)]
pub(crate) struct Traced(Arc<Mutex<Numbered>>);

#[derive(Default)]
struct Numbered {
    last: u64,
    calls: HashMap<u64, TraceCalls>,
}

impl Traced {
    /// Numbers a request's place for its calls.
    pub(crate) fn number(&self, calls: &TraceCalls) -> u64 {
        let mut numbered = self.lock();
        numbered.last += 1;
        let number = numbered.last;
        numbered.calls.insert(number, calls.clone());
        number
    }

    /// The place `number` names, while its batch is not yet answered.
    pub(crate) fn calls(&self, number: u64) -> Option<TraceCalls> {
        self.lock().calls.get(&number).cloned()
    }

    /// Forgets `numbers`: their batch has been answered.
    pub(crate) fn forget(&self, numbers: &[u64]) {
        let mut numbered = self.lock();
        for number in numbers {
            numbered.calls.remove(number);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Numbered> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_names_its_request_s_place_until_it_is_forgotten() {
        let traced = Traced::default();
        let (a, b) = (TraceCalls::default(), TraceCalls::default());
        let (na, nb) = (traced.number(&a), traced.number(&b));
        assert_ne!(na, nb);
        assert_eq!(traced.calls(na), Some(a));
        assert_eq!(traced.calls(nb), Some(b.clone()));
        traced.forget(&[na]);
        assert_eq!(traced.calls(na), None);
        assert_eq!(traced.calls(nb), Some(b));
        assert_eq!(traced.calls(nb + 1), None);
    }
}
