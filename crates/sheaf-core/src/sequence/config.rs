//! The `sequence_batching` section of a model's configuration: how a stateful model's
//! sequences are scheduled, which control inputs it takes, and which state it carries.
//!
//! In `config.yaml`:
//!
//! ```yaml
//! sequence_batching:
//!   strategy: oldest            # or direct (the default)
//!   max_sequence_idle_us: 5000000
//!   control_inputs:
//!     - {name: START, kind: start}
//!     - {name: READY, kind: ready}
//!   states:
//!     - {input: state_in, output: state_out, dims: [16]}
//!     # A state whose length changes from request to request, starting from a file's values:
//!     - {input: history_in, output: history_out, dims: [-1], initial_dims: [3],
//!        initial_data_file: history.bin}
//! ```
//!
//! A state starts from `initial` (every element; 0 by default), or from the elements in
//! `initial_data_file`, a file in the model folder's `initial_state/` directory (raw,
//! row-major, little-endian; BYTES: each a 4-byte length, then the bytes), as Triton's
//! `initial_state { zero_data | data_file }`. A state's `dims` may hold variable dimensions
//! (-1): each request's state then has the shape the model gave it on the request before, the
//! first request's `initial_dims` (or `dims` with each variable dimension as 1, as Triton
//! starts one), and requests share a batch when their states' shapes agree.
//!
//! Triton's `config.pbtxt` form (`sequence_batching { direct {} control_input [...] state [...] }`)
//! is read into the same structure by [`crate::pbtxt`].

use serde::Deserialize;

/// A stateful model's sequences.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequenceConfig {
    /// How requests of different sequences share batches.
    pub strategy: SequenceStrategy,
    /// A sequence that sends nothing for this long, in microseconds, is ended: its slot and its
    /// state are freed, and its next request is refused.
    pub max_sequence_idle_us: u64,
    /// `direct`: how long, in microseconds, a batch waits for the instance's other sequences
    /// to send their next request once one has. (`oldest` uses the model's own batching
    /// settings: `max_queue_delay_us`, `preferred_batch_sizes`.)
    pub max_queue_delay_us: u64,
    /// `oldest`: most sequences open at once on each instance. (`direct` holds
    /// `max_batch_size` per instance: one batch row each.)
    pub max_candidate_sequences: usize,
    /// Inputs the server fills for each request from its sequence flags.
    pub control_inputs: Vec<ControlInput>,
    /// Implicit state: outputs that come back as inputs on the sequence's next request.
    pub states: Vec<StateConfig>,
}

impl Default for SequenceConfig {
    fn default() -> Self {
        SequenceConfig {
            strategy: SequenceStrategy::Direct,
            max_sequence_idle_us: 1_000_000,
            max_queue_delay_us: 0,
            max_candidate_sequences: 1024,
            control_inputs: Vec::new(),
            states: Vec::new(),
        }
    }
}

/// Triton's two sequence strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SequenceStrategy {
    /// Each sequence holds one row (a slot) of one instance's batches for its whole life; a
    /// batch carries every slot that has a request ready, in slot order, and rows whose
    /// sequence has nothing ready are fillers with READY false.
    Direct,
    /// Each sequence is kept on one instance, and the instance's dynamic batcher batches the
    /// oldest ready requests of its sequences, one per sequence at a time.
    Oldest,
}

/// One control input: a tensor the server fills per request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlInput {
    pub name: String,
    pub kind: ControlKind,
    /// The values meaning false and true, in the input's data type (START, END, READY).
    #[serde(default = "false_true")]
    pub false_true: [f64; 2],
}

fn false_true() -> [f64; 2] {
    [0.0, 1.0]
}

/// What a control input says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlKind {
    /// The request opens its sequence.
    Start,
    /// The request closes its sequence.
    End,
    /// The row holds a request (a `direct` filler row has it false).
    Ready,
    /// The sequence's correlation id (an integer type, or BYTES for string ids).
    Corrid,
}

/// One implicit state.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// The model input that takes the state.
    pub input: String,
    /// The model output that gives the next state.
    pub output: String,
    /// The state's shape per item, without the batch dimension; -1: a dimension that may
    /// change from request to request. Empty: the input's own shape.
    #[serde(default)]
    pub dims: Vec<i64>,
    /// The value every element starts from when a sequence starts.
    #[serde(default)]
    pub initial: f64,
    /// The initial state's shape per item, where `dims` has variable dimensions (Triton's
    /// `initial_state.dims`). Empty: `dims`, each variable dimension as 1.
    #[serde(default)]
    pub initial_dims: Vec<i64>,
    /// A file in the model folder's `initial_state/` directory that holds the initial state's
    /// elements (Triton's `initial_state.data_file`), in place of `initial`.
    #[serde(default)]
    pub initial_data_file: Option<String>,
}

impl StateConfig {
    /// A state named by its input and output, its shape the input's, starting from zeros.
    pub fn new(input: &str, output: &str) -> StateConfig {
        StateConfig {
            input: input.into(),
            output: output.into(),
            dims: Vec::new(),
            initial: 0.0,
            initial_dims: Vec::new(),
            initial_data_file: None,
        }
    }
}

/// Most sequences one instance may hold open at once (`max_candidate_sequences`).
pub const MAX_CANDIDATE_SEQUENCES: usize = 65_536;

