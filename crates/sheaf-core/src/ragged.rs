//! Triton's ragged batching: requests whose inputs differ in shape share a batch, unpadded.
//!
//! An input declared with `allow_ragged_batch: true` lets requests of any item shape stack with
//! each other. A model that takes the batch as one tensor per input (an ONNX model) takes such
//! an input in one dimension: every request's elements, one request after another, as Triton's
//! ONNX Runtime backend gives them. What it needs to find each request in them comes as batch
//! inputs (`batch_input`), which the server makes for each batch it forms:
//!
//! | kind | shape | value |
//! |---|---|---|
//! | `BATCH_ELEMENT_COUNT` | `[requests]` | each request's elements in `source_input` |
//! | `BATCH_ACCUMULATED_ELEMENT_COUNT` | `[requests]` | where each request's elements end |
//! | `BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO` | `[requests + 1]` | 0, then where each ends |
//! | `BATCH_MAX_ELEMENT_COUNT_AS_SHAPE` | `[most elements of one request]` | zeros |
//! | `BATCH_ITEM_SHAPE` | `[items, rank]` | each item's shape (past the batch dimension) |
//! | `BATCH_ITEM_SHAPE_FLATTEN` | `[items × rank]` | the same, in one dimension |
//!
//! A batch input's `target_name`s are inputs of the model that clients never see or send; its
//! `data_type` is `INT32`, `INT64` or `FP32`, as the model takes it. Every other output has one
//! row per item, sliced back as usual: where the batch inputs count requests' elements and none
//! gives item shapes, the model can tell requests apart but not items, so a request of several
//! items is refused (`Ragged::admit`). An output named in a `batch_output` of kind
//! `BATCH_SCATTER_WITH_INPUT_SHAPE` is ragged too: its first dimension runs over the elements
//! of its `source_input`, and each request gets its own part back in the shape it sent that
//! input in.
//!
//! A model of sheaf's batched Python API takes the batch the same way: its signature comes from
//! its configuration, and the Python backend gives it the form above (the ragged input in one
//! dimension, the batch inputs as inputs, a scattered output over elements). A model that sees
//! each request on its own (Triton's Python API) takes its ragged inputs as each request sent
//! them: for it the flag only lets requests of other shapes share a batch, and it has no batch
//! inputs or outputs.
//!
//! ```yaml
//! max_batch_size: 16
//! inputs:
//!   - { name: values, data_type: FP32, dims: [-1], allow_ragged_batch: true }
//! batch_inputs:
//!   - kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO
//!     target_name: [offsets]
//!     data_type: INT64
//!     source_input: [values]
//! ```

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use serde::Deserialize;
use sheaf_backend::{BackendError, DataType, Signature, Tensor, TensorSpec};

use crate::config::DeclaredTensor;

/// What a batch input holds (Triton's `BatchInput.Kind`), read by Triton's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum BatchInputKind {
    ElementCount,
    AccumulatedElementCount,
    AccumulatedElementCountWithZero,
    MaxElementCountAsShape,
    ItemShape,
    ItemShapeFlatten,
}

impl TryFrom<String> for BatchInputKind {
    type Error = String;

    fn try_from(word: String) -> Result<Self, String> {
        BatchInputKind::named(&word).ok_or_else(|| {
            let known: Vec<&str> = BatchInputKind::NAMES.iter().map(|(n, _)| *n).collect();
            format!("{word} is not a kind of batch input; the kinds are {known:?}")
        })
    }
}

impl BatchInputKind {
    /// Every kind, with Triton's name for it.
    pub const NAMES: [(&'static str, BatchInputKind); 6] = [
        ("BATCH_ELEMENT_COUNT", BatchInputKind::ElementCount),
        (
            "BATCH_ACCUMULATED_ELEMENT_COUNT",
            BatchInputKind::AccumulatedElementCount,
        ),
        (
            "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
            BatchInputKind::AccumulatedElementCountWithZero,
        ),
        (
            "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
            BatchInputKind::MaxElementCountAsShape,
        ),
        ("BATCH_ITEM_SHAPE", BatchInputKind::ItemShape),
        ("BATCH_ITEM_SHAPE_FLATTEN", BatchInputKind::ItemShapeFlatten),
    ];

    /// The kind Triton names `word`.
    pub fn named(word: &str) -> Option<BatchInputKind> {
        Self::NAMES
            .iter()
            .find(|(name, _)| *name == word)
            .map(|(_, k)| *k)
    }

    /// Triton's name of the kind.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("", |(name, _)| name)
    }

