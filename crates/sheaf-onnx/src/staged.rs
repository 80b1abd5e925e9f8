//! The batch path without per-batch allocation: inputs and outputs bound to buffers that an
//! instance keeps (ONNX Runtime's IO binding), and output bytes recycled.
//!
//! [`Staged`] belongs to one bucket's session (one input shape). Its input and output tensors
//! are allocated once. On a CUDA device the inputs are in pinned host memory, so that one DMA
//! moves a batch to the GPU instead of the CUDA provider staging pageable memory itself on every
//! run; elsewhere, and for the outputs everywhere, in ONNX Runtime's CPU memory. Each batch is
//! copied into the input tensors (a large one by several threads: [`crate::gather`]), bound,
//! and run; the outputs land in the bound output tensors. Rows past a batch's items are zero:
//! the buffers start zeroed, and a batch zeroes only what an earlier, larger batch wrote past
//! its own rows, so padding a batch up to its bucket costs no copy.
//!
//! Outputs are not pinned: with an output bound to pinned memory, ONNX Runtime 1.31.1's CUDA
//! provider copies the output onto itself and fails the run (`GPUDataTransfer::CopyTensorAsync
//! ... dst_data != src_data`), for every model (seen on an H100: the MLP, ResNet-50 and
//! EfficientNet-Lite0 all failed their warm-up). Outputs are small beside inputs for the models
//! this path serves (a class vector against an image), so their copy back stays pageable.
//!
//! Unless a model's config says (`io_binding`), a model on CUDA binds where an item's inputs
//! take [`BIND_FROM`] bytes or more. Measured on an H100 and an H200 (bench/RESULTS.md): bound,
//! the 602 KB images of ResNet-50 and EfficientNet-Lite0 ran 1.02-1.24x as fast in-process as
//! with the CUDA provider staging pageable memory itself, while the 2 KB items of the demo MLP
//! ran at a quarter of its unbound speed at batch 256 (0.52 ms a batch against 0.12).
//!
//! [`OutputPool`] hands out the bytes that outputs are copied into for the requests. A batch's
//! output bytes are sliced into the requests' answers; once every answer has been written and
//! dropped, the pool's own handle is the last one, and the buffer serves a later batch.

use bytes::{Bytes, BytesMut};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::DynTensor;
use sheaf_backend::{BackendError, Device, Signature, Tensor};

/// An item's input bytes from which a model binds its inputs when its config leaves it open
/// (see the module doc; between 2 KB and 602 KB nothing was measured).
pub(crate) const BIND_FROM: usize = 64 * 1024;

/// Whether a model with `signature` binds its inputs by default: an item's inputs take
/// [`BIND_FROM`] bytes or more (dimensions past the batch that are dynamic count as none).
pub(crate) fn worth_binding(signature: &Signature) -> bool {
    let item: usize = signature
        .inputs
        .iter()
        .map(|s| {
            let dims: usize = s.shape.iter().skip(1).map(|&d| d.max(0) as usize).product();
            dims * s.dtype.size()
        })
        .sum();
    item >= BIND_FROM
}

/// One bucket session's bound inputs and outputs (see the module doc).
pub(crate) struct Staged {
    binding: IoBinding,
    inputs: Vec<DynTensor>,
    /// Per input, how many bytes from its start may hold an earlier batch's rows; past them
    /// the buffer is zero.
    written: Vec<usize>,
}

/// A staged tensor's bytes, for elements of `size` bytes.
fn bytes_of(tensor: &mut DynTensor, size: usize) -> &mut [u8] {
    let len = tensor.shape().iter().product::<i64>().max(0) as usize * size;
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the tensor was allocated with its shape and element type, so it holds `len`
    // bytes, and `&mut` keeps anyone else from them while the slice lives.
    unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr_mut().cast::<u8>(), len) }
}

