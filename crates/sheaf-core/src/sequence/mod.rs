//! Stateful models: Triton's sequence batcher.
//!
//! A model with a `sequence_batching` section serves sequences: streams of requests that name
//! their sequence (`sequence_id`, with `sequence_start` on the first and `sequence_end` on the
//! last), where each request's answer depends on the ones before it. What sheaf does for them:
//!
//! - **One instance per sequence.** Such a model gets one lane per instance (rather than one per
//!   device), and a sequence is placed on a lane when it starts ([`table`]); all its requests run
//!   there, so a model that keeps state inside its instance (a Python model's process) sees the
//!   whole sequence.
//! - **One request at a time per sequence**, in arrival order: the next request needs the
//!   previous one's state.
//! - **Control inputs** (START, END, READY, CORRID) and **implicit state** are inputs the client
//!   does not send: the server fills them per request. A state is an output of the model that
//!   comes back as an input on the sequence's next request; it starts from its initial value and
//!   is freed with the sequence. Clients see the model without these tensors
//!   ([`Sequences::client`]).
//! - **Strategies.** `oldest`: each request goes through the lane's dynamic batcher, so the
//!   ready requests of the lane's sequences share batches. `direct`: each sequence owns a batch
//!   row, and batches carry every ready sequence at its row ([`direct`]).
//! - **Idle timeout**: a sequence quiet for `max_sequence_idle_us` is closed, its row and state
//!   freed. A request of a closed or unknown sequence, a second start, and a start when every row
//!   is taken get a clear error.
//!
//! State lives in host memory with the sequence's table entry, and travels to the instance with
//! each request. Sequence requests are never answered from the response cache.

mod config;
pub mod direct;
pub mod table;

pub use config::{ControlInput, ControlKind, SequenceConfig, SequenceStrategy, StateConfig};

use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sheaf_backend::{DataType, Signature, Tensor, TensorSpec};

use crate::batcher::{Admission, Batcher};
use crate::request::{SequenceFlags, SequenceId};
use crate::stages::Receipt;
use crate::InferError;
use direct::{Answer, Slots};
use table::{Closed, Table};

/// Where each of the model's inputs comes from.
#[derive(Debug, Clone)]
enum Feed {
    /// The client's input at this index of [`Sequences::client`].
    Client(usize),
    Control {
        kind: ControlKind,
        dtype: DataType,
        /// Per request: the input's shape with dynamic dimensions as 1.
        shape: Vec<usize>,
        false_true: [f64; 2],
    },
    /// The sequence's state at this index.
    State(usize),
}

/// One implicit state, resolved against the model's signature.
#[derive(Debug, Clone)]
struct State {
    input: String,
    /// Index of the model output that gives the next state.
    output: usize,
    dtype: DataType,
    /// Its shape per item; -1: a dimension that may change from request to request.
    dims: Vec<i64>,
    initial: Tensor,
}

/// The sequences of one stateful model.
pub struct Sequences {
    name: String,
    strategy: SequenceStrategy,
    /// The model as clients see it: without control inputs, state inputs and state outputs.
    pub client: Signature,
    /// The model's own signature, those included.
    pub model: Signature,
    feeds: Vec<Feed>,
    /// Per client output, the model output's index.
    outputs: Vec<usize>,
    states: Vec<State>,
    table: Arc<Table>,
    /// The model's lanes (one instance each), under `oldest`.
    lanes: Vec<Batcher>,
    /// Per lane, under `direct`.
    slots: Vec<Slots>,
}