    /// The rank of the tensor the model takes it as.
    fn rank(self) -> usize {
        match self {
            BatchInputKind::ItemShape => 2,
            _ => 1,
        }
    }
}

/// An input the server makes for each batch (Triton's `batch_input`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchInput {
    pub kind: BatchInputKind,
    /// The model inputs that take it.
    pub target_name: Vec<String>,
    /// `INT32`, `INT64` or `FP32` (Triton's `TYPE_` spelling too).
    pub data_type: String,
    /// The client input it describes (the first one named).
    pub source_input: Vec<String>,
}

/// What is done with a batch output (Triton's `BatchOutput.Kind`): only one kind exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
pub enum BatchOutputKind {
    #[default]
    #[serde(rename = "BATCH_SCATTER_WITH_INPUT_SHAPE")]
    ScatterWithInputShape,
}

impl BatchOutputKind {
    /// Triton's name of the kind.
    pub fn name(self) -> &'static str {
        match self {
            BatchOutputKind::ScatterWithInputShape => "BATCH_SCATTER_WITH_INPUT_SHAPE",
        }
    }
}

/// An output the model gives in one run over a ragged input's elements (Triton's
/// `batch_output`): each request gets its part, in the shape of its `source_input`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchOutput {
    pub target_name: Vec<String>,
    #[serde(default)]
    pub kind: BatchOutputKind,
    pub source_input: Vec<String>,
}

impl BatchInput {
    /// Its data type under Triton's configuration name (`TYPE_INT64`).
    pub fn type_name(&self) -> String {
        let word = self
            .data_type
            .strip_prefix("TYPE_")
            .unwrap_or(&self.data_type);
        format!("TYPE_{word}")
    }

    /// As Triton's JSON form of a configuration writes it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind.name(),
            "target_name": self.target_name,
            "data_type": self.type_name(),
            "source_input": self.source_input,
        })
    }
}

impl BatchOutput {
    /// As Triton's JSON form of a configuration writes it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "target_name": self.target_name,
            "kind": self.kind.name(),
            "source_input": self.source_input,
        })
    }
}

/// Where one of the model's inputs comes from in a batch.
#[derive(Debug, Clone, PartialEq)]
enum Feed {
    /// The clients' input at this place in their signature.
    Client(usize),
    /// The clients' ragged input at this place: its pieces' elements in one dimension.
    Flat(usize),
    /// A batch input of the clients' input at `source`.
    Batch {
        kind: BatchInputKind,
        dtype: DataType,
        source: usize,
    },
}

/// A model's ragged batching, resolved against its signature.
#[derive(Debug, Clone, PartialEq)]
pub struct Ragged {
    /// Per client input: whether requests of any item shape stack with each other.
    pub(crate) ragged: Vec<bool>,
    /// Per model input: where it comes from; empty for a model that sees each request.
    feeds: Vec<Feed>,
    /// Per model output: the client input it is scattered by, if any.
    scatter: Vec<Option<usize>>,
    /// The ragged input of which each request must carry one item, where the batch inputs
    /// describe requests (element counts) and none describes items (item shapes), while an
    /// output has a row per item: a model that can only tell requests apart cannot answer
    /// each of a request's items.
    one_item: Option<String>,
}

/// The stacking rule alone (which client inputs are ragged), for the queue.
pub(crate) type RaggedInputs = Arc<[bool]>;

