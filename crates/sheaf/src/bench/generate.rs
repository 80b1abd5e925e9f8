//! `sheaf bench --generate`: load for OpenAI-compatible generation servers (sheaf's `/v1` routes,
//! or any peer such as llama-server). At each `--concurrency` level, that many clients stream
//! chat completions back to back (`--requests` in all, or until `--duration` has passed, else
//! twice the level's concurrency); it reports completion tokens per second, time to first token
//! (p50/p99) and the mean gap between tokens. Concurrency 1 is the requests run one after another.
//! With `--in-process FILE.gguf`, the same requests also run on an engine inside the bench
//! process (no HTTP), and each level reports served/in-process tokens/s.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::BenchArgs;

/// What one streamed request measured.
struct Sample {
    ttft: Duration,
    total: Duration,
    tokens: usize,
}

const TOPICS: [&str; 8] = [
    "a dragon",
    "the sea",
    "a robot",
    "a forest",
    "the moon",
    "a city",
    "a river",
    "a mountain",
];

/// Streams one chat completion; tokens are the usage figure when the server sends one, else the
/// number of content chunks.
async fn one(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    i: usize,
    max_tokens: usize,
    system: Option<&str>,
) -> anyhow::Result<Sample> {
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": system}));
    }
    let topic = TOPICS[i % TOPICS.len()];
    messages.push(json!({"role": "user", "content": format!("Write a story about {topic}.")}));
    let body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let mut response = client
        .post(url)
        .json(&body)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    if !response.status().is_success() {
        let status = response.status();
        bail!("{status}: {}", response.text().await.unwrap_or_default());
    }
    let (mut ttft, mut chunks, mut usage) = (None, 0, None);
    let mut pending = String::new();
    while let Some(bytes) = response.chunk().await? {
        pending.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            if let Some(u) = chunk["usage"]["completion_tokens"].as_u64() {
                usage = Some(u as usize);
            }
            let text = chunk["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("");
            if !text.is_empty() {
                ttft.get_or_insert_with(|| started.elapsed());
                chunks += 1;
            }
        }
    }
    Ok(Sample {
        ttft: ttft.unwrap_or_else(|| started.elapsed()),
        total: started.elapsed(),
        tokens: usage.unwrap_or(chunks),
    })
}

