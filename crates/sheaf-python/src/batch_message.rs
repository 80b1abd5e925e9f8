//! The message that hands a batch to the model process (`execute` or `infer`): each request's
//! tensors copied into the input region, and where each lies. It is serialised straight from
//! borrowed fields: a batch of a Triton-API model says something of every request, and building a
//! JSON tree of it first cost more than the model's own work on small tensors.

use serde::Serialize;

use sheaf_backend::{BackendError, CorrelationId, RequestInfo, Signature, Tensor};

use crate::answers::ALIGN;
use crate::traced::Traced;
use crate::worker::Worker;

/// `{"op", "size", "requests", "call"}`: the operation, the bytes of the input region in use,
/// each request, and for a streaming model's batch the call its responses belong to. The
/// numbers of its requests that may be traced are forgotten when it is dropped, once the batch
/// has been answered.
#[derive(Serialize)]
pub(crate) struct BatchMessage<'a> {
    op: &'a str,
    size: usize,
    requests: Vec<Described<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    call: Option<u64>,
    /// Held for its drop.
    #[serde(skip)]
    _numbered: Numbered,
}

/// The trace numbers a batch message gave its requests.
#[derive(Default)]
struct Numbered {
    traced: Option<Traced>,
    numbers: Vec<u64>,
}

impl Drop for Numbered {
    fn drop(&mut self) {
        if let Some(traced) = &self.traced {
            traced.forget(&self.numbers);
        }
    }
}

impl BatchMessage<'_> {
    /// Marks a streaming model's batch: the call its responses belong to, and each request's
    /// cancellation flag slot.
    pub(crate) fn streaming(&mut self, call: u64, slots: Vec<Option<usize>>) {
        self.call = Some(call);
        for (request, slot) in self.requests.iter_mut().zip(slots) {
            request.slot = slot;
        }
    }
}

/// One request: its tensors, and what the client said of it (Triton's `InferenceRequest`).
#[derive(Serialize)]
struct Described<'a> {
    inputs: Vec<Placed<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outputs: Option<&'a [String]>,
    /// The client's other parameters, as their JSON text.
    #[serde(skip_serializing_if = "str::is_empty")]
    parameters: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    flags: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<Correlation<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<usize>,
    /// The number the request's trace goes by, while requests are traced (see
    /// [`crate::traced`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<u64>,
}

fn is_zero(flags: &u32) -> bool {
    *flags == 0
}

/// A correlation id as the client sent it: a number or a string.
#[derive(Serialize)]
#[serde(untagged)]
enum Correlation<'a> {
    Number(u64),
    Text(&'a str),
}

/// Where one tensor lies in the input region.
#[derive(Serialize)]
struct Placed<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    offset: usize,
}

/// Copies the requests' tensors into the worker's input region, each at an aligned offset, and
/// returns the message that says where they lie.
pub(crate) fn write_inputs<'a>(
    worker: &mut Worker,
    op: &'a str,
    requests: &[&'a [Tensor]],
    infos: &[&'a RequestInfo],
    signature: &'a Signature,
) -> Result<BatchMessage<'a>, BackendError> {
    let total: usize = requests
        .iter()
        .flat_map(|r| r.iter())
        .map(|t| t.data().len().div_ceil(ALIGN) * ALIGN)
        .sum();
    worker.input.reserve(total)?;
    let region = worker.input.bytes_mut();
    let mut at = 0;
    let mut described = Vec::with_capacity(requests.len());
    let mut numbered = Numbered::default();
    for (k, tensors) in requests.iter().enumerate() {
        let info = infos.get(k).copied();
        let absent = info.map_or(&[][..], |i| i.absent.as_slice());
        let mut inputs = Vec::with_capacity(tensors.len());
        for (spec, t) in signature.inputs.iter().zip(tensors.iter()) {
            // An optional input the request left out: the model is not given it.
            if absent.contains(&spec.name) {
                continue;
            }
            region[at..at + t.data().len()].copy_from_slice(t.data());
            inputs.push(Placed {
                name: &spec.name,
                datatype: t.dtype().as_str(),
                shape: t.shape(),
                offset: at,
            });
            at += t.data().len().div_ceil(ALIGN) * ALIGN;
        }
        described.push(Described {
            inputs,
            id: info.map(|i| i.id.as_str()),
            outputs: info.map(|i| i.requested_outputs.as_slice()),
            parameters: info.map_or("", |i| i.parameters.as_str()),
            flags: info.map_or(0, |i| i.flags),
            correlation_id: info.and_then(|i| {
                i.correlation_id.as_ref().map(|c| match c {
                    CorrelationId::Number(n) => Correlation::Number(*n),
                    CorrelationId::Text(t) => Correlation::Text(t),
                })
            }),
            slot: None,
            trace: info.and_then(|i| i.calls.as_ref()).map(|calls| {
                let number = worker.traced.number(calls);
                numbered.numbers.push(number);
                number
            }),
        });
    }
    if !numbered.numbers.is_empty() {
        numbered.traced = Some(worker.traced.clone());
    }
    Ok(BatchMessage {
        op,
        size: worker.input.len(),
        requests: described,
        call: None,
        _numbered: numbered,
    })
}