impl Ragged {
    /// Resolves the configuration's ragged inputs, batch inputs and batch outputs against the
    /// `model`'s signature, and gives the signature clients see: without the batch inputs,
    /// each ragged input and scattered output with a batch dimension and its declared dims.
    /// `None`: the configuration asks for no ragged batching.
    pub fn new(
        declared: &[DeclaredTensor],
        (batch_inputs, batch_outputs): (&[BatchInput], &[BatchOutput]),
        model: &Signature,
        batched: bool,
        sees_requests: bool,
    ) -> Result<Option<(Ragged, Signature)>, String> {
        let flagged: Vec<&DeclaredTensor> =
            declared.iter().filter(|d| d.allow_ragged_batch).collect();
        if flagged.is_empty() && batch_inputs.is_empty() && batch_outputs.is_empty() {
            return Ok(None);
        }
        if !batched {
            return Err(
                "allow_ragged_batch, batch_input and batch_output are for a model that batches: \
                 give it a max_batch_size above 0"
                    .into(),
            );
        }
        if sees_requests {
            if !batch_inputs.is_empty() || !batch_outputs.is_empty() {
                return Err(
                    "batch_input and batch_output are for a model that takes a batch as \
                            one tensor per input; this model sees each request on its own"
                        .into(),
                );
            }
            let ragged = model
                .inputs
                .iter()
                .map(|s| flagged.iter().any(|d| d.name == s.name))
                .collect();
            let ragged = Ragged {
                ragged,
                feeds: Vec::new(),
                scatter: Vec::new(),
                one_item: None,
            };
            return Ok(Some((ragged, model.clone())));
        }
        let targets: Vec<&str> = batch_inputs
            .iter()
            .flat_map(|b| b.target_name.iter().map(String::as_str))
            .collect();
        let mut client = Signature {
            inputs: Vec::new(),
            outputs: Vec::new(),
        };
        for spec in &model.inputs {
            if targets.contains(&spec.name.as_str()) {
                continue;
            }
            let mut spec = spec.clone();
            if let Some(d) = flagged.iter().find(|d| d.name == spec.name) {
                if spec.shape.len() != 1 {
                    return Err(format!(
                        "input '{}' is ragged (allow_ragged_batch), so the model takes it in one \
                         dimension, every request's elements in a row; its shape is {:?}",
                        spec.name, spec.shape
                    ));
                }
                if d.dims.is_empty() {
                    return Err(format!(
                        "input '{}' is ragged (allow_ragged_batch): give its dims as clients \
                         send it, past the batch dimension",
                        d.name
                    ));
                }
                spec.shape = std::iter::once(-1).chain(d.dims.iter().copied()).collect();
            }
            client.inputs.push(spec);
        }
        let input_at = |name: &str| client.inputs.iter().position(|s| s.name == name);
        if let Some(d) = flagged.iter().find(|d| input_at(&d.name).is_none()) {
            return Err(format!(
                "input '{}' is declared ragged, but the model's inputs are {:?}",
                d.name,
                names(&model.inputs)
            ));
        }
        let source = |what: &str, sources: &[String]| -> Result<usize, String> {
            let name = sources
                .first()
                .ok_or_else(|| format!("{what} names no source_input"))?;
            input_at(name).ok_or_else(|| {
                format!(
                    "{what}: source_input '{name}' is not an input clients send; they send {:?}",
                    names(&client.inputs)
                )
            })
        };
        let mut feeds = Vec::with_capacity(model.inputs.len());
        for spec in &model.inputs {
            let Some(b) = batch_inputs
                .iter()
                .find(|b| b.target_name.contains(&spec.name))
            else {
                let i = input_at(&spec.name).unwrap_or_default();
                feeds.push(match flagged.iter().any(|d| d.name == spec.name) {
                    true => Feed::Flat(i),
                    false => Feed::Client(i),
                });
                continue;
            };
            let what = format!("batch_input '{}'", spec.name);
            let word = b.data_type.strip_prefix("TYPE_").unwrap_or(&b.data_type);
            let dtype = match word {
                "INT32" => DataType::I32,
                "INT64" => DataType::I64,
                "FP32" => DataType::F32,
                other => {
                    return Err(format!(
                        "{what}: data_type {other} is not one a batch input takes: INT32, INT64 or \
                         FP32"
                    ))
                }
            };
            if dtype != spec.dtype {
                return Err(format!(
                    "{what} is {word}, but the model takes it as {}",
                    spec.dtype.as_str()
                ));
            }
            if spec.shape.len() != b.kind.rank() {
                return Err(format!(
                    "{what}: the model takes it with shape {:?}, and this kind has {} \
                     dimension(s)",
                    spec.shape,
                    b.kind.rank()
                ));
            }
            feeds.push(Feed::Batch {
                kind: b.kind,
                dtype,
                source: source(&what, &b.source_input)?,
            });
        }
        if let Some(t) = targets
            .iter()
            .find(|t| !model.inputs.iter().any(|s| s.name == **t))
        {
            return Err(format!(
                "batch_input target_name '{t}' is not an input of the model; its inputs are {:?}",
                names(&model.inputs)
            ));
        }
        let mut scatter = vec![None; model.outputs.len()];
        for b in batch_outputs {
            for t in &b.target_name {
                let what = format!("batch_output '{t}'");
                let o = model
                    .outputs
                    .iter()
                    .position(|s| &s.name == t)
                    .ok_or_else(|| {
                        format!(
                            "{what} is not an output of the model; its outputs are {:?}",
                            names(&model.outputs)
                        )
                    })?;
                scatter[o] = Some(source(&what, &b.source_input)?);
            }
        }
        for (spec, by) in model.outputs.iter().zip(&scatter) {
            let mut spec = spec.clone();
            if let Some(s) = by {
                // Each request's part has its input's shape, then the output's own dims.
                let input = &client.inputs[*s].shape;
                spec.shape = input
                    .iter()
                    .chain(spec.shape.get(1..).unwrap_or_default())
                    .copied()
                    .collect();
            }
            client.outputs.push(spec);
        }
        let ragged = client
            .inputs
            .iter()
            .map(|s| flagged.iter().any(|d| d.name == s.name))
            .collect();
        let counts = |f: &Feed| match f {
            Feed::Batch { kind, source, .. } => Some((*kind, *source)),
            _ => None,
        };
        let per_request = feeds.iter().filter_map(counts).find(|(kind, _)| {
            matches!(
                kind,
                BatchInputKind::ElementCount
                    | BatchInputKind::AccumulatedElementCount
                    | BatchInputKind::AccumulatedElementCountWithZero
            )
        });
        let per_item = feeds.iter().filter_map(counts).any(|(kind, _)| {
            matches!(
                kind,
                BatchInputKind::ItemShape | BatchInputKind::ItemShapeFlatten
            )
        });
        let one_item = match per_request {
            Some((_, source)) if !per_item && scatter.iter().any(Option::is_none) => {
                Some(client.inputs[source].name.clone())
            }
            _ => None,
        };
        Ok(Some((
            Ragged {
                ragged,
                feeds,
                scatter,
                one_item,
            },
            client,
        )))
    }

