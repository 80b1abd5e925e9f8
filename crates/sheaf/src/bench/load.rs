//! Load patterns. Each returns the latencies and errors it saw.
//! - closed loop: `concurrency` clients each send, wait, send again;
//! - rate: Poisson arrivals at `rate` requests/s (open loop, so queueing shows);
//! - streams: N streams each sending on a fixed clock (`fps`), as cameras do;
//! - burst: N requests at the same instant;
//! - users: U users each sending R requests one after another.
//!
//! A limit of `requests` (when set) stops a pattern early; frames cycle from `start`. The open
//! loops (rate, streams, burst) keep at most `outstanding` requests in flight: an arrival past
//! that waits for one to finish, so a rate the client cannot keep up with slows the schedule
//! down instead of opening connections without end, and the requests that waited are counted.
//! Until the schedule catches up again, each request is timed from its arrival instant, so that
//! the time it waited is part of its latency, as it would be a user's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand_distr::{Distribution, Exp};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::transport::{Place, Transport};

/// What one pattern observed.
#[derive(Debug, Default)]
pub struct Samples {
    /// Latencies of successful requests in ms, sorted.
    pub latencies_ms: Vec<f64>,
    pub errors: BTreeMap<String, usize>,
    pub elapsed: Duration,
    /// Requests of an open loop that waited for a place in flight: `outstanding` requests
    /// were in flight at their arrival instant, so they were sent behind their schedule.
    pub waited: usize,
}

/// Bounds shared by the patterns.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub duration: Duration,
    /// Stop after this many requests in all.
    pub requests: Option<usize>,
    /// First frame index.
    pub start: usize,
    /// Most requests an open loop keeps in flight at once.
    pub outstanding: usize,
}

/// How far an open loop has fallen behind its schedule.
#[derive(Default)]
struct Behind {
    /// Requests that waited for a place in flight.
    waited: usize,
    /// Whether a wait for a place has put the schedule behind, and it has not caught up since.
    slipped: bool,
}

/// Hands out frame numbers and counts requests against the limit.
struct Ticket {
    next: AtomicUsize,
    limits: Limits,
    started: Instant,
    done: AtomicUsize,
    bar: ProgressBar,
    /// Open loops' requests in flight.
    in_flight: Arc<Semaphore>,
}

impl Ticket {
    fn new(limits: Limits, label: String) -> Arc<Ticket> {
        let bar = match limits.requests {
            Some(n) => ProgressBar::new(n as u64),
            None => ProgressBar::new(limits.duration.as_millis() as u64),
        };
        bar.set_style(
            ProgressStyle::with_template("{prefix:>14} [{bar:30}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(label);
        Arc::new(Ticket {
            next: AtomicUsize::new(0),
            limits,
            started: Instant::now(),
            done: AtomicUsize::new(0),
            bar,
            in_flight: Arc::new(Semaphore::new(
                limits.outstanding.min(Semaphore::MAX_PERMITS),
            )),
        })
    }

    /// The next frame to send, or `None` once the time or request budget is spent.
    fn take(&self) -> Option<usize> {
        if self.limits.requests.is_none() && self.started.elapsed() >= self.limits.duration {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        if self.limits.requests.is_some_and(|max| n >= max) {
            return None;
        }
        Some(self.limits.start.wrapping_add(n))
    }

    /// Waits for an open loop's next arrival instant `at` and for a place in flight, and
    /// says by how many ms the request is late when the schedule has slipped behind a wait for
    /// a place: that lateness is part of its latency. `None` once the time budget is spent
    /// while waiting.
    async fn arrive(
        &self,
        at: tokio::time::Instant,
        behind: &mut Behind,
    ) -> Option<(OwnedSemaphorePermit, f64)> {
        if at > tokio::time::Instant::now() {
            // On schedule again: what the timer adds on waking is not the server's.
            behind.slipped = false;
            tokio::time::sleep_until(at).await;
        }
        let permit = match self.in_flight.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                behind.waited += 1;
                behind.slipped = true;
                let permit = self.in_flight.clone().acquire_owned().await.ok()?;
                let spent = self.limits.requests.is_none()
                    && self.started.elapsed() >= self.limits.duration;
                if spent {
                    return None;
                }
                permit
            }
        };
        let late = match behind.slipped {
            true => at.elapsed().as_secs_f64() * 1e3,
            false => 0.0,
        };
        Some((permit, late))
    }

    fn finished(&self) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        match self.limits.requests {
            Some(_) => self.bar.set_position(done as u64),
            None => self
                .bar
                .set_position(self.started.elapsed().as_millis() as u64),
        }
        if done.is_multiple_of(64) {
            self.bar.set_message(format!("{done} requests"));
        }
    }
}

type Outcome = Vec<Result<f64, String>>;

async fn collect(tasks: Vec<tokio::task::JoinHandle<Outcome>>, ticket: &Ticket) -> Samples {
    let mut s = Samples::default();
    for t in tasks {
        for r in t.await.unwrap_or_default() {
            match r {
                Ok(ms) => s.latencies_ms.push(ms),
                Err(kind) => *s.errors.entry(kind).or_default() += 1,
            }
        }
    }
    s.elapsed = ticket.started.elapsed();
    ticket.bar.finish_and_clear();
    s.latencies_ms.sort_by(f64::total_cmp);
    s
}

