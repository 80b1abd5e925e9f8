//! The manager's typed views in the gRPC service's messages: a model's statistics
//! (`ModelStatistics`) and its configuration in Triton's terms (`ModelConfig`), each built once
//! by [`crate::kserve::metadata`] and rendered here as HTTP renders them as JSON.

use sheaf_core::ModelStatistics;

use super::pb;
use crate::kserve::metadata::{self, TritonConfig};

fn duration(c: sheaf_core::stats::CounterSnapshot) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: c.count,
        ns: c.ns,
    })
}

pub(super) fn statistics(m: &ModelStatistics) -> pb::ModelStatistics {
    let (name, version, s, info) = (&m.handle.name, &m.handle.version, &m.stats, m.info.as_ref());
    pb::ModelStatistics {
        memory_usage: info
            .map(|i| i.memory_usage())
            .unwrap_or_default()
            .into_iter()
            .map(|(kind, id, byte_size)| pb::MemoryUsage {
                r#type: kind.to_string(),
                id,
                byte_size,
            })
            .collect(),
        load_count: info.map_or(0, |i| i.loads),
        eviction_count: info.map_or(0, |i| i.evictions),
        memory_source: info
            .map_or("unknown", |i| i.memory_source.name())
            .to_string(),
        name: name.to_string(),
        version: version.to_string(),
        last_inference: s.last_inference_ms,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: duration(s.success),
            fail: duration(s.fail),
            queue: duration(s.queue),
            compute_input: duration(s.compute_input),
            compute_infer: duration(s.compute_infer),
            compute_output: duration(s.compute_output),
            cache_hit: duration(s.cache_hit),
            cache_miss: duration(s.cache_miss),
            receive: duration(s.receive),
            batch_wait: duration(s.batch_wait),
            reply: duration(s.reply),
            send: duration(s.send),
            request: duration(s.request),
        }),
        batch_stats: s
            .batches
            .iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size as u64,
                compute_input: duration(b.compute_input),
                compute_infer: duration(b.compute_infer),
                compute_output: duration(b.compute_output),
            })
            .collect(),
    }
}

impl From<TritonConfig> for pb::ModelConfig {
    fn from(c: TritonConfig) -> pb::ModelConfig {
        let data_type =
            |t: &str| pb::DataType::from_str_name(t).unwrap_or(pb::DataType::TypeInvalid) as i32;
        pb::ModelConfig {
            name: c.name.clone(),
            platform: c.platform.to_string(),
            backend: c.backend.to_string(),
            max_batch_size: c.max_batch_size as i32,
            input: c
                .inputs
                .iter()
                .map(|t| pb::ModelInput {
                    name: t.name.clone(),
                    data_type: data_type(&t.data_type),
                    dims: t.dims.clone(),
                    allow_ragged_batch: t.allow_ragged_batch,
                    optional: t.optional,
                })
                .collect(),
            output: c
                .outputs
                .iter()
                .map(|t| pb::ModelOutput {
                    name: t.name.clone(),
                    data_type: data_type(&t.data_type),
                    dims: t.dims.clone(),
                })
                .collect(),
            instance_group: c
                .instance_groups
                .iter()
                .map(|g| pb::ModelInstanceGroup {
                    name: c.name.clone(),
                    count: g.count as i32,
                    gpus: g.gpus.clone(),
                    kind: match g.gpus.is_empty() {
                        true => pb::model_instance_group::Kind::Cpu,
                        false => pb::model_instance_group::Kind::Gpu,
                    } as i32,
                })
                .collect(),
            default_model_filename: c.default_model_filename,
            parameters: c
                .parameters
                .into_iter()
                .map(|(k, v)| (k, pb::ModelParameter { string_value: v }))
                .collect(),
            model_transaction_policy: Some(pb::ModelTransactionPolicy {
                decoupled: c.decoupled,
            }),
            batch_input: c
                .batch_inputs
                .iter()
                .map(|b| pb::BatchInput {
                    kind: pb::batch_input::Kind::from_str_name(b.kind.name()).unwrap_or_default()
                        as i32,
                    target_name: b.target_name.clone(),
                    data_type: data_type(&b.type_name()),
                    source_input: b.source_input.clone(),
                })
                .collect(),
            batch_output: c
                .batch_outputs
                .iter()
                .map(|b| pb::BatchOutput {
                    target_name: b.target_name.clone(),
                    kind: pb::batch_output::Kind::BatchScatterWithInputShape as i32,
                    source_input: b.source_input.clone(),
                })
                .collect(),
            scheduling_choice: match (&c.ensemble, &c.sequence) {
                (Some(steps), _) => Some(pb::model_config::SchedulingChoice::EnsembleScheduling(
                    pb::ModelEnsembling {
                        step: steps
                            .iter()
                            .map(|s| pb::model_ensembling::Step {
                                model_name: s.model_name.clone(),
                                model_version: s.model_version,
                                input_map: s.input_map.clone().into_iter().collect(),
                                output_map: s.output_map.clone().into_iter().collect(),
                                model_namespace: String::new(),
                            })
                            .collect(),
                    },
                )),
                (None, Some(view)) => Some(pb::model_config::SchedulingChoice::SequenceBatching(
                    sequence_batching(view, data_type),
                )),
                (None, None) => (c.max_batch_size > 0).then(|| {
                    pb::model_config::SchedulingChoice::DynamicBatching(pb::ModelDynamicBatching {
                        preferred_batch_size: c
                            .preferred_batch_sizes
                            .iter()
                            .map(|&s| s as i32)
                            .collect(),
                        max_queue_delay_microseconds: c.max_queue_delay_us,
                        ..Default::default()
                    })
                }),
            },
        }
    }
}