    /// Refuses a request of more `items` than the model can tell apart (see `one_item`).
    pub(crate) fn admit(&self, items: usize) -> Result<(), String> {
        match &self.one_item {
            Some(input) if items > 1 => Err(format!(
                "input '{input}' is ragged, and this model's batch inputs tell requests apart, \
                 not items: send one item per request (shape [1, ...]); this request has {items}"
            )),
            _ => Ok(()),
        }
    }

    /// Which client inputs stack with any item shape.
    pub(crate) fn inputs(&self) -> RaggedInputs {
        self.ragged.clone().into()
    }

    /// Whether the batch the model runs is made here (not the requests as they came).
    pub(crate) fn assembles(&self) -> bool {
        !self.feeds.is_empty()
    }

    /// The model's inputs for a batch of `pieces` (per client input, the requests' tensors in
    /// order).
    pub(crate) fn assemble(&self, pieces: &[Vec<Tensor>]) -> Result<Vec<Tensor>, BackendError> {
        let of = |i: usize| {
            pieces
                .get(i)
                .ok_or_else(|| BackendError::InvalidInput("a client input is missing".into()))
        };
        self.feeds
            .iter()
            .map(|feed| match feed {
                Feed::Client(i) => Tensor::concat(of(*i)?),
                Feed::Flat(i) => {
                    let flat = of(*i)?
                        .iter()
                        .map(|p| Tensor::new(p.dtype(), vec![p.len()], p.data().clone()))
                        .collect::<Result<Vec<_>, _>>()?;
                    Tensor::concat(&flat)
                }
                Feed::Batch {
                    kind,
                    dtype,
                    source,
                } => batch_input(*kind, *dtype, of(*source)?),
            })
            .collect()
    }

    /// Per model output, the client input it is scattered by, if any.
    pub(crate) fn scatter(&self) -> &[Option<usize>] {
        &self.scatter
    }
}

