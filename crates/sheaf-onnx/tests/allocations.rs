//! No tensor memory allocated per batch: once warmed, a model instance runs batch after batch
//! on the real MLP without allocating any buffer the size of a tensor, on the CPU path (inputs
//! viewed, outputs copied into recycled bytes) and on the bound path that CUDA devices take
//! (inputs copied into bound buffers, outputs bound), here run on the CPU. Both answer alike.
//!
//! A counting global allocator counts the allocations of at least [`TENSOR_BYTES`] bytes (the
//! smallest tensor of these batches is 10 KiB); the requests' answers are dropped after each
//! batch, as the server drops them once written.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use sheaf_backend::{DataType, Model, Tensor};
use sheaf_onnx::{OnnxModel, OnnxOptions};

const TENSOR_BYTES: usize = 8 * 1024;

struct Counting;

static LARGE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed straight to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= TENSOR_BYTES {
            LARGE.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= TENSOR_BYTES {
            LARGE.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn batch(items: usize, seed: usize) -> Tensor {
    let data: Vec<u8> = (0..items * 512)
        .flat_map(|i| (((i + seed) % 97) as f32 / 97.0 - 0.5).to_le_bytes())
        .collect();
    Tensor::new(DataType::F32, vec![items, 512], Bytes::from(data)).unwrap()
}

/// Large allocations per batch over `rounds` batches of each size, after one warm-up round.
fn large_allocations(model: &mut OnnxModel, inputs: &[Tensor], rounds: usize) -> usize {
    for input in inputs {
        drop(model.infer(std::slice::from_ref(input)).unwrap());
    }
    let before = LARGE.load(Ordering::Relaxed);
    for _ in 0..rounds {
        for input in inputs {
            drop(model.infer(std::slice::from_ref(input)).unwrap());
        }
    }
    LARGE.load(Ordering::Relaxed) - before
}

#[test]
fn warmed_instances_allocate_no_tensor_memory_per_batch() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model_repository/mlp/1/model.onnx");
    let lib = sheaf_onnx::library::locate(None).expect("ONNX Runtime: run scripts/setup.sh");
    sheaf_onnx::init(&lib).unwrap();
    // Outputs of 256, 128 and 64 rows of 10 floats: 10, 5 and 2.5 KiB; the inputs are
    // 512 floats a row. Largest first, as the server warms them.
    let inputs: Vec<Tensor> = [256, 128, 256]
        .iter()
        .enumerate()
        .map(|(s, &n)| batch(n, s))
        .collect();
    let viewed = OnnxOptions::default();
    let bound = OnnxOptions {
        session_per_batch_size: true,
        io_binding: Some(true),
        ..OnnxOptions::default()
    };
    let mut plain = OnnxModel::load(&path, &viewed).unwrap();
    let mut staged = OnnxModel::load(&path, &bound).unwrap();
    // The same answers both ways.
    for input in &inputs {
        let a = plain.infer(std::slice::from_ref(input)).unwrap();
        let b = staged.infer(std::slice::from_ref(input)).unwrap();
        assert_eq!(a[0].shape(), b[0].shape());
        assert_eq!(a[0].data(), b[0].data());
    }
    assert_eq!(
        large_allocations(&mut plain, &inputs, 20),
        0,
        "the viewed CPU path"
    );
    assert_eq!(
        large_allocations(&mut staged, &inputs, 20),
        0,
        "the bound path"
    );
    // An answer held past the next batch (a slow client) keeps its bytes: the next batch's
    // outputs go elsewhere.
    let held = staged.infer(&inputs[..1]).unwrap();
    let copy = held[0].data().to_vec();
    let next = staged.infer(&inputs[2..3]).unwrap();
    assert_ne!(next[0].data().as_ptr(), held[0].data().as_ptr());
    assert_eq!(held[0].data().as_ref(), copy.as_slice());
}