/// `sequence_batching` as Triton's ModelConfig message carries it.
fn sequence_batching(
    view: &metadata::SequenceView,
    data_type: impl Fn(&str) -> i32,
) -> pb::ModelSequenceBatching {
    use pb::model_sequence_batching::{self as seq, control::Kind};
    use sheaf_core::sequence::{ControlKind, SequenceStrategy};
    let c = &view.config;
    pb::ModelSequenceBatching {
        max_sequence_idle_microseconds: c.max_sequence_idle_us,
        control_input: c
            .control_inputs
            .iter()
            .zip(&view.control_types)
            .map(|(ci, t)| seq::ControlInput {
                name: ci.name.clone(),
                control: vec![seq::Control {
                    kind: match ci.kind {
                        ControlKind::Start => Kind::ControlSequenceStart,
                        ControlKind::End => Kind::ControlSequenceEnd,
                        ControlKind::Ready => Kind::ControlSequenceReady,
                        ControlKind::Corrid => Kind::ControlSequenceCorrid,
                    } as i32,
                    fp32_false_true: match ci.kind {
                        ControlKind::Corrid => Vec::new(),
                        _ => ci.false_true.iter().map(|&v| v as f32).collect(),
                    },
                    data_type: data_type(t),
                    ..Default::default()
                }],
            })
            .collect(),
        state: c
            .states
            .iter()
            .zip(view.state_types.iter().zip(&view.state_dims))
            .zip(&view.initial_dims)
            .map(|((s, (t, dims)), first)| seq::State {
                input_name: s.input.clone(),
                output_name: s.output.clone(),
                data_type: data_type(t),
                dims: dims.clone(),
                initial_state: vec![seq::InitialState {
                    data_type: data_type(t),
                    dims: first.clone(),
                    name: String::new(),
                    state_data: Some(match &s.initial_data_file {
                        Some(file) => seq::initial_state::StateData::DataFile(file.clone()),
                        None => seq::initial_state::StateData::ZeroData(s.initial == 0.0),
                    }),
                }],
            })
            .collect(),
        strategy_choice: Some(match c.strategy {
            SequenceStrategy::Direct => seq::StrategyChoice::Direct(seq::StrategyDirect {
                max_queue_delay_microseconds: c.max_queue_delay_us,
                minimum_slot_utilization: 0.0,
            }),
            SequenceStrategy::Oldest => seq::StrategyChoice::Oldest(seq::StrategyOldest {
                max_candidate_sequences: c.max_candidate_sequences as i32,
                ..Default::default()
            }),
        }),
    }
}
