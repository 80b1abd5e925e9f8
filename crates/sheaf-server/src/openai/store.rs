//! The responses `/v1/responses` keeps (`store`, true unless the request says false): each
//! answer's `response` object and the conversation it ends (the items of the responses it
//! follows, its own input items and its output items), so that a later request can go on from
//! it with `previous_response_id`, and `GET`/`DELETE /v1/responses/{id}` can read and remove it.
//!
//! They are kept in memory, within a budget of bytes (`--responses-store-mib`): past it, the
//! responses used least recently go first, and a request that names one gets a 404 saying so.
//! A conversation is kept whole with each response, so a long chain's later responses hold the
//! earlier text again; the budget counts all of it. A budget of 0 keeps nothing.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use serde_json::Value;

/// One kept response.
#[derive(Debug)]
pub struct Stored {
    /// The `response` object as it was answered.
    pub object: Value,
    /// The conversation's items up to and including this response's output, in the input
    /// items' form: what a request naming it as `previous_response_id` goes on from.
    pub items: Vec<Value>,
    /// Which of `items` were the request's own input.
    input: Range<usize>,
    /// The bytes it is counted as.
    size: usize,
}

impl Stored {
    /// The request's own input items.
    pub fn input_items(&self) -> &[Value] {
        self.items.get(self.input.clone()).unwrap_or_default()
    }
}

/// The kept responses, by id.
#[derive(Debug)]
pub struct ResponseStore {
    budget: usize,
    kept: Mutex<Kept>,
}

#[derive(Debug)]
struct Kept {
    by_id: LruCache<String, Arc<Stored>>,
    bytes: usize,
}

/// The default budget, in MiB.
pub const DEFAULT_MIB: usize = 64;

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(DEFAULT_MIB << 20)
    }
}

impl ResponseStore {
    /// A store of at most `budget` bytes (0: none is kept).
    pub fn new(budget: usize) -> ResponseStore {
        ResponseStore {
            budget,
            kept: Mutex::new(Kept {
                by_id: LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    /// Whether anything is kept at all.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Keeps `object` (its `id`) with the conversation `items`, of which `input` were the
    /// request's own input; a response larger than the whole budget is not kept. Others go,
    /// least recently used first, to make room.
    pub fn keep(&self, object: Value, items: Vec<Value>, input: Range<usize>) {
        let Some(id) = object["id"].as_str().map(str::to_string) else {
            return;
        };
        let size = object.to_string().len()
            + items.iter().map(|i| i.to_string().len()).sum::<usize>()
            + id.len();
        if size > self.budget {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        while kept.bytes + size > self.budget {
            match kept.by_id.pop_lru() {
                Some((_, old)) => kept.bytes -= old.size,
                None => break,
            }
        }
        let stored = Arc::new(Stored {
            object,
            items,
            input,
            size,
        });
        if let Some(old) = kept.by_id.put(id, stored) {
            kept.bytes -= old.size;
        }
        kept.bytes += size;
    }

    /// The response `id`, marked as used.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.by_id.get(id).cloned()
    }

    /// Removes the response `id`; whether it was kept.
    pub fn remove(&self, id: &str) -> bool {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        match kept.by_id.pop(id) {
            Some(old) => {
                kept.bytes -= old.size;
                true
            }
            None => false,
        }
    }

    /// The bytes kept.
    pub fn bytes(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn response(id: &str, text: &str) -> Value {
        json!({ "id": id, "object": "response", "output": [{ "type": "message", "text": text }] })
    }

    #[test]
    fn keeps_finds_and_removes() {
        let store = ResponseStore::new(1 << 20);
        store.keep(
            response("resp_1", "hi"),
            vec![json!({ "role": "user" })],
            0..1,
        );
        let found = store.get("resp_1").expect("kept");
        assert_eq!(found.object["output"][0]["text"], "hi");
        assert_eq!(found.items.len(), 1);
        assert_eq!(found.input_items().len(), 1);
        assert!(store.bytes() > 0);
        assert!(store.remove("resp_1"));
        assert!(!store.remove("resp_1"));
        assert!(store.get("resp_1").is_none());
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn the_least_recently_used_go_first_past_the_budget() {
        let one = response("resp_a", &"x".repeat(300)).to_string().len() + 6;
        let store = ResponseStore::new(one * 2 + 10);
        store.keep(response("resp_a", &"x".repeat(300)), Vec::new(), 0..0);
        store.keep(response("resp_b", &"y".repeat(300)), Vec::new(), 0..0);
        // `a` used last: `b` goes when `c` comes.
        assert!(store.get("resp_a").is_some());
        store.keep(response("resp_c", &"z".repeat(300)), Vec::new(), 0..0);
        assert!(store.get("resp_a").is_some());
        assert!(store.get("resp_b").is_none());
        assert!(store.get("resp_c").is_some());
        assert!(store.bytes() <= one * 2 + 10);
    }

    #[test]
    fn nothing_is_kept_without_a_budget_or_past_it() {
        let off = ResponseStore::new(0);
        assert!(!off.enabled());
        off.keep(response("resp_1", "hi"), Vec::new(), 0..0);
        assert!(off.get("resp_1").is_none());
        let small = ResponseStore::new(40);
        small.keep(response("resp_2", &"x".repeat(100)), Vec::new(), 0..0);
        assert!(small.get("resp_2").is_none());
        assert_eq!(small.bytes(), 0);
    }
}