/// The concrete shape of a batch of `items` for `dims` (the signature's shape, -1 first), or
/// none when another dimension is dynamic: such a session is not staged.
fn batch_shape(dims: &[i64], items: usize) -> Option<Vec<i64>> {
    let (first, rest) = dims.split_first()?;
    if *first != -1 || rest.iter().any(|&d| d < 0) {
        return None;
    }
    Some(
        std::iter::once(items as i64)
            .chain(rest.iter().copied())
            .collect(),
    )
}

impl Staged {
    /// Binds `session`, which runs batches of `items`, to buffers of its own; none when the
    /// signature has a dynamic dimension besides the batch.
    pub(crate) fn new(
        session: &Session,
        signature: &Signature,
        items: usize,
        device: Device,
    ) -> Result<Option<Staged>, BackendError> {
        let shapes = |specs: &[sheaf_backend::TensorSpec]| -> Option<Vec<Vec<i64>>> {
            specs.iter().map(|s| batch_shape(&s.shape, items)).collect()
        };
        let (Some(input_shapes), Some(output_shapes)) =
            (shapes(&signature.inputs), shapes(&signature.outputs))
        else {
            return Ok(None);
        };
        let fail = |e: ort::Error| BackendError::Runtime(format!("cannot bind the session: {e}"));
        let to_device = match device {
            Device::Cuda(_) => Allocator::new(
                session,
                MemoryInfo::new(
                    AllocationDevice::CUDA_PINNED,
                    0,
                    AllocatorType::Device,
                    MemoryType::CPUInput,
                )
                .map_err(fail)?,
            )
            .map_err(fail)?,
            Device::Cpu | Device::Sim => Allocator::default(),
        };
        // ONNX Runtime's CPU memory on every device (see the module doc).
        let from_device = Allocator::default();
        let mut binding = session.create_binding().map_err(fail)?;
        let mut inputs = Vec::with_capacity(input_shapes.len());
        for (spec, shape) in signature.inputs.iter().zip(input_shapes) {
            let mut tensor =
                DynTensor::new(&to_device, crate::model::element_type(spec.dtype), shape)
                    .map_err(fail)?;
            bytes_of(&mut tensor, spec.dtype.size()).fill(0);
            binding
                .bind_input(spec.name.as_str(), &tensor)
                .map_err(fail)?;
            inputs.push(tensor);
        }
        for (spec, shape) in signature.outputs.iter().zip(output_shapes) {
            let tensor =
                DynTensor::new(&from_device, crate::model::element_type(spec.dtype), shape)
                    .map_err(fail)?;
            binding
                .bind_output(spec.name.as_str(), tensor)
                .map_err(fail)?;
        }
        let written = vec![0; inputs.len()];
        Ok(Some(Staged {
            binding,
            inputs,
            written,
        }))
    }

    /// Copies a batch into the bound inputs: per input, the pieces in order (the requests'
    /// tensors, or one assembled tensor), then zero rows up to the bucket's size.
    pub(crate) fn load(
        &mut self,
        signature: &Signature,
        pieces: &[&[Tensor]],
    ) -> Result<(), BackendError> {
        let fail = |e: ort::Error| BackendError::Runtime(e.to_string());
        let inputs = signature.inputs.iter().zip(pieces);
        for ((spec, parts), (staged, written)) in
            inputs.zip(self.inputs.iter_mut().zip(&mut self.written))
        {
            let shape = staged.shape().to_vec();
            let row_shape: Vec<usize> = shape.iter().skip(1).map(|&d| d.max(0) as usize).collect();
            let dst = bytes_of(staged, spec.dtype.size());
            let mut srcs = Vec::with_capacity(parts.len());
            let mut at = 0;
            for part in *parts {
                let src = part.data();
                if part.dtype() != spec.dtype
                    || part.shape().get(1..) != Some(row_shape.as_slice())
                    || at + src.len() > dst.len()
                {
                    return Err(BackendError::InvalidInput(format!(
                        "input {}: {} {:?} does not fit this batch's {} {shape:?}",
                        spec.name,
                        part.dtype(),
                        part.shape(),
                        spec.dtype
                    )));
                }
                srcs.push(src.as_ref());
                at += src.len();
            }
            let copied = crate::gather::gather(dst, &srcs, crate::gather::threads_for(at));
            if copied < *written {
                dst[copied..*written].fill(0);
            }
            *written = copied;
            // Binding again queues the copy to the device (on CUDA, from pinned memory).
            self.binding
                .bind_input(spec.name.as_str(), staged)
                .map_err(fail)?;
        }
        Ok(())
    }