/// Whether `config` asks for ragged batching; refused alongside what batches by one item shape
/// (allowed batch sizes, variable-length padding) and sequences, and with `max_batch_size:
/// auto` but no warm-up sample to probe with (see [`crate::warmup::probe_batch`]).
pub(crate) fn declared(config: &crate::ModelConfig) -> Result<bool, String> {
    let asked = config.inputs.iter().any(|d| d.allow_ragged_batch)
        || !config.batch_inputs.is_empty()
        || !config.batch_outputs.is_empty();
    let clash = [
        (
            !config.allowed_batch_sizes.is_empty(),
            "allowed_batch_sizes",
        ),
        (config.padding.is_some(), "padding"),
        (
            matches!(
                config.max_batch_size,
                Some(crate::config::MaxBatchSize::Auto(_))
            ) && config.model_warmup.is_empty(),
            "max_batch_size: auto without a warm-up sample (model_warmup): the probe times \
             batches made of the samples, which are requests as clients send them",
        ),
        (
            config.sequence_batching.is_some() || config.iterative_sequence,
            "sequence_batching",
        ),
    ];
    match clash.iter().find(|(on, _)| asked && *on) {
        Some((_, what)) => Err(format!(
            "ragged batching (allow_ragged_batch, batch_input, batch_output) does not go with \
             {what}"
        )),
        None => Ok(asked),
    }
}

fn names(specs: &[TensorSpec]) -> Vec<&str> {
    specs.iter().map(|s| s.name.as_str()).collect()
}

/// A batch input of `kind` over `pieces`, one per request in the batch.
fn batch_input(
    kind: BatchInputKind,
    dtype: DataType,
    pieces: &[Tensor],
) -> Result<Tensor, BackendError> {
    let counts = pieces.iter().map(Tensor::len);
    let ends = counts.clone().scan(0, |end, n| {
        *end += n;
        Some(*end)
    });
    let item_shapes = || {
        pieces.iter().flat_map(|p| {
            let dims = p.shape().get(1..).unwrap_or_default();
            std::iter::repeat_n(dims, p.items()).flatten().copied()
        })
    };
    let rank = pieces
        .first()
        .map_or(0, |p| p.shape().len().saturating_sub(1));
    let items: usize = pieces.iter().map(Tensor::items).sum();
    let (shape, values): (Vec<usize>, Vec<usize>) = match kind {
        BatchInputKind::ElementCount => (vec![pieces.len()], counts.collect()),
        BatchInputKind::AccumulatedElementCount => (vec![pieces.len()], ends.collect()),
        BatchInputKind::AccumulatedElementCountWithZero => (
            vec![pieces.len() + 1],
            std::iter::once(0).chain(ends).collect(),
        ),
        BatchInputKind::MaxElementCountAsShape => {
            let most = counts.max().unwrap_or(0);
            (vec![most], vec![0; most])
        }
        BatchInputKind::ItemShape => (vec![items, rank], item_shapes().collect()),
        BatchInputKind::ItemShapeFlatten => (vec![items * rank], item_shapes().collect()),
    };
    let mut data = BytesMut::with_capacity(values.len() * dtype.size());
    for v in values {
        match dtype {
            DataType::I32 => data.put_i32_le(v as i32),
            DataType::I64 => data.put_i64_le(v as i64),
            _ => data.put_f32_le(v as f32),
        }
    }
    Tensor::new(dtype, shape, data.freeze())
}

