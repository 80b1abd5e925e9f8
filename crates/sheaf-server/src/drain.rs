//! Graceful shutdown: the drain that a SIGTERM or SIGINT starts, in two steps.
//!
//! 1. [`Drain::announce`]: readiness turns false over both protocols, so that load balancers
//!    (a Kubernetes Service's endpoints) stop sending here, while requests are still admitted
//!    and served (for `--drain-delay`). Every answer from then on tells its client to go
//!    elsewhere next time: `Connection: close` over HTTP/1.1, a GOAWAY over HTTP/2 and gRPC
//!    (see [`crate::listen`]).
//! 2. [`Drain::begin`]: new work is refused with 503 / UNAVAILABLE and a `Retry-After`, while
//!    the listeners stay open so that clients are told rather than refused a connection.
//!    [`Drain::idle`] resolves when the last admitted request is answered. If the shutdown
//!    timeout ends the drain first, [`Drain::cut`] tells open generation streams to end with
//!    an error event.
//!
//! Every request that does work (each POST over HTTP, inference and repository calls over
//! gRPC) is admitted through [`Drain::admit`], and holds its [`InFlight`] guard until its answer
//! has been sent, streams included.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

/// Seconds a refused client is told to wait before it retries (`Retry-After`).
pub const RETRY_AFTER_S: u32 = 1;

/// What the server is doing with new work.
#[derive(Debug)]
pub struct Drain {
    announced: watch::Sender<bool>,
    refusing: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
    cut: watch::Sender<bool>,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            announced: watch::Sender::new(false),
            refusing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            cut: watch::Sender::new(false),
        }
    }
}

/// Held by an admitted request until its answer has been sent.
#[derive(Debug)]
pub struct InFlight(Arc<Drain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drain {
    /// Admits a request, or `None` once [`Drain::begin`] has run.
    pub fn admit(self: &Arc<Self>) -> Option<InFlight> {
        if self.is_refusing() {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.clone());
        // A drain that began between the check and the count sees this request in flight, or
        // this request sees the drain: never neither.
        if self.is_refusing() {
            return None;
        }
        Some(guard)
    }

    /// The first step: readiness turns false and answers tell clients to reconnect, while new
    /// work is still admitted.
    pub fn announce(&self) {
        self.announced.send_replace(true);
    }

    /// The second step (the first too, if it has not run): new work is refused.
    pub fn begin(&self) {
        self.announce();
        self.refusing.store(true, Ordering::Release);
    }

    /// True once [`Drain::announce`] (or [`Drain::begin`]) has run: readiness is false.
    pub fn is_draining(&self) -> bool {
        *self.announced.borrow()
    }

    /// True once [`Drain::begin`] has run: new work is refused.
    pub fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    /// Resolves once the drain is announced.
    pub async fn announced(&self) {
        let mut rx = self.announced.subscribe();
        let _ = rx.wait_for(|&announced| announced).await;
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves when no admitted request is left unanswered.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Ends the drain's patience: open streams finish with an error event.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Resolves when [`Drain::cut`] has run.
    pub async fn cut_off(&self) {
        let mut rx = self.cut.subscribe();
        let _ = rx.wait_for(|&cut| cut).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_waits_for_the_last_admitted_request_and_the_drain_refuses_new_ones() {
        let drain = Arc::new(Drain::default());
        let first = drain.admit();
        let second = drain.admit();
        assert!(first.is_some() && second.is_some());
        assert_eq!(drain.in_flight(), 2);
        drain.begin();
        assert!(drain.admit().is_none(), "admitted after the drain began");
        assert_eq!(drain.in_flight(), 2);
        drop(first);
        let waiting = tokio::time::timeout(Duration::from_millis(50), drain.idle()).await;
        assert!(waiting.is_err(), "idle with a request still in flight");
        let d = drain.clone();
        let idle = tokio::spawn(async move { d.idle().await });
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), idle)
            .await
            .expect("idle once the last request was answered")
            .expect("task");
    }

    #[tokio::test]
    async fn an_announced_drain_still_admits_and_wakes_its_waiters() {
        let drain = Arc::new(Drain::default());
        let d = drain.clone();
        let waiter = tokio::spawn(async move { d.announced().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        assert!(!drain.is_draining());
        drain.announce();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("announced() resolves")
            .expect("task");
        assert!(drain.is_draining(), "readiness turns false");
        assert!(!drain.is_refusing());
        assert!(drain.admit().is_some(), "work is still admitted");
        drain.begin();
        assert!(drain.is_refusing());
        assert!(drain.admit().is_none());
    }

    #[tokio::test]
    async fn cut_off_resolves_after_cut() {
        let drain = Arc::new(Drain::default());
        let d = drain.clone();
        let waiter = tokio::spawn(async move { d.cut_off().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drain.cut();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("cut off")
            .expect("task");
    }
}