impl Sequences {
    /// Resolves `config` against the model's `signature`, reads each state's initial value (a
    /// `initial_data_file` from the `initial_state/` directory of the model's `folder`), and
    /// starts the idle sweep (and, under `direct`, each lane's slots). `lanes` are the model's
    /// instances, one each.
    pub fn start(
        model: &str,
        config: &SequenceConfig,
        (signature, folder): (&Signature, &Path),
        max_batch_size: usize,
        lanes: &[Batcher],
    ) -> Result<Arc<Sequences>, String> {
        let batching = max_batch_size > 0;
        let item = |spec: &TensorSpec| -> Vec<i64> {
            spec.shape
                .iter()
                .skip(usize::from(batching))
                .copied()
                .collect()
        };
        let find = |name: &str, what: &str| {
            signature
                .inputs
                .iter()
                .position(|s| s.name == name)
                .ok_or_else(|| {
                    format!(
                        "sequence_batching: {what} '{name}' is not an input of the model (its \
                         inputs are {:?})",
                        signature.inputs.iter().map(|s| &s.name).collect::<Vec<_>>()
                    )
                })
        };
        let mut feeds: Vec<Option<Feed>> = vec![None; signature.inputs.len()];
        for c in &config.control_inputs {
            let i = find(&c.name, "control input")?;
            let spec = &signature.inputs[i];
            let numeric = spec.dtype != DataType::Bytes;
            if !numeric && c.kind != ControlKind::Corrid {
                return Err(format!(
                    "sequence_batching: control input '{}' is BYTES; only CORRID may be",
                    c.name
                ));
            }
            let mut shape: Vec<usize> = item(spec).iter().map(|&d| d.max(1) as usize).collect();
            if batching {
                shape.insert(0, 1);
            }
            feeds[i] = Some(Feed::Control {
                kind: c.kind,
                dtype: spec.dtype,
                shape,
                false_true: c.false_true,
            });
        }
        let mut states = Vec::with_capacity(config.states.len());
        let mut hidden_outputs = Vec::new();
        for (k, s) in config.states.iter().enumerate() {
            let i = find(&s.input, "state input")?;
            let spec = &signature.inputs[i];
            let output =
                signature
                    .outputs
                    .iter()
                    .position(|o| o.name == s.output)
                    .ok_or_else(|| {
                        format!(
                        "sequence_batching: state output '{}' is not an output of the model (its \
                         outputs are {:?})",
                        s.output,
                        signature.outputs.iter().map(|o| &o.name).collect::<Vec<_>>()
                    )
                    })?;
            if signature.outputs[output].dtype != spec.dtype {
                return Err(format!(
                    "sequence_batching: state '{}' is {} as an input and {} as the output '{}'",
                    s.input, spec.dtype, signature.outputs[output].dtype, s.output
                ));
            }
            let dims = if s.dims.is_empty() {
                item(spec)
            } else {
                s.dims.clone()
            };
            let own = item(spec);
            if !takes(&own, &dims) {
                return Err(format!(
                    "sequence_batching: state '{}' has dims {dims:?}, and the input takes {own:?} \
                     per item; give the state's dims as the input takes them",
                    s.input
                ));
            }
            let initial = initial_state(s, &dims, spec.dtype, batching, folder)
                .map_err(|e| format!("sequence_batching: state '{}': {e}", s.input))?;
            feeds[i] = Some(Feed::State(k));
            hidden_outputs.push(output);
            states.push(State {
                input: s.input.clone(),
                output,
                dtype: spec.dtype,
                dims,
                initial,
            });
        }
        let mut client = Signature::default();
        let feeds = feeds
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                f.unwrap_or_else(|| {
                    client.inputs.push(signature.inputs[i].clone());
                    Feed::Client(client.inputs.len() - 1)
                })
            })
            .collect();
        let mut outputs = Vec::new();
        for (i, o) in signature.outputs.iter().enumerate() {
            if !hidden_outputs.contains(&i) {
                client.outputs.push(o.clone());
                outputs.push(i);
            }
        }
        let per_lane = match config.strategy {
            SequenceStrategy::Direct => max_batch_size.max(1),
            SequenceStrategy::Oldest => config.max_candidate_sequences,
        };
        let idle = Duration::from_micros(config.max_sequence_idle_us);
        let table = Arc::new(Table::new(model, lanes.len(), per_lane, idle));
        let mut sequences = Sequences {
            name: model.to_string(),
            strategy: config.strategy,
            client,
            model: signature.clone(),
            feeds,
            outputs,
            states,
            table: table.clone(),
            lanes: Vec::new(),
            slots: Vec::new(),
        };
        if config.strategy == SequenceStrategy::Direct {
            let filler = sequences.filler();
            for (lane, batcher) in lanes.iter().enumerate() {
                let t = table.clone();
                sequences.slots.push(Slots::start(
                    batcher.clone(),
                    per_lane,
                    Duration::from_micros(config.max_queue_delay_us),
                    batching,
                    Arc::new(move || t.open_on(lane)),
                    filler.clone(),
                ));
            }
        } else {
            sequences.lanes = lanes.to_vec();
        }
        tokio::spawn(sweep(Arc::downgrade(&table), idle));
        Ok(Arc::new(sequences))
    }

    /// Sequences open now.
    pub fn open(&self) -> usize {
        self.table.len()
    }

    /// Whether sequence `id` is open.
    pub fn is_open(&self, id: &SequenceId) -> bool {
        self.table.is_open(id)
    }

    /// Runs one request of a sequence: `inputs` are the client's (in [`Sequences::client`]
    /// order, one item). Returns the client's outputs (in [`Sequences::client`] order).
    pub async fn step(
        &self,
        flags: &SequenceFlags,
        inputs: Vec<Tensor>,
        admission: Admission,
    ) -> Result<(Vec<Tensor>, Option<Receipt>), InferError> {
        let initial = || self.states.iter().map(|s| s.initial.clone()).collect();
        let seq = self.table.open(&flags.id, flags.start, initial)?;
        let mut step = seq.step.lock().await;
        if let Some(why) = step.closed {
            return Err(self.table.gone(&flags.id, Some(why)));
        }
        let inputs = self.assemble(flags, inputs, &step.state)?;
        let answer: Answer = match self.strategy {
            SequenceStrategy::Oldest => {
                let lane = self
                    .lanes
                    .get(seq.lane)
                    .ok_or_else(|| InferError::internal("a sequence on a lane that is gone"))?;
                lane.submit(inputs, 1, admission)
                    .await
                    .map(|a| (a.outputs, Some(a.receipt)))
            }
            SequenceStrategy::Direct => match self.slots.get(seq.lane) {
                Some(slots) => slots.run(seq.slot, inputs, admission).await,
                None => Err(InferError::internal("a sequence on a lane that is gone")),
            },
        };
        seq.touch();
        let answer = answer.and_then(|(outputs, receipt)| {
            step.state = self.next_state(&outputs)?;
            let client = self
                .outputs
                .iter()
                .map(|&i| outputs.get(i).cloned())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| InferError::internal("the model gave fewer outputs than it has"))?;
            Ok((client, receipt))
        });
        if flags.end {
            step.closed = Some(Closed::Ended);
            step.state.clear();
            self.table.close(&flags.id, &seq, Closed::Ended);
        }
        answer
    }

    /// The model's inputs for one request: the client's, the control inputs, the states.
    fn assemble(
        &self,
        flags: &SequenceFlags,
        mut client: Vec<Tensor>,
        state: &[Tensor],
    ) -> Result<Vec<Tensor>, InferError> {
        let mut inputs = Vec::with_capacity(self.feeds.len());
        for feed in &self.feeds {
            inputs.push(match feed {
                Feed::Client(i) => std::mem::replace(
                    client
                        .get_mut(*i)
                        .ok_or_else(|| InferError::internal("a client input is missing"))?,
                    Tensor::filled(DataType::U8, vec![0], 0.0)?,
                ),
                Feed::Control {
                    kind,
                    dtype,
                    shape,
                    false_true,
                } => {
                    let flag = |on: bool| false_true[usize::from(on)];
                    match kind {
                        ControlKind::Start => {
                            Tensor::filled(*dtype, shape.clone(), flag(flags.start))?
                        }
                        ControlKind::End => Tensor::filled(*dtype, shape.clone(), flag(flags.end))?,
                        ControlKind::Ready => Tensor::filled(*dtype, shape.clone(), flag(true))?,
                        ControlKind::Corrid => corrid(&self.name, &flags.id, *dtype, shape)?,
                    }
                }
                Feed::State(k) => state
                    .get(*k)
                    .cloned()
                    .ok_or_else(|| InferError::internal("a sequence without its state"))?,
            });
        }
        Ok(inputs)
    }

    /// The states a request's outputs carry to the sequence's next request.
    fn next_state(&self, outputs: &[Tensor]) -> Result<Vec<Tensor>, InferError> {
        self.states
            .iter()
            .map(|s| {
                let t = outputs
                    .get(s.output)
                    .ok_or_else(|| InferError::internal("the model gave no state output"))?;
                if t.dtype() != s.dtype {
                    return Err(InferError::internal(format!(
                        "the model's state output for '{}' is {}, not {}",
                        s.input,
                        t.dtype(),
                        s.dtype
                    )));
                }
                let item: Vec<i64> = t.shape()[t.shape().len().saturating_sub(s.dims.len())..]
                    .iter()
                    .map(|&d| d as i64)
                    .collect();
                if t.shape().len() != s.initial.shape().len() || !takes(&s.dims, &item) {
                    return Err(InferError::internal(format!(
                        "the model's state output for '{}' has shape {:?}, where the state's dims \
                         are {:?} per item",
                        s.input,
                        t.shape(),
                        s.dims
                    )));
                }
                Ok(t.clone())
            })
            .collect()
    }

    /// How `direct` fills a row no request holds: zeros shaped as a ready row's, with its
    /// control inputs false and its state at the initial value.
    fn filler(&self) -> direct::Filler {
        let feeds = self.feeds.clone();
        let states: Vec<Tensor> = self.states.iter().map(|s| s.initial.clone()).collect();
        Arc::new(move |i, like| {
            let value = match feeds.get(i) {
                Some(Feed::Control { false_true, .. }) => false_true[0],
                Some(Feed::State(k)) => {
                    if let Some(initial) = states.get(*k).filter(|s| s.shape() == like.shape()) {
                        return Ok(initial.clone());
                    }
                    0.0
                }
                _ => 0.0,
            };
            let value = match feeds.get(i) {
                Some(Feed::Control {
                    kind: ControlKind::Corrid,
                    ..
                }) => 0.0,
                _ => value,
            };
            Ok(Tensor::filled(like.dtype(), like.shape().to_vec(), value)?)
        })
    }
}