impl SequenceConfig {
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.max_sequence_idle_us == 0 {
            return Err("sequence_batching.max_sequence_idle_us must be positive".into());
        }
        if self.max_candidate_sequences == 0 {
            return Err("sequence_batching.max_candidate_sequences must be positive".into());
        }
        if self.max_candidate_sequences > MAX_CANDIDATE_SEQUENCES {
            return Err(format!(
                "sequence_batching.max_candidate_sequences is {}; at most \
                 {MAX_CANDIDATE_SEQUENCES} is allowed (each instance keeps a slot for each)",
                self.max_candidate_sequences
            ));
        }
        for s in &self.states {
            let at = format!("sequence_batching.states: state '{}'", s.input);
            if s.dims.iter().any(|&d| d < -1) || s.initial_dims.iter().any(|&d| d < 0) {
                return Err(format!(
                    "{at} has dims {:?} and initial_dims {:?}; a dimension is a size, or -1 \
                     (variable) in dims",
                    s.dims, s.initial_dims
                ));
            }
            if let Some(file) = &s.initial_data_file {
                let inside = !file.is_empty()
                    && std::path::Path::new(file)
                        .components()
                        .all(|c| matches!(c, std::path::Component::Normal(_)));
                if !inside {
                    return Err(format!(
                        "{at}: initial_data_file '{file}' must name a file inside the model \
                         folder's initial_state/ directory"
                    ));
                }
            }
        }
        let mut kinds: Vec<_> = self.control_inputs.iter().map(|c| c.kind).collect();
        kinds.sort_by_key(|k| *k as u8);
        if kinds.windows(2).any(|w| w[0] == w[1]) {
            return Err("sequence_batching.control_inputs: a kind is named twice".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelConfig;

    #[test]
    fn the_yaml_form_reads_with_defaults_and_checks() {
        let c = ModelConfig::from_yaml(
            "sequence_batching:\n  strategy: oldest\n  control_inputs:\n    - {name: S, kind: start}\n    - {name: C, kind: corrid}\n  states:\n    - {input: h_in, output: h_out, dims: [4], initial: 0.5}\n",
        )
        .unwrap();
        let s = c.sequence_batching.unwrap();
        assert_eq!(s.strategy, SequenceStrategy::Oldest);
        assert_eq!(
            s.max_sequence_idle_us, 1_000_000,
            "the default idle timeout"
        );
        assert_eq!(s.control_inputs[0].false_true, [0.0, 1.0]);
        assert_eq!(s.control_inputs[1].kind, ControlKind::Corrid);
        assert_eq!(
            (s.states[0].dims.clone(), s.states[0].initial),
            (vec![4], 0.5)
        );
        assert!(s.check().is_ok());

        let no_idle = SequenceConfig {
            max_sequence_idle_us: 0,
            ..SequenceConfig::default()
        };
        assert!(no_idle
            .check()
            .unwrap_err()
            .contains("max_sequence_idle_us"));
        let twice = SequenceConfig {
            control_inputs: vec![
                ControlInput {
                    name: "A".into(),
                    kind: ControlKind::Start,
                    false_true: [0.0, 1.0],
                },
                ControlInput {
                    name: "B".into(),
                    kind: ControlKind::Start,
                    false_true: [0.0, 1.0],
                },
            ],
            ..SequenceConfig::default()
        };
        assert!(twice.check().unwrap_err().contains("named twice"));
        let crowded = SequenceConfig {
            max_candidate_sequences: 1_000_000_000,
            ..SequenceConfig::default()
        };
        assert!(crowded
            .check()
            .unwrap_err()
            .contains("max_candidate_sequences is 1000000000; at most 65536"));
        let state = |dims: Vec<i64>, initial_dims: Vec<i64>, file: Option<&str>| StateConfig {
            dims,
            initial_dims,
            initial_data_file: file.map(str::to_string),
            ..StateConfig::new("h", "h2")
        };
        let with = |strategy, s| SequenceConfig {
            strategy,
            states: vec![s],
            ..SequenceConfig::default()
        };
        for strategy in [SequenceStrategy::Direct, SequenceStrategy::Oldest] {
            let open = with(strategy, state(vec![-1, 4], vec![2, 4], None));
            assert!(open.check().is_ok());
        }
        for bad in [
            state(vec![-2], vec![], None),
            state(vec![-1], vec![-3], None),
        ] {
            let e = with(SequenceStrategy::Oldest, bad).check().unwrap_err();
            assert!(e.contains("a dimension is a size, or -1"), "{e}");
        }
        for file in ["../secret", "/etc/passwd", ""] {
            let e = with(SequenceStrategy::Oldest, state(vec![4], vec![], Some(file)))
                .check()
                .unwrap_err();
            assert!(
                e.contains("inside the model folder's initial_state/"),
                "{e}"
            );
        }
        let c = ModelConfig::from_yaml(
            "sequence_batching:\n  strategy: oldest\n  states:\n    - {input: a, output: b, dims: [-1], initial_dims: [3], initial_data_file: a.bin}\n",
        )
        .unwrap();
        assert_eq!(
            c.sequence_batching.unwrap().states,
            [StateConfig {
                dims: vec![-1],
                initial_dims: vec![3],
                initial_data_file: Some("a.bin".into()),
                ..StateConfig::new("a", "b")
            }]
        );
        for bad in [
            "sequence_batching:\n  strategy: newest\n",
            "sequence_batching:\n  control_inputs: [{name: S, kind: begin}]\n",
            "sequence_batching:\n  idle: 5\n",
        ] {
            assert!(ModelConfig::from_yaml(bad).is_err(), "{bad}");
        }
    }
}