    /// Runs the batch [`Staged::load`] copied in, and copies the outputs (in signature order)
    /// into bytes from `pool`.
    pub(crate) fn run(
        &mut self,
        session: &mut Session,
        signature: &Signature,
        pool: &mut OutputPool,
    ) -> Result<Vec<Tensor>, BackendError> {
        let fail = |e: ort::Error| BackendError::Runtime(e.to_string());
        let outputs = session.run_binding(&self.binding).map_err(fail)?;
        crate::model::outputs_of(signature, outputs, pool)
    }
}

/// Most output buffers a model keeps for reuse.
const POOLED: usize = 32;

/// Output bytes reused across batches (see the module doc).
#[derive(Default)]
pub(crate) struct OutputPool {
    /// Each buffer with its capacity (its bytes may be fewer: the last batch's).
    held: Vec<(Bytes, usize)>,
}

impl OutputPool {
    /// `src` copied into bytes of the pool: a buffer no answer holds any more, else a new one.
    pub(crate) fn copy(&mut self, src: &[u8]) -> Bytes {
        // A buffer is free when the pool's handle is its only one. Too small a free one goes,
        // and a buffer of the size asked for takes its place.
        self.held
            .retain(|(b, capacity)| !(b.is_unique() && *capacity < src.len()));
        let free = self
            .held
            .iter()
            .position(|(b, _)| b.is_unique())
            .and_then(|i| self.held.swap_remove(i).0.try_into_mut().ok());
        let mut buffer = free.unwrap_or_else(|| BytesMut::with_capacity(src.len()));
        buffer.clear();
        buffer.extend_from_slice(src);
        let capacity = buffer.capacity();
        let bytes = buffer.freeze();
        if self.held.len() < POOLED {
            self.held.push((bytes.clone(), capacity));
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_returns_once_no_answer_holds_it() {
        let mut pool = OutputPool::default();
        let first = pool.copy(&[1; 64]);
        let at = first.as_ptr();
        // Still held by an answer: a new buffer.
        let second = pool.copy(&[2; 64]);
        assert_ne!(second.as_ptr(), at);
        drop(first);
        // Now free: the same memory serves the next batch, with the new bytes.
        let third = pool.copy(&[3; 32]);
        assert_eq!(third.as_ptr(), at);
        assert_eq!(third.as_ref(), &[3; 32]);
        assert_eq!(second.as_ref(), &[2; 64]);
    }

    #[test]
    fn images_bind_by_default_and_small_items_do_not() {
        let signature = |shape: Vec<i64>| Signature {
            inputs: vec![sheaf_backend::TensorSpec {
                name: "x".into(),
                dtype: sheaf_backend::DataType::F32,
                shape,
            }],
            outputs: Vec::new(),
        };
        // A 224x224 RGB image: 602 KB an item.
        assert!(worth_binding(&signature(vec![-1, 3, 224, 224])));
        // The demo MLP's 512 floats: 2 KB.
        assert!(!worth_binding(&signature(vec![-1, 512])));
        assert!(worth_binding(&signature(vec![-1, 16384])));
        assert!(!worth_binding(&signature(vec![-1, 16383])));
    }

    #[test]
    fn only_fixed_shapes_are_staged() {
        assert_eq!(batch_shape(&[-1, 3, 2], 8), Some(vec![8, 3, 2]));
        assert_eq!(batch_shape(&[-1, -1], 8), None);
        assert_eq!(batch_shape(&[4, 2], 8), None);
    }
}