/// Item counts of one request's part of a scattered output: `len` items of the source input's
/// `dims` each.
pub(crate) fn scattered_rows(len: usize, dims: &[usize]) -> usize {
    len * dims.iter().product::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn f32s(shape: Vec<usize>, values: &[f32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DataType::F32, shape, Bytes::from(data)).unwrap()
    }

    fn i64s(t: &Tensor) -> Vec<i64> {
        t.data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn declared(name: &str, dims: &[i64]) -> DeclaredTensor {
        DeclaredTensor {
            name: name.into(),
            dims: dims.to_vec(),
            allow_ragged_batch: true,
            ..DeclaredTensor::default()
        }
    }

    fn batch_input(kind: &str, target: &str, dtype: &str) -> BatchInput {
        BatchInput {
            kind: BatchInputKind::named(kind).unwrap(),
            target_name: vec![target.into()],
            data_type: dtype.into(),
            source_input: vec!["x".into()],
        }
    }

    /// x: ragged, taken in one dimension; idx and shape: batch inputs; y: scattered by x;
    /// n: one row per item.
    fn model() -> Signature {
        Signature {
            inputs: vec![
                TensorSpec::new("x", DataType::F32, &[-1]),
                TensorSpec::new("idx", DataType::I64, &[-1]),
                TensorSpec::new("shape", DataType::I32, &[-1, -1]),
            ],
            outputs: vec![
                TensorSpec::new("y", DataType::F32, &[-1]),
                TensorSpec::new("n", DataType::F32, &[-1, 1]),
            ],
        }
    }

    #[test]
    fn every_kind_of_batch_input_describes_the_requests_as_triton_s_do() {
        // Triton's examples: one request of two items of [3, 1] and one of an item of [2, 2].
        let pieces = [
            f32s(vec![2, 3, 1], &[0.0; 6]),
            f32s(vec![1, 2, 2], &[0.0; 4]),
        ];
        let made = |kind| super::batch_input(kind, DataType::I64, &pieces).unwrap();
        let check = |kind, shape: &[usize], values: &[i64]| {
            let t = made(kind);
            assert_eq!((t.shape(), i64s(&t)), (shape, values.to_vec()), "{kind:?}");
        };
        check(BatchInputKind::ElementCount, &[2], &[6, 4]);
        check(BatchInputKind::AccumulatedElementCount, &[2], &[6, 10]);
        check(
            BatchInputKind::AccumulatedElementCountWithZero,
            &[3],
            &[0, 6, 10],
        );
        check(BatchInputKind::MaxElementCountAsShape, &[6], &[0; 6]);
        check(BatchInputKind::ItemShape, &[3, 2], &[3, 1, 3, 1, 2, 2]);
        check(BatchInputKind::ItemShapeFlatten, &[6], &[3, 1, 3, 1, 2, 2]);
        // FP32 and INT32 hold the same values.
        let f = super::batch_input(
            BatchInputKind::AccumulatedElementCount,
            DataType::F32,
            &pieces,
        )
        .unwrap();
        assert_eq!(f, f32s(vec![2], &[6.0, 10.0]));
        let i = super::batch_input(BatchInputKind::ElementCount, DataType::I32, &pieces).unwrap();
        assert_eq!(i.data()[..], [6, 0, 0, 0, 4, 0, 0, 0]);
    }

    #[test]
    fn clients_send_ragged_inputs_with_their_dims_and_never_see_batch_inputs() {
        let inputs = [
            batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "idx", "INT64"),
            batch_input("BATCH_ITEM_SHAPE", "shape", "TYPE_INT32"),
        ];
        let outputs = [BatchOutput {
            target_name: vec!["y".into()],
            kind: BatchOutputKind::ScatterWithInputShape,
            source_input: vec!["x".into()],
        }];
        let (ragged, client) = Ragged::new(
            &[declared("x", &[-1])],
            (&inputs, &outputs),
            &model(),
            true,
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            client.inputs,
            [TensorSpec::new("x", DataType::F32, &[-1, -1])]
        );
        assert_eq!(
            client.outputs,
            [
                TensorSpec::new("y", DataType::F32, &[-1, -1]),
                TensorSpec::new("n", DataType::F32, &[-1, 1])
            ]
        );
        assert_eq!(ragged.scatter(), [Some(0), None]);
        assert_eq!(&*ragged.inputs(), [true]);

        // Two requests of 3 and 2 values: x flat, then the batch inputs.
        let pieces = vec![vec![
            f32s(vec![1, 3], &[1.0, 2.0, 3.0]),
            f32s(vec![1, 2], &[4.0, 5.0]),
        ]];
        let batch = ragged.assemble(&pieces).unwrap();
        assert_eq!(batch[0], f32s(vec![5], &[1.0, 2.0, 3.0, 4.0, 5.0]));
        assert_eq!(
            (batch[1].shape(), i64s(&batch[1])),
            (&[3][..], vec![0, 3, 5])
        );
        assert_eq!(batch[2].shape(), [2, 1]);
        assert_eq!(batch[2].data()[..], [3, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(scattered_rows(2, &[3, 4]), 24);
        // With item shapes, a request may carry several items.
        assert_eq!(ragged.admit(3), Ok(()));
    }

    #[test]
    fn a_model_that_tells_only_requests_apart_takes_one_item_a_request() {
        let signature = |inputs: &[&str]| Signature {
            inputs: inputs
                .iter()
                .map(|n| TensorSpec::new(n, DataType::I64, &[-1]))
                .chain([TensorSpec::new("x", DataType::F32, &[-1])])
                .collect(),
            outputs: vec![
                TensorSpec::new("y", DataType::F32, &[-1]),
                TensorSpec::new("n", DataType::F32, &[-1, 1]),
            ],
        };
        let scatter_y = [BatchOutput {
            target_name: vec!["y".into()],
            kind: BatchOutputKind::ScatterWithInputShape,
            source_input: vec!["x".into()],
        }];
        let resolve = |kinds: &[(&str, &str)], outputs: &[BatchOutput], model: &Signature| {
            let inputs: Vec<BatchInput> = kinds
                .iter()
                .map(|(kind, target)| batch_input(kind, target, "INT64"))
                .collect();
            Ragged::new(
                &[declared("x", &[-1])],
                (&inputs, outputs),
                model,
                true,
                false,
            )
            .unwrap()
            .unwrap()
            .0
        };
        // Element counts, and an output with a row per item: one item a request.
        let counts = resolve(
            &[("BATCH_ELEMENT_COUNT", "c")],
            &scatter_y,
            &signature(&["c"]),
        );
        assert_eq!(counts.admit(1), Ok(()));
        assert_eq!(
            counts.admit(2).unwrap_err(),
            "input 'x' is ragged, and this model's batch inputs tell requests apart, not items: \
             send one item per request (shape [1, ...]); this request has 2"
        );
        // Every output scattered over elements: items need not be told apart.
        let mut scattered = signature(&["c"]);
        scattered.outputs.pop();
        assert_eq!(
            resolve(&[("BATCH_ELEMENT_COUNT", "c")], &scatter_y, &scattered).admit(4),
            Ok(())
        );
        // The largest count alone describes the batch, not its requests.
        assert_eq!(
            resolve(
                &[("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "c")],
                &scatter_y,
                &signature(&["c"])
            )
            .admit(4),
            Ok(())
        );
    }

    #[test]
    fn what_does_not_fit_the_model_is_refused_by_name() {
        let new = |declared: &[DeclaredTensor], inputs: &[BatchInput], batched, sees| {
            Ragged::new(declared, (inputs, &[]), &model(), batched, sees)
                .err()
                .unwrap_or_default()
        };
        let x = [declared("x", &[-1])];
        let idx = |kind, dtype| [batch_input(kind, "idx", dtype)];
        let count = "BATCH_ELEMENT_COUNT";
        assert!(new(&x, &[], false, false).contains("give it a max_batch_size above 0"));
        assert!(new(&x, &idx(count, "INT64"), true, true).contains("sees each request"));
        assert!(new(&[declared("x", &[])], &[], true, false).contains("give its dims"));
        assert!(new(&[declared("n", &[1])], &[], true, false).contains("'n' is declared ragged"));
        let e = new(&x, &idx(count, "FP16"), true, false);
        assert!(
            e.contains("data_type FP16 is not one a batch input takes"),
            "{e}"
        );
        let e = new(&x, &idx(count, "FP32"), true, false);
        assert!(
            e.contains("batch_input 'idx' is FP32, but the model takes it as INT64"),
            "{e}"
        );
        let e = new(&x, &idx("BATCH_ITEM_SHAPE", "INT64"), true, false);
        assert!(e.contains("this kind has 2 dimension(s)"), "{e}");
        let e = new(&x, &[batch_input(count, "nope", "INT64")], true, false);
        assert!(e.contains("target_name 'nope' is not an input"), "{e}");
        let mut from_idx = batch_input(count, "idx", "INT64");
        // A batch input describes what clients send, not another batch input.
        from_idx.source_input = vec!["idx".into()];
        let e = new(&x, &[from_idx], true, false);
        assert!(
            e.contains("source_input 'idx' is not an input clients send"),
            "{e}"
        );
        // The shape input is ragged in the model's terms: two dimensions are refused.
        let e = new(&[declared("shape", &[-1])], &[], true, false);
        assert!(e.contains("so the model takes it in one dimension"), "{e}");
        // config.yaml reads the kinds by Triton's names too.
        let yaml = |kind: &str| {
            crate::ModelConfig::from_yaml(&format!(
                "batch_inputs: [{{kind: {kind}, target_name: [idx], data_type: INT64, \
                 source_input: [x]}}]\n"
            ))
        };
        let read = yaml("BATCH_ITEM_SHAPE_FLATTEN").unwrap();
        assert_eq!(read.batch_inputs[0].kind, BatchInputKind::ItemShapeFlatten);
        let e = format!("{:?}", yaml("BATCH_NOPE").unwrap_err());
        assert!(e.contains("BATCH_NOPE is not a kind of batch input"), "{e}");
        // A model that sees each request keeps its signature; the flag only stacks.
        let (r, client) = Ragged::new(&x, (&[], &[]), &model(), true, true)
            .unwrap()
            .unwrap();
        assert_eq!((client, r.assembles()), (model(), false));
    }
}