/// Whether a tensor whose dims (per item) are `dims` fits where `open` is expected: the same
/// rank, and every fixed dimension of `open` (not -1) the same.
fn takes(open: &[i64], dims: &[i64]) -> bool {
    open.len() == dims.len() && open.iter().zip(dims).all(|(o, d)| *o < 0 || o == d)
}

/// A state's value when its sequence starts: `initial_dims` (else `dims`, each variable
/// dimension as 1, as Triton starts one), every element `initial`, or the elements in
/// `initial_data_file` under the model folder's `initial_state/` directory.
fn initial_state(
    s: &StateConfig,
    dims: &[i64],
    dtype: DataType,
    batching: bool,
    folder: &Path,
) -> Result<Tensor, String> {
    let first: Vec<i64> = match s.initial_dims.is_empty() {
        true => dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect(),
        false => s.initial_dims.clone(),
    };
    if !takes(dims, &first) || first.iter().any(|&d| d < 0) {
        return Err(format!(
            "initial_dims {first:?} do not fit its dims {dims:?}: give a size for each dimension, \
             the fixed ones as they are"
        ));
    }
    let mut shape: Vec<usize> = first.iter().map(|&d| d as usize).collect();
    if batching {
        shape.insert(0, 1);
    }
    let Some(file) = &s.initial_data_file else {
        return Tensor::filled(dtype, shape, s.initial).map_err(|e| e.to_string());
    };
    let elements = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("initial_dims {first:?} overflow"))?;
    let path = folder.join("initial_state").join(file);
    if !path.is_file() {
        return Err(format!(
            "initial_data_file '{file}' is not in {}",
            folder.join("initial_state").display()
        ));
    }
    let data = crate::warmup::read_elements(&path, dtype, elements)?;
    Tensor::new(dtype, shape, data.into()).map_err(|e| e.to_string())
}