/// Tokens/s of `requests` chat requests at `concurrency`, submitted straight to `engine`.
async fn in_process(
    engine: &std::sync::Arc<sheaf_llama::Engine>,
    concurrency: usize,
    requests: usize,
    max_tokens: usize,
) -> anyhow::Result<f64> {
    use sheaf_backend::generation::{Event, GenRequest, Generator, Prompt, Sampling};
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            tokio::spawn(async move {
                let mut tokens = 0;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= requests {
                        return Ok::<usize, anyhow::Error>(tokens);
                    }
                    let prompt = Prompt::Chat(vec![(
                        "user".into(),
                        format!("Write a story about {}.", TOPICS[i % TOPICS.len()]),
                    )]);
                    let request = GenRequest {
                        sampling: Sampling {
                            temperature: 0.0,
                            ..Sampling::default()
                        },
                        ..GenRequest::new(prompt, max_tokens)
                    };
                    let (sinks, mut receivers) = sheaf_core::generate::channels(1);
                    engine.submit(request, sinks)?;
                    let Some(mut events) = receivers.pop() else {
                        bail!("no channel for the in-process request");
                    };
                    while let Some(event) = events.recv().await {
                        match event {
                            Event::Text(_) | Event::Logprob(_) | Event::PromptLogprobs(_) => {}
                            Event::Done(_, usage) => tokens += usage.completion_tokens,
                            Event::Error(e) => bail!("in-process request failed: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    let mut tokens = 0;
    for w in workers {
        tokens += w.await??;
    }
    Ok(tokens as f64 / started.elapsed().as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let client = crate::client::http_client(args.api_key.as_deref(), &args.headers)?;
    let url = format!("{}/v1/chat/completions", args.url);
    println!(
        "sheaf bench --generate: model {} at {}, {} tokens at most per request",
        args.model, args.url, args.max_tokens
    );
    println!(
        "{:>11} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "concurrency", "requests", "tokens", "tokens/s", "ttft p50", "ttft p99", "itl ms", "errors"
    );
    let engine = match &args.in_process {
        Some(path) => {
            let path = path.clone();
            Some(
                tokio::task::spawn_blocking(move || {
                    sheaf_llama::Engine::start(
                        &path,
                        sheaf_backend::Device::Cpu,
                        sheaf_backend::generation::GenerationSpec::default(),
                    )
                })
                .await??,
            )
        }
        None => None,
    };
    let mut rows = Vec::new();
    for &concurrency in &args.concurrency {
        let started = Instant::now();
        // A count of requests, or a time after which the clients start no more.
        let (requests, until) = match (args.requests, args.duration) {
            (Some(n), _) => (n.max(concurrency), None),
            (None, Some(seconds)) => (usize::MAX, Some(started + Duration::from_secs_f64(seconds))),
            (None, None) => (concurrency * 2, None),
        };
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (client, url, model, next) = (
                    client.clone(),
                    url.clone(),
                    args.model.clone(),
                    next.clone(),
                );
                let max_tokens = args.max_tokens;
                let system = args.system.clone();
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= requests || until.is_some_and(|t| Instant::now() >= t) {
                            return out;
                        }
                        out.push(
                            one(&client, &url, &model, i, max_tokens, system.as_deref()).await,
                        );
                    }
                })
            })
            .collect();
        let mut samples = Vec::new();
        let mut errors = 0;
        for w in workers {
            for r in w.await? {
                match r {
                    Ok(s) => samples.push(s),
                    Err(e) => {
                        errors += 1;
                        tracing::warn!("request failed: {e}");
                    }
                }
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let tokens: usize = samples.iter().map(|s| s.tokens).sum();
        let mut ttfts: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
        ttfts.sort();
        let itl: Vec<f64> = samples
            .iter()
            .filter(|s| s.tokens > 1)
            .map(|s| (s.total - s.ttft).as_secs_f64() * 1e3 / (s.tokens - 1) as f64)
            .collect();
        let itl = itl.iter().sum::<f64>() / itl.len().max(1) as f64;
        let row = json!({
            "concurrency": concurrency,
            "seconds": wall,
            "requests": samples.len(),
            "completion_tokens": tokens,
            "tokens_per_s": tokens as f64 / wall,
            "ttft_p50_ms": percentile(&ttfts, 0.5),
            "ttft_p99_ms": percentile(&ttfts, 0.99),
            "itl_ms": itl,
            "errors": errors,
        });
        println!(
            "{:>11} {:>8} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>7}",
            concurrency,
            samples.len(),
            tokens,
            tokens as f64 / wall,
            percentile(&ttfts, 0.5),
            percentile(&ttfts, 0.99),
            itl,
            errors
        );
        if let Some(engine) = &engine {
            // As many requests as the level sent (a level of --duration has no count of its own).
            let sent = samples.len() + errors;
            let local = in_process(engine, concurrency, sent, args.max_tokens).await?;
            println!(
                "{:>11} in-process {local:.1} tokens/s; served/in-process {:.2}",
                "",
                tokens as f64 / wall / local
            );
        }
        rows.push(row);
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let base = first["tokens_per_s"].as_f64().unwrap_or(0.0);
        if base > 0.0 && rows.len() > 1 {
            println!(
                "tokens/s at concurrency {} over concurrency {}: {:.2}x",
                last["concurrency"],
                first["concurrency"],
                last["tokens_per_s"].as_f64().unwrap_or(0.0) / base
            );
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&Value::Array(rows))?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
