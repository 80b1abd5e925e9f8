//! What the generation models report: their live counters copied into the Prometheus metrics,
//! and the `generation` section of `/stats`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};
use sheaf_core::metrics::{GenLabels, GenerationMetrics, SequenceLabels, TokenLabels};

use super::registry::Generators;

impl Generators {
    /// Copies the engines' live counters into the metrics, before `/metrics` is encoded.
    pub fn sample_metrics(&self, m: &GenerationMetrics) {
        let raise = |c: &prometheus_client::metrics::counter::Counter, to: u64| {
            let now = c.get();
            if to > now {
                c.inc_by(to - now);
            }
        };
        for (name, engine) in self.ready() {
            let s = &engine.stats;
            let model = GenLabels {
                model: name.clone(),
            };
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
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
        for (name, engine) in self.ready() {
            let s = &engine.stats;
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
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
