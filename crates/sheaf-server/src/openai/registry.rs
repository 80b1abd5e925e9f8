//! The generation models of a repository: every model folder that holds a `.gguf` file, with an
//! optional `config.yaml` of engine sizes (`n_ctx`, `max_seqs`, `max_batch_tokens`,
//! `max_waiting`, `prefix_slots`, `threads`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use sheaf_core::metrics::{GenLabels, GenerationMetrics, SequenceLabels, TokenLabels};
use sheaf_llama::{Engine, EngineConfig};
use std::sync::atomic::Ordering;

/// Loaded generation models, by name.
#[derive(Default)]
pub struct Generators {
    engines: BTreeMap<String, Arc<Engine>>,
}

impl Generators {
    /// Loads every `DIR/<name>/*.gguf` (or `DIR/<name>/<version>/*.gguf`, the highest version).
    /// A model that fails to load is logged and left out; the others serve.
    pub async fn load_dir(dir: &Path, config: EngineConfig) -> Generators {
        let mut engines = BTreeMap::new();
        for (name, path) in find(dir) {
            let file = dir.join(&name).join(sheaf_core::repository::CONFIG_FILE);
            let config = match std::fs::read_to_string(&file) {
                Ok(text) => match serde_yaml::from_str::<EngineConfig>(&text) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(model = %name, reason = %format!("{}: {e}", file.display()), "generation model failed to load");
                        continue;
                    }
                },
                Err(_) => config.clone(),
            };
            let started = std::time::Instant::now();
            let loaded = tokio::task::spawn_blocking(move || {
                Engine::start(&path, config).map(|e| (e, path))
            })
            .await;
            match loaded {
                Ok(Ok((engine, path))) => {
                    tracing::info!(
                        model = %name,
                        path = %path.display(),
                        context_length = engine.info.context_length,
                        memory_bytes = engine.info.size_bytes,
                        load_ms = started.elapsed().as_millis() as u64,
                        "generation model loaded"
                    );
                    engines.insert(name, engine);
                }
                Ok(Err(e)) => {
                    tracing::error!(model = %name, reason = %e, "generation model failed to load")
                }
                Err(e) => {
                    tracing::error!(model = %name, reason = %e, "generation model failed to load")
                }
            }
        }
        Generators { engines }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Engine>> {
        self.engines.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.engines.keys()
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// Copies the engines' live counters into the metrics, before `/metrics` is encoded.
    pub fn sample_metrics(&self, m: &GenerationMetrics) {
        let raise = |c: &prometheus_client::metrics::counter::Counter, to: u64| {
            let now = c.get();
            if to > now {
                c.inc_by(to - now);
            }
        };
        for (name, engine) in &self.engines {
            let s = &engine.stats;
            let model = GenLabels {
                model: name.clone(),
            };
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            for (kind, n) in [
                ("prompt", load(&s.prompt_tokens)),
                ("completion", load(&s.generated_tokens)),
            ] {
                raise(
                    &m.tokens.get_or_create(&TokenLabels {
                        model: name.clone(),
                        kind,
                    }),
                    n,
                );
            }
            for (state, n) in [
                ("running", s.running.load(Ordering::Relaxed)),
                ("waiting", s.waiting.load(Ordering::Relaxed)),
            ] {
                m.sequences
                    .get_or_create(&SequenceLabels {
                        model: name.clone(),
                        state,
                    })
                    .set(n as i64);
            }
            m.kv_cache_used
                .get_or_create(&model)
                .set(s.kv_used.load(Ordering::Relaxed) as i64);
            m.kv_cache_capacity
                .get_or_create(&model)
                .set(s.kv_capacity.load(Ordering::Relaxed) as i64);
            raise(
                &m.prefix_lookups.get_or_create(&model),
                load(&s.prefix_lookups),
            );
            raise(&m.prefix_hits.get_or_create(&model), load(&s.prefix_hits));
            raise(&m.preemptions.get_or_create(&model), load(&s.preemptions));
            raise(&m.decode_steps.get_or_create(&model), load(&s.steps));
        }
    }

    /// The `generation` section of `/stats`.
    pub fn stats(&self) -> Value {
        let mut models = serde_json::Map::new();
        for (name, engine) in &self.engines {
            let s = &engine.stats;
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            let generated = load(&s.generated_tokens);
            let decode_s = load(&s.decode_ns) as f64 / 1e9;
            let lookups = load(&s.prefix_lookups);
            models.insert(
                name.clone(),
                json!({
                    "running_sequences": s.running.load(Ordering::Relaxed),
                    "waiting_sequences": s.waiting.load(Ordering::Relaxed),
                    "kv_cache_used_cells": s.kv_used.load(Ordering::Relaxed),
                    "kv_cache_cells": s.kv_capacity.load(Ordering::Relaxed),
                    "prompt_tokens": load(&s.prompt_tokens),
                    "generated_tokens": generated,
                    "decode_steps": load(&s.steps),
                    "tokens_per_second_while_decoding": if decode_s > 0.0 { generated as f64 / decode_s } else { 0.0 },
                    "prefix_cache_hit_rate": if lookups > 0 { load(&s.prefix_hits) as f64 / lookups as f64 } else { 0.0 },
                    "prefix_tokens_reused": load(&s.prefix_tokens_reused),
                    "preemptions": load(&s.preemptions),
                    "context_length": engine.info.context_length,
                }),
            );
        }
        Value::Object(models)
    }
}

/// `(name, gguf file)` of each model folder under `dir` that holds one.
fn find(dir: &Path) -> Vec<(String, PathBuf)> {
    let folders = sheaf_core::repository::model_folders(dir).unwrap_or_default();
    let mut found: Vec<(String, PathBuf)> = folders
        .into_iter()
        .filter_map(|(name, folder)| Some((name, sheaf_core::repository::find_gguf(&folder)?)))
        .collect();
    found.sort();
    found
}
