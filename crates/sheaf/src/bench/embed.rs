//! `sheaf bench --embed`: load for an embeddings server (sheaf's or any OpenAI-compatible
//! `POST /v1/embeddings`). At each `--concurrency` level, that many clients send one sentence per
//! request, back to back, from a fixed set of 64 sentences of 3 to 80 words. It reports
//! sentences per second and p50/p99 latency.
//!
//! With `--in-process DIR` (a model folder: `model.onnx`, `tokenizer.json`, `config.yaml` with an
//! `embedding` section), the same sentences first run in the bench process at each of
//! `--batch-sizes`: tokenised, padded to the longest of each batch, run on ONNX Runtime, pooled
//! and normalised, as a hand-written loop would. The best batch is the reference, and each level
//! reports served/in-process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::json;
use sheaf_backend::{DataType, Model, Pooled, Tensor};
use sheaf_core::embed::{Cut, EmbedInput, TextEncoder, TruncationSide};
use sheaf_core::ModelConfig;

use super::report::percentile;
use super::BenchArgs;

const WORDS: &str = "the river carries light across a valley where old stones remember rain and \
    every morning a quiet bell counts the hours for travellers who never stop to listen while \
    markets open slowly and children run toward the harbour with bread still warm from the oven";

/// 64 sentences of 3 to 80 words, in a mixed order of lengths.
fn sentences() -> Vec<String> {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    (0..64)
        .map(|i| {
            let n = 3 + (i * 29) % 78;
            (0..n)
                .map(|k| words[(i * 7 + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let texts = Arc::new(sentences());
    let best = match &args.in_process {
        Some(dir) => {
            let (dir, texts, sizes, threads, secs) = (
                dir.clone(),
                texts.clone(),
                args.batch_sizes.clone(),
                args.intra_op_threads.unwrap_or(1),
                args.seconds(),
            );
            Some(
                tokio::task::spawn_blocking(move || {
                    in_process_best(&dir, &texts, &sizes, threads, secs)
                })
                .await??,
            )
        }
        None => None,
    };
    let client = crate::client::http_client(args.api_key.as_deref(), &args.headers)?;
    let url = format!("{}/v1/embeddings", args.url);
    println!(
        "sheaf bench --embed: model {} at {url}, one sentence per request",
        args.model
    );
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>8}",
        "concurrency", "sentences/s", "p50 ms", "p99 ms", "errors"
    );
    // Request numbers run on across levels, so that no level repeats another's new sentences.
    let sent = Arc::new(AtomicUsize::new(0));
    for &c in &args.concurrency {
        let (count, mut latencies, errors, took) = closed(
            &client,
            &url,
            &args.model,
            &texts,
            c,
            args.seconds(),
            (args.repeat_rate, &sent),
        )
        .await;
        latencies.sort_by(f64::total_cmp);
        let per_s = count as f64 / took.as_secs_f64();
        println!(
            "{c:>12} {per_s:>12.1} {:>10.2} {:>10.2} {errors:>8}",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99)
        );
        if let Some((batch, reference)) = best {
            println!(
                "{:>12} served/in-process: {:.2} (in-process best {reference:.1} sentences/s at batch {batch})",
                "",
                per_s / reference
            );
        }
    }
    Ok(())
}

/// The text of request `n`: one of `texts` for a `repeat` share of requests (spread evenly
/// over every 100), else that text made unique by the request's number.
fn text_of(texts: &[String], n: usize, repeat: f64) -> String {
    let text = &texts[n % texts.len()];
    if ((n * 37) % 100) < (repeat * 100.0).round() as usize {
        text.clone()
    } else {
        format!("{text} {n}")
    }
}

/// `clients` clients posting one sentence each, back to back, for `secs`: (answers, latencies
/// in ms, errors, elapsed). A `repeat` share of the sentences repeat (see [`text_of`]); `next`
/// numbers the requests.
async fn closed(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    texts: &Arc<Vec<String>>,
    clients: usize,
    secs: f64,
    (repeat, next): (f64, &Arc<AtomicUsize>),
) -> (usize, Vec<f64>, usize, Duration) {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, model, texts, next) = (
                client.clone(),
                url.to_string(),
                model.to_string(),
                texts.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                let (mut latencies, mut errors) = (Vec::new(), 0);
                while Instant::now() < until {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let text = text_of(&texts, n, repeat);
                    let body = json!({"model": model, "input": text, "encoding_format": "float"});
                    let sent = Instant::now();
                    let ok = match client.post(&url).json(&body).send().await {
                        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                        _ => false,
                    };
                    if ok {
                        latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                    } else {
                        errors += 1;
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for w in workers {
        if let Ok((l, e)) = w.await {
            latencies.extend(l);
            errors += e;
        }
    }
    (latencies.len(), latencies, errors, started.elapsed())
}

/// The model file of a model folder: `DIR/model.onnx`, or the highest `DIR/<version>/model.onnx`.
fn model_file(dir: &Path) -> anyhow::Result<PathBuf> {
    let direct = dir.join("model.onnx");
    if direct.is_file() {
        return Ok(direct);
    }
    let mut versions: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let file = e.path().join("model.onnx");
            file.is_file().then_some((v, file))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|v| v.1)
        .with_context(|| format!("no model.onnx in {}", dir.display()))
}

/// Sentences/s of a hand-written loop at each batch size; returns (best batch, sentences/s).
fn in_process_best(
    dir: &Path,
    texts: &[String],
    batch_sizes: &[usize],
    threads: usize,
    secs: f64,
) -> anyhow::Result<(usize, f64)> {
    let path = model_file(dir)?;
    let config = std::fs::read_to_string(dir.join("config.yaml")).unwrap_or_default();
    let config = ModelConfig::from_yaml(&config).map_err(anyhow::Error::msg)?;
    let Some(embedding) = config.embedding else {
        bail!("{}/config.yaml has no `embedding` section", dir.display());
    };
    let library = sheaf_onnx::library::locate(None)?;
    sheaf_onnx::init(&library)?;
    let options = sheaf_onnx::OnnxOptions {
        intra_op_threads: threads,
        ..Default::default()
    };
    let onnx = sheaf_onnx::OnnxModel::load(&path, &options)?;
    let mut model = Pooled::new(Box::new(onnx), embedding.pool_spec())?;
    let encoder =
        TextEncoder::load(&path, &embedding, model.signature()).map_err(anyhow::Error::msg)?;
    println!(
        "in-process: {} on ONNX Runtime (CPU), {threads} intra-op thread(s): tokenise, pad to the \
         batch's longest, run, pool, normalise",
        path.display()
    );
    println!("{:>11} {:>14}", "batch size", "sentences/s");
    let duration = Duration::from_secs_f64(secs);
    let mut best = (0, 0.0);
    for &b in batch_sizes {
        let mut run = |start: usize| -> anyhow::Result<()> {
            let batch: Vec<String> = (0..b)
                .map(|k| texts[start.wrapping_add(k) % texts.len()].clone())
                .collect();
            let ids = encoder.tokenize(
                &EmbedInput::Texts(batch),
                Some(Cut {
                    side: TruncationSide::Right,
                    tokens: encoder.max_input_tokens(),
                }),
                encoder.prompt(None)?,
            )?;
            let inputs = padded(&ids, model.signature())?;
            let out = model.infer(&inputs)?;
            let mut vectors: Vec<f32> = out[0]
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let width = out[0].shape()[1].max(1);
            vectors.chunks_mut(width).for_each(sheaf_backend::normalize);
            Ok(())
        };
        run(0)?;
        let started = Instant::now();
        let mut done = 0usize;
        while started.elapsed() < duration {
            run(done)?;
            done += b;
        }
        let per_s = done as f64 / started.elapsed().as_secs_f64();
        println!("{b:>11} {per_s:>14.1}");
        if per_s > best.1 {
            best = (b, per_s);
        }
    }
    println!(
        "in-process best: {:.1} sentences/s at batch size {}\n",
        best.1, best.0
    );
    Ok(best)
}

/// The encoder's inputs for `ids`, padded with 0 to the longest: token ids, a mask of 1 over
/// the real tokens, and segment ids of 0.
fn padded(ids: &[Vec<u32>], signature: &sheaf_backend::Signature) -> anyhow::Result<Vec<Tensor>> {
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    signature
        .inputs
        .iter()
        .map(|spec| {
            let value = |row: &[u32], t: usize| -> i64 {
                match spec.name.as_str() {
                    "input_ids" => row.get(t).map_or(0, |&v| i64::from(v)),
                    "token_type_ids" => 0,
                    _ => i64::from(t < row.len()),
                }
            };
            let values = ids
                .iter()
                .flat_map(|row| (0..longest).map(move |t| value(row, t)));
            let data: Vec<u8> = match spec.dtype {
                DataType::I32 => values.flat_map(|v| (v as i32).to_le_bytes()).collect(),
                _ => values.flat_map(|v| v.to_le_bytes()).collect(),
            };
            Ok(Tensor::new(
                spec.dtype,
                vec![ids.len(), longest],
                Bytes::from(data),
            )?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repeat_rate_is_the_share_of_repeated_sentences() {
        let texts = sentences();
        for rate in [0.0, 0.5, 1.0] {
            let repeated = (0..1000)
                .filter(|&n| texts.contains(&text_of(&texts, n, rate)))
                .count();
            assert_eq!(repeated, (rate * 1000.0) as usize, "rate {rate}");
        }
        assert_eq!(text_of(&texts, 3, 1.0), texts[3]);
        assert_ne!(text_of(&texts, 3, 0.0), text_of(&texts, 67, 0.0));
    }
}
