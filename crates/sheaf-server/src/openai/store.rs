//! The responses `/v1/responses` keeps (`store`, true unless the request says false): each
//! answer's `response` object and the conversation it ends (the items of the responses it
//! follows, its own input items and its output items), so that a later request can go on from
//! it with `previous_response_id`, and `GET`/`DELETE /v1/responses/{id}` can read and remove it.
//!
//! They are kept in memory, within a budget of bytes (`--responses-store-mib`): past it, the
//! responses used least recently go first, and a request that names one gets a 404 saying so.
//! A conversation is kept whole with each response, so a long chain's later responses hold the
//! earlier text again; the budget counts all of it. A budget of 0 keeps nothing.
//!
//! A response made in the background (`background: true`) is kept from the start, `queued`,
//! and replaced by its finished object; while it runs, the store holds what stops it
//! ([`ResponseStore::running`]), so that `POST /v1/responses/{id}/cancel` can. One made with
//! `stream: true` as well is kept with its events ([`super::replay`]), which the budget counts
//! once it has finished.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::task::AbortHandle;

use super::budget::Budgeted;
use super::replay::EventLog;

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
    /// Its streamed events, for a background response made with `stream: true`.
    pub events: Option<Arc<EventLog>>,
}

impl Stored {
    /// The request's own input items.
    pub fn input_items(&self) -> &[Value] {
        self.items.get(self.input.clone()).unwrap_or_default()
    }
}

/// A response to keep: its object (with its `id`), the conversation `items` it ends, of which
/// `input` were the request's own input, and its events where it is streamed again.
#[derive(Debug)]
pub struct Keep {
    pub object: Value,
    pub items: Vec<Value>,
    pub input: Range<usize>,
    pub events: Option<Arc<EventLog>>,
}

impl Keep {
    /// A response answered while its connection was open (no events kept).
    pub fn answered(object: Value, items: Vec<Value>, input: Range<usize>) -> Keep {
        Keep {
            object,
            items,
            input,
            events: None,
        }
    }
}

/// The kept responses, by id.
#[derive(Debug)]
pub struct ResponseStore {
    budget: usize,
    kept: Mutex<Budgeted<Arc<Stored>>>,
    /// The background responses still running, by id: what stops each (none until its task
    /// is spawned).
    running: Mutex<HashMap<String, Option<AbortHandle>>>,
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
            kept: Mutex::new(Budgeted::new(budget)),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Counts the background response `id` as running, before its task is spawned.
    pub fn start(&self, id: &str) {
        self.running_map().insert(id.to_string(), None);
    }

    /// What stops the running background response `id`; a response cancelled before its task
    /// was spawned is stopped at once.
    pub fn running(&self, id: &str, stop: AbortHandle) {
        match self.running_map().get_mut(id) {
            Some(slot) => *slot = Some(stop),
            None => stop.abort(),
        }
    }

    /// A background response's object while it runs (`in_progress`), or finished: keeps it, as
    /// [`ResponseStore::keep`] does, unless it was cancelled meanwhile. A finished one is no
    /// longer running.
    pub fn update(&self, kept: Keep, finished: bool) {
        let id = kept.object["id"].as_str().unwrap_or_default().to_string();
        // Under the running lock, so that a cancel is not overwritten.
        let mut running = self.running_map();
        let still = if finished {
            running.remove(&id).is_some()
        } else {
            running.contains_key(&id)
        };
        if still {
            self.keep(kept);
        }
    }

    /// Stops the background response `id` if it is still running, and keeps it `cancelled`;
    /// whether it was running.
    pub fn cancel(&self, id: &str) -> bool {
        let mut running = self.running_map();
        let Some(stop) = running.remove(id) else {
            return false;
        };
        if let Some(stop) = stop {
            stop.abort();
        }
        if let Some(kept) = self.get(id) {
            let mut object = kept.object.clone();
            object["status"] = Value::from("cancelled");
            self.keep(Keep {
                object,
                items: kept.items.clone(),
                input: kept.input.clone(),
                events: kept.events.clone(),
            });
        }
        true
    }

    fn running_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<AbortHandle>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether anything is kept at all.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Keeps a response; one larger than the whole budget is not kept. Others go, least
    /// recently used first, to make room.
    pub fn keep(&self, kept: Keep) {
        let Keep {
            object,
            items,
            input,
            events,
        } = kept;
        let Some(id) = object["id"].as_str().map(str::to_string) else {
            return;
        };
        let size = object.to_string().len()
            + items.iter().map(|i| i.to_string().len()).sum::<usize>()
            + events.as_ref().map_or(0, |e| e.bytes())
            + id.len();
        let stored = Arc::new(Stored {
            object,
            items,
            input,
            events,
        });
        self.kept().put(id, stored, size);
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Budgeted<Arc<Stored>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The response `id`, marked as used.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.kept().get(id).cloned()
    }

