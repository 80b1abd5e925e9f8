//! Open-loop load: fixed-rate streams (frames sent on a clock, whether or not earlier frames
//! came back) and bursts (many requests at the same instant).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{percentile, send, RequestBody};

/// Latencies (ms, sorted) and the number of failed requests.
pub struct Outcome {
    pub latencies_ms: Vec<f64>,
    pub errors: usize,
    pub elapsed: Duration,
}

/// `streams` streams, each sending one request every `1/fps` seconds for `duration`.
pub async fn streams(
    client: &reqwest::Client,
    url: &str,
    body: Arc<RequestBody>,
    streams: usize,
    fps: f64,
    duration: Duration,
) -> Outcome {
    let period = Duration::from_secs_f64(1.0 / fps);
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let (client, url, body) = (client.clone(), url.to_string(), body.clone());
            tokio::spawn(async move {
                // Streams start spread over one period, as independent cameras would.
                let offset = period.mul_f64(s as f64 / streams as f64);
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut frames = Vec::new();
                while started.elapsed() < duration {
                    tick.tick().await;
                    let (client, url, body) = (client.clone(), url.clone(), body.clone());
                    frames.push(tokio::spawn(
                        async move { send(&client, &url, &body).await },
                    ));
                }
                let mut out = Vec::new();
                for f in frames {
                    out.push(f.await.ok().flatten());
                }
                out
            })
        })
        .collect();
    collect(tasks, started).await
}

/// `n` requests sent at the same instant.
pub async fn burst(
    client: &reqwest::Client,
    url: &str,
    body: Arc<RequestBody>,
    n: usize,
) -> Outcome {
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_string(), body.clone());
            tokio::spawn(async move { vec![send(&client, &url, &body).await] })
        })
        .collect();
    collect(tasks, started).await
}

async fn collect(
    tasks: Vec<tokio::task::JoinHandle<Vec<Option<f64>>>>,
    started: Instant,
) -> Outcome {
    let mut latencies_ms = Vec::new();
    let mut errors = 0;
    for t in tasks {
        for r in t.await.unwrap_or_default() {
            match r {
                Some(ms) => latencies_ms.push(ms),
                None => errors += 1,
            }
        }
    }
    latencies_ms.sort_by(f64::total_cmp);
    Outcome {
        latencies_ms,
        errors,
        elapsed: started.elapsed(),
    }
}

impl Outcome {
    pub fn p(&self, q: f64) -> f64 {
        percentile(&self.latencies_ms, q)
    }
}
