//! The typed events of a background response made with `stream: true`, kept with it so that a
//! client can read them again from any point: the stream of its `POST`, and `GET
//! /v1/responses/{id}?stream=true&starting_after=N` (the events after sequence number `N`), each
//! follow the same log while the response runs and replay it once it has finished.
//!
//! An event's `sequence_number` is its place in the log. The log ends when the run that writes
//! it does, finished, failed or cancelled; its followers then end after its last event.

use std::sync::{Arc, Mutex};

use axum::response::sse::Event as SseEvent;
use futures::stream::{self, Stream};
use tokio::sync::watch;

/// One event of a streamed response: its type and its JSON (which carries both again).
#[derive(Debug, Clone)]
pub struct Typed {
    pub kind: &'static str,
    pub data: String,
}

impl Typed {
    /// The server-sent event.
    pub fn sse(&self) -> SseEvent {
        SseEvent::default().event(self.kind).data(&self.data)
    }
}

/// A background response's events so far, and whether its run has ended.
#[derive(Debug)]
pub struct EventLog {
    state: Mutex<State>,
    /// Wakes the followers: sent each time the log grows or ends.
    grew: watch::Sender<()>,
}

#[derive(Debug, Default)]
struct State {
    events: Vec<Typed>,
    bytes: usize,
    ended: bool,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            state: Mutex::new(State::default()),
            grew: watch::Sender::new(()),
        }
    }
}

impl EventLog {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes its events hold (what the store counts them as).
    pub fn bytes(&self) -> usize {
        self.state().bytes
    }

    /// The events from place `from` on, as they come, until the log ends.
    pub fn follow(self: Arc<Self>, from: usize) -> impl Stream<Item = Typed> + Send + 'static {
        let woken = self.grew.subscribe();
        stream::unfold((self, woken, from), |(log, mut woken, next)| async move {
            loop {
                // Seen before the log is read: whatever is written after wakes the wait below.
                woken.borrow_and_update();
                {
                    let state = log.state();
                    if let Some(event) = state.events.get(next) {
                        let event = event.clone();
                        drop(state);
                        return Some((event, (log, woken, next + 1)));
                    }
                    if state.ended {
                        return None;
                    }
                }
                // The sender lives in the log, which this holds: it is never dropped here.
                if woken.changed().await.is_err() {
                    return None;
                }
            }
        })
    }

    fn push(&self, event: Typed) {
        let mut state = self.state();
        if state.ended {
            return;
        }
        state.bytes += event.data.len() + event.kind.len();
        state.events.push(event);
        drop(state);
        self.grew.send_replace(());
    }

    fn end(&self) {
        self.state().ended = true;
        self.grew.send_replace(());
    }
}

/// What the run writes the log with; the log ends when it is dropped, however the run ends
/// (aborted by a cancel included).
pub struct Writer(pub Arc<EventLog>);

impl Writer {
    /// Adds `events` at the log's end.
    pub fn push(&self, events: impl IntoIterator<Item = Typed>) {
        for event in events {
            self.0.push(event);
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.end();
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn typed(n: usize) -> Typed {
        Typed {
            kind: "response.output_text.delta",
            data: format!("{{\"sequence_number\":{n}}}"),
        }
    }

    #[tokio::test]
    async fn followers_read_what_was_written_and_what_comes_until_the_end() {
        let log = Arc::new(EventLog::default());
        let writer = Writer(log.clone());
        writer.push([typed(0), typed(1)]);
        let from_start = tokio::spawn(log.clone().follow(0).collect::<Vec<_>>());
        let from_one = tokio::spawn(log.clone().follow(1).collect::<Vec<_>>());
        tokio::task::yield_now().await;
        writer.push([typed(2)]);
        tokio::task::yield_now().await;
        writer.push([typed(3)]);
        drop(writer);
        let data = |events: Vec<Typed>| events.into_iter().map(|e| e.data).collect::<Vec<_>>();
        let all = data(from_start.await.unwrap());
        assert_eq!(all, (0..4).map(|n| typed(n).data).collect::<Vec<_>>());
        assert_eq!(data(from_one.await.unwrap()), all[1..]);
        // Once ended, the log is replayed, and a follower past its end gets nothing.
        assert_eq!(data(log.clone().follow(2).collect().await), all[2..]);
        assert!(log.clone().follow(9).collect::<Vec<_>>().await.is_empty());
        assert!(log.bytes() > 0);
    }

    #[tokio::test]
    async fn a_run_that_stops_ends_its_followers() {
        let log = Arc::new(EventLog::default());
        let writer = Writer(log.clone());
        let run = tokio::spawn(async move {
            writer.push([typed(0)]);
            std::future::pending::<()>().await;
        });
        let follower = tokio::spawn(log.clone().follow(0).collect::<Vec<_>>());
        tokio::task::yield_now().await;
        run.abort();
        let events = tokio::time::timeout(std::time::Duration::from_secs(5), follower)
            .await
            .expect("the follower ends with the run")
            .unwrap();
        assert_eq!(events.len(), 1);
    }
}