/// The CORRID tensor of a request: the id as the input's integer type, or as a string.
fn corrid(
    model: &str,
    id: &SequenceId,
    dtype: DataType,
    shape: &[usize],
) -> Result<Tensor, InferError> {
    match (id, dtype) {
        (SequenceId::Number(n), DataType::Bytes) => text_tensor(&n.to_string(), shape),
        (SequenceId::Text(t), DataType::Bytes) => text_tensor(t, shape),
        // 64-bit ids keep every bit (an f64 holds 53).
        (SequenceId::Number(n), DataType::U64 | DataType::I64) => {
            let count = shape.iter().product::<usize>();
            let data: Vec<u8> = (0..count).flat_map(|_| n.to_le_bytes()).collect();
            Ok(Tensor::new(dtype, shape.to_vec(), data.into())?)
        }
        (SequenceId::Number(n), d) if d.is_integer() => {
            Ok(Tensor::filled(d, shape.to_vec(), *n as f64)?)
        }
        (SequenceId::Text(_), d) => Err(InferError::invalid(format!(
            "model '{model}' takes its sequence ids as {d} (its CORRID input): send sequence_id \
             as an integer"
        ))),
        (SequenceId::Number(n), d) => Ok(Tensor::filled(d, shape.to_vec(), *n as f64)?),
    }
}