    /// Removes the response `id`; whether it was kept.
    pub fn remove(&self, id: &str) -> bool {
        self.kept().remove(id).is_some()
    }

    /// The bytes kept.
    pub fn bytes(&self) -> usize {
        self.kept().bytes()
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
        store.keep(Keep::answered(
            response("resp_1", "hi"),
            vec![json!({ "role": "user" })],
            0..1,
        ));
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
        store.keep(Keep::answered(
            response("resp_a", &"x".repeat(300)),
            Vec::new(),
            0..0,
        ));
        store.keep(Keep::answered(
            response("resp_b", &"y".repeat(300)),
            Vec::new(),
            0..0,
        ));
        // `a` used last: `b` goes when `c` comes.
        assert!(store.get("resp_a").is_some());
        store.keep(Keep::answered(
            response("resp_c", &"z".repeat(300)),
            Vec::new(),
            0..0,
        ));
        assert!(store.get("resp_a").is_some());
        assert!(store.get("resp_b").is_none());
        assert!(store.get("resp_c").is_some());
        assert!(store.bytes() <= one * 2 + 10);
    }

    #[tokio::test]
    async fn a_cancelled_background_response_stays_cancelled() {
        let store = ResponseStore::new(1 << 20);
        let queued = json!({ "id": "resp_b", "status": "queued", "output": [] });
        store.start("resp_b");
        store.update(
            Keep::answered(queued, vec![json!({ "role": "user" })], 0..1),
            false,
        );
        let running = tokio::spawn(std::future::pending::<()>());
        store.running("resp_b", running.abort_handle());
        assert!(store.cancel("resp_b"));
        assert!(running.await.unwrap_err().is_cancelled());
        // What the stopped run would have written comes too late to replace it.
        let late = json!({ "id": "resp_b", "status": "completed", "output": ["text"] });
        store.update(Keep::answered(late.clone(), Vec::new(), 0..0), false);
        store.update(Keep::answered(late, Vec::new(), 0..0), true);
        let kept = store.get("resp_b").expect("kept");
        assert_eq!(kept.object["status"], "cancelled");
        assert_eq!(kept.input_items().len(), 1);
        // Cancelled again, or finished: nothing is running.
        assert!(!store.cancel("resp_b"));
        // A response cancelled before its run was spawned is stopped as the run is handed in.
        store.start("resp_c");
        assert!(store.cancel("resp_c"));
        let late = tokio::spawn(std::future::pending::<()>());
        store.running("resp_c", late.abort_handle());
        assert!(late.await.unwrap_err().is_cancelled());
    }

    #[tokio::test]
    async fn a_background_response_let_go_while_it_runs_is_still_stopped() {
        let store = ResponseStore::new(40);
        store.start("resp_e");
        let big = json!({ "id": "resp_e", "status": "queued", "pad": "x".repeat(100) });
        store.update(Keep::answered(big, Vec::new(), 0..0), false);
        assert!(store.get("resp_e").is_none());
        let running = tokio::spawn(std::future::pending::<()>());
        store.running("resp_e", running.abort_handle());
        assert!(store.cancel("resp_e"));
        assert!(running.await.unwrap_err().is_cancelled());
        assert!(store.get("resp_e").is_none());
    }

    #[test]
    fn a_finished_background_response_replaces_its_queued_object() {
        let store = ResponseStore::new(1 << 20);
        let status = |to: &str, finished: bool| {
            let object = json!({ "id": "resp_d", "status": to });
            store.update(Keep::answered(object, Vec::new(), 0..0), finished);
            store.get("resp_d").unwrap().object["status"].clone()
        };
        store.start("resp_d");
        assert_eq!(status("queued", false), "queued");
        assert_eq!(status("in_progress", false), "in_progress");
        assert_eq!(status("completed", true), "completed");
        assert!(!store.cancel("resp_d"));
        assert_eq!(store.get("resp_d").unwrap().object["status"], "completed");
    }

    #[test]
    fn nothing_is_kept_without_a_budget_or_past_it() {
        let off = ResponseStore::new(0);
        assert!(!off.enabled());
        off.keep(Keep::answered(response("resp_1", "hi"), Vec::new(), 0..0));
        assert!(off.get("resp_1").is_none());
        let small = ResponseStore::new(40);
        small.keep(Keep::answered(
            response("resp_2", &"x".repeat(100)),
            Vec::new(),
            0..0,
        ));
        assert!(small.get("resp_2").is_none());
        assert_eq!(small.bytes(), 0);
    }
}