/// `clients` closed-loop clients.
pub async fn closed(transport: &Transport, clients: usize, limits: Limits) -> Samples {
    let ticket = Ticket::new(limits, format!("concurrency {clients}"));
    let tasks = (0..clients)
        .map(|_| {
            let (mut t, ticket) = (transport.clone(), ticket.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                while let Some(frame) = ticket.take() {
                    out.push(t.send(frame).await);
                    ticket.finished();
                }
                out
            })
        })
        .collect();
    collect(tasks, &ticket).await
}

/// Spawns one request per arrival instant that `next_gap` yields, until the budget is spent,
/// with at most `outstanding` in flight; `send` sends the `n`th request (of `frame`) and gives
/// its latency in ms, or the kind of error.
async fn open_loop<F, Fut>(
    transport: &Transport,
    ticket: Arc<Ticket>,
    mut next_gap: impl FnMut() -> Duration,
    send: F,
) -> Samples
where
    F: Fn(Transport, usize, usize) -> Fut,
    Fut: std::future::Future<Output = Result<f64, String>> + Send + 'static,
{
    let mut handles = Vec::new();
    let mut at = tokio::time::Instant::now();
    let mut behind = Behind::default();
    let mut n = 0;
    while let Some(frame) = ticket.take() {
        let Some((permit, late_ms)) = ticket.arrive(at, &mut behind).await else {
            break;
        };
        let (sent, tk) = (send(transport.clone(), frame, n), ticket.clone());
        handles.push(tokio::spawn(async move {
            let r = sent.await.map(|ms| ms + late_ms);
            tk.finished();
            drop(permit);
            vec![r]
        }));
        n += 1;
        at += next_gap();
    }
    Samples {
        waited: behind.waited,
        ..collect(handles, &ticket).await
    }
}

/// Sends `frame` as a request of its own.
async fn one(mut t: Transport, frame: usize, _: usize) -> Result<f64, String> {
    t.send(frame).await
}

/// Poisson arrivals at `rate` requests per second.
pub async fn rate(transport: &Transport, rate: f64, limits: Limits) -> Samples {
    let ticket = Ticket::new(limits, format!("rate {rate}/s"));
    let exp = Exp::new(rate).unwrap_or_else(|_| Exp::new(1.0).unwrap_or_else(|_| unreachable!()));
    let mut rng = rand::rng();
    open_loop(
        transport,
        ticket,
        move || Duration::from_secs_f64(exp.sample(&mut rng)),
        one,
    )
    .await
}

/// `streams` streams at `fps` frames per second each, spread over one period. With
/// `sequences` (the first id), stream `k` is sequence `first + k`: each is opened first (its
/// start request, not counted), so that no frame overtakes its sequence's start, and ended
/// after the level's last frame (not counted either), so that the next level has every slot.
pub async fn streams(
    transport: &Transport,
    streams: usize,
    fps: f64,
    limits: Limits,
    sequences: Option<u64>,
) -> Samples {
    let label = format!("{streams} streams");
    let gap = Duration::from_secs_f64(1.0 / fps / streams.max(1) as f64);
    let Some(first) = sequences else {
        return open_loop(transport, Ticket::new(limits, label), move || gap, one).await;
    };
    let streams = streams.max(1);
    let opening: Vec<_> = (0..streams)
        .map(|k| {
            let mut t = transport.clone();
            tokio::spawn(async move { t.send_in_sequence(k, first + k as u64, Place::Start).await })
        })
        .collect();
    let mut refused = 0;
    for o in opening {
        if !matches!(o.await, Ok(Ok(_))) {
            refused += 1;
        }
    }
    if refused > 0 {
        eprintln!("{refused} of {streams} sequences could not be opened; their frames will fail");
    }
    let ticket = Ticket::new(limits, label);
    let samples = open_loop(
        transport,
        ticket,
        move || gap,
        move |mut t, frame, n| {
            let id = first + (n % streams) as u64;
            async move { t.send_in_sequence(frame, id, Place::Middle).await }
        },
    )
    .await;
    let ending: Vec<_> = (0..streams)
        .map(|k| {
            let mut t = transport.clone();
            tokio::spawn(async move { t.send_in_sequence(k, first + k as u64, Place::End).await })
        })
        .collect();
    for e in ending {
        let _ = e.await;
    }
    samples
}

/// `n` requests at the same instant.
pub async fn burst(transport: &Transport, n: usize, limits: Limits) -> Samples {
    let limits = Limits {
        duration: Duration::from_secs(3600),
        requests: Some(n),
        ..limits
    };
    let ticket = Ticket::new(limits, format!("burst {n}"));
    open_loop(transport, ticket, || Duration::ZERO, one).await
}

/// `users` users, each sending `per_user` requests one after another.
pub async fn users(transport: &Transport, users: usize, per_user: usize, start: usize) -> Samples {
    let limits = Limits {
        duration: Duration::from_secs(3600),
        requests: Some(users.saturating_mul(per_user)),
        start,
        outstanding: users,
    };
    let ticket = Ticket::new(limits, format!("{users} users"));
    let tasks = (0..users)
        .map(|u| {
            let (mut t, ticket) = (transport.clone(), ticket.clone());
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(per_user);
                for r in 0..per_user {
                    out.push(
                        t.send(start.wrapping_add(u.wrapping_mul(per_user)).wrapping_add(r))
                            .await,
                    );
                    ticket.finished();
                }
                out
            })
        })
        .collect();
    collect(tasks, &ticket).await
}
