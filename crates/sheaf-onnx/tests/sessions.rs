//! One session per batch size, on the real MLP: each size runs in a session of its own, the
//! answers equal those of one shared session, sizes can be dropped, and inputs that are not
//! aligned for their element type (copied, not viewed) give the same answers.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use sheaf_backend::{DataType, Model, Tensor};
use sheaf_onnx::{OnnxModel, OnnxOptions};

fn mlp() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = sheaf_onnx::library::locate(None).expect("ONNX Runtime: run scripts/setup.sh");
    sheaf_onnx::init(&lib).expect("ONNX Runtime loads");
    root.join("model_repository/mlp/1/model.onnx")
}

/// `items` rows of 512 floats, different for every row.
fn batch(items: usize) -> Tensor {
    let data: Vec<u8> = (0..items * 512)
        .flat_map(|i| ((i % 97) as f32 / 97.0 - 0.5).to_le_bytes())
        .collect();
    Tensor::new(DataType::F32, vec![items, 512], Bytes::from(data)).unwrap()
}

#[test]
fn each_batch_size_runs_in_its_own_session_with_the_same_answers() {
    let path = mlp();
    let mut shared = OnnxModel::load(&path, &OnnxOptions::default()).unwrap();
    let per_size = OnnxOptions {
        session_per_batch_size: true,
        ..OnnxOptions::default()
    };
    let mut sized = OnnxModel::load(&path, &per_size).unwrap();
    assert!(sized.session_batch_sizes().is_empty(), "no size seen yet");
    for items in [1, 4, 4, 2, 1] {
        let input = [batch(items)];
        let a = shared.infer(&input).unwrap();
        let b = sized.infer(&input).unwrap();
        assert_eq!(a[0].shape(), [items, 10]);
        assert_eq!(a[0].data(), b[0].data(), "batch of {items}");
    }
    assert_eq!(sized.session_batch_sizes(), vec![1, 2, 4]);
    assert!(
        shared.session_batch_sizes().is_empty(),
        "one shared session"
    );

    sized.keep_batch_sizes(&[4]);
    assert_eq!(sized.session_batch_sizes(), vec![4]);
    sized.infer(&[batch(2)]).unwrap();
    assert_eq!(
        sized.session_batch_sizes(),
        vec![2, 4],
        "a dropped size comes back"
    );
}

#[test]
fn unaligned_inputs_are_copied_and_answer_the_same() {
    let mut model = OnnxModel::load(&mlp(), &OnnxOptions::default()).unwrap();
    let aligned = batch(3);
    // The same bytes one byte into a buffer: not aligned for f32, so they cannot be viewed.
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(aligned.data());
    let bytes = Bytes::from(shifted).slice(1..);
    assert_ne!(bytes.as_ptr() as usize % 4, 0);
    let unaligned = Tensor::new(DataType::F32, vec![3, 512], bytes).unwrap();
    let a = model.infer(&[aligned]).unwrap();
    let b = model.infer(&[unaligned]).unwrap();
    assert_eq!(a[0].data(), b[0].data());
}

#[test]
fn every_graph_optimization_level_and_parallel_execution_answer_as_the_default_does() {
    use sheaf_backend::{GraphOptimization, GraphOptions};
    let path = mlp();
    let input = [batch(3)];
    let mut default = OnnxModel::load(&path, &OnnxOptions::default()).unwrap();
    let want = default.infer(&input).unwrap();
    let floats = |t: &Tensor| -> Vec<f32> {
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    for optimization in [
        GraphOptimization::Disabled,
        GraphOptimization::Basic,
        GraphOptimization::Extended,
        GraphOptimization::All,
    ] {
        for (inter_op_threads, parallel) in [(1, false), (2, true)] {
            let options = OnnxOptions {
                graph: GraphOptions {
                    optimization,
                    inter_op_threads,
                    parallel,
                },
                ..OnnxOptions::default()
            };
            let mut model = OnnxModel::load(&path, &options).unwrap();
            let got = model.infer(&input).unwrap();
            assert_eq!(got[0].shape(), want[0].shape());
            for (g, w) in floats(&got[0]).iter().zip(floats(&want[0])) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{optimization:?}: {g} vs {w}"
                );
            }
        }
    }
}