fn text_tensor(text: &str, shape: &[usize]) -> Result<Tensor, InferError> {
    let count = shape.iter().product::<usize>();
    let mut data = Vec::with_capacity(count * (4 + text.len()));
    for _ in 0..count {
        data.extend_from_slice(&(text.len() as u32).to_le_bytes());
        data.extend_from_slice(text.as_bytes());
    }
    Ok(Tensor::new(DataType::Bytes, shape.to_vec(), data.into())?)
}

/// Closes idle sequences until the table goes with its model.
async fn sweep(table: Weak<Table>, idle: Duration) {
    let every = (idle / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match table.upgrade() {
            Some(t) => {
                t.sweep();
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequence::{ControlInput, StateConfig};

    /// A GRU-like model: `frame`, `START`, `state_in` in; `output`, `state_out` out.
    fn signature() -> Signature {
        Signature {
            inputs: vec![
                TensorSpec::new("frame", DataType::F32, &[-1, 8]),
                TensorSpec::new("START", DataType::F32, &[-1, 1]),
                TensorSpec::new("state_in", DataType::F32, &[-1, 4]),
                TensorSpec::new("tag", DataType::Bytes, &[-1, 1]),
            ],
            outputs: vec![
                TensorSpec::new("output", DataType::F32, &[-1, 2]),
                TensorSpec::new("state_out", DataType::F32, &[-1, 4]),
            ],
        }
    }

    fn config() -> SequenceConfig {
        SequenceConfig {
            strategy: SequenceStrategy::Oldest,
            control_inputs: vec![ControlInput {
                name: "START".into(),
                kind: ControlKind::Start,
                false_true: [0.0, 1.0],
            }],
            states: vec![StateConfig::new("state_in", "state_out")],
            ..SequenceConfig::default()
        }
    }

    #[tokio::test]
    async fn clients_see_the_model_without_its_control_and_state_tensors() {
        let s = Sequences::start("gru", &config(), (&signature(), Path::new(".")), 8, &[]).unwrap();
        let names = |specs: &[TensorSpec]| specs.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&s.client.inputs), ["frame", "tag"]);
        assert_eq!(names(&s.client.outputs), ["output"]);
        assert_eq!(s.model, signature());
    }

    #[tokio::test]
    async fn a_configuration_that_does_not_fit_the_model_is_refused_at_load() {
        let refused = |change: &dyn Fn(&mut SequenceConfig, &mut Signature)| {
            let (mut c, mut sig) = (config(), signature());
            change(&mut c, &mut sig);
            Sequences::start("gru", &c, (&sig, Path::new(".")), 8, &[])
                .err()
                .unwrap_or_default()
        };
        let e = refused(&|c, _| c.control_inputs[0].name = "BEGIN".into());
        assert!(e.contains("control input 'BEGIN' is not an input"), "{e}");
        let e = refused(&|c, _| c.states[0].input = "h".into());
        assert!(e.contains("state input 'h' is not an input"), "{e}");
        let e = refused(&|c, _| c.states[0].output = "h_next".into());
        assert!(e.contains("state output 'h_next' is not an output"), "{e}");
        let e = refused(&|_, sig| sig.outputs[1].dtype = DataType::F16);
        assert!(e.contains("state 'state_in' is"), "{e}");
        let e = refused(&|c, _| c.states[0].dims = vec![5]);
        assert!(
            e.contains("give the state's dims as the input takes them"),
            "{e}"
        );
        let e = refused(&|c, _| c.states[0].dims = vec![-1]);
        assert!(
            e.contains("give the state's dims as the input takes them"),
            "{e}"
        );
        let e = refused(&|c, _| c.states[0].initial_dims = vec![3]);
        assert!(
            e.contains("initial_dims [3] do not fit its dims [4]"),
            "{e}"
        );
        let e = refused(&|c, _| c.states[0].initial_data_file = Some("none.bin".into()));
        assert!(e.contains("initial_data_file 'none.bin' is not in"), "{e}");
        let e = refused(&|c, _| c.control_inputs[0].name = "tag".into());
        assert!(e.contains("only CORRID may be"), "{e}");
        // A state whose input is open takes the configured dims.
        let (c, mut sig) = (config(), signature());
        sig.inputs[2].shape = vec![-1, -1];
        let mut c = c;
        c.states[0].dims = vec![4];
        assert!(Sequences::start("gru", &c, (&sig, Path::new(".")), 8, &[]).is_ok());
    }

    #[tokio::test]
    async fn a_state_starts_from_its_file_or_its_first_dims_and_may_change_shape() {
        let dir = std::env::temp_dir().join(format!("sheaf-initial-state-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("initial_state")).unwrap();
        let values: Vec<u8> = [1.5f32, 2.5, 3.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(dir.join("initial_state/h.bin"), &values).unwrap();
        // A history that grows: its input and output take any length.
        let mut sig = signature();
        sig.inputs[2].shape = vec![-1, -1];
        sig.outputs[1].shape = vec![-1, -1];
        let mut c = config();
        c.states[0].initial_dims = vec![3];
        c.states[0].initial_data_file = Some("h.bin".into());
        let s = Sequences::start("gru", &c, (&sig, &dir), 8, &[]).unwrap();
        assert_eq!(s.states[0].initial.shape(), [1, 3]);
        assert_eq!(s.states[0].initial.data()[..], values[..]);

        // The next state is what the model gave, in any length the dims take.
        let out = |shape: Vec<usize>| Tensor::filled(DataType::F32, shape, 1.0).unwrap();
        let next = s.next_state(&[out(vec![1, 2]), out(vec![1, 5])]).unwrap();
        assert_eq!(next[0].shape(), [1, 5]);
        let e = s
            .next_state(&[out(vec![1, 2]), out(vec![1, 5, 2])])
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("has shape [1, 5, 2], where the state's dims are [-1]"),
            "{e}"
        );

        // Without a file or first dims, a variable dimension starts at 1, as Triton starts it.
        c.states[0] = StateConfig {
            initial: 0.5,
            ..StateConfig::new("state_in", "state_out")
        };
        let s = Sequences::start("gru", &c, (&sig, &dir), 8, &[]).unwrap();
        assert_eq!(s.states[0].initial.shape(), [1, 1]);
        assert_eq!(s.states[0].initial.data()[..], 0.5f32.to_le_bytes());

        // A file that holds another count of elements is refused by name.
        c.states[0].initial_dims = vec![4];
        c.states[0].initial_data_file = Some("h.bin".into());
        let e = Sequences::start("gru", &c, (&sig, &dir), 8, &[])
            .err()
            .unwrap();
        assert!(
            e.contains("h.bin: 12 bytes, where 4 elements of FP32 take 16"),
            "{e}"
        );

        // A fixed state keeps its shape: an output of another length is an error.
        let s = Sequences::start("gru", &config(), (&signature(), &dir), 8, &[]).unwrap();
        let e = s
            .next_state(&[out(vec![1, 2]), out(vec![1, 5])])
            .unwrap_err();
        assert!(
            e.to_string().contains("where the state's dims are [4]"),
            "{e}"
        );
        assert_eq!(
            s.next_state(&[out(vec![1, 2]), out(vec![1, 4])]).unwrap()[0].shape(),
            [1, 4]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
