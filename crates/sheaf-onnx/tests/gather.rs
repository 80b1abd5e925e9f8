//! A batch large enough to be copied into its bound input by several threads, on the real
//! EfficientNet-Lite0 (602 KB an image) and the bound path that CUDA devices take, here run on
//! the CPU: the requests' rows land in order and the model answers as it does for the same
//! batch assembled by hand; a smaller batch after it in the same bucket sees zero rows past its
//! own, not the larger batch's leftovers.

use std::path::Path;

use bytes::Bytes;
use sheaf_backend::{DataType, Model, Tensor};
use sheaf_onnx::{OnnxModel, OnnxOptions};

/// Floats in one image.
const IMAGE: usize = 3 * 224 * 224;

/// `items` images, different for every item and every `seed`.
fn images(items: usize, seed: usize) -> Tensor {
    let data: Vec<u8> = (0..items * IMAGE)
        .flat_map(|i| (((i * 7 + seed * 13) % 251) as f32 / 251.0 - 0.5).to_le_bytes())
        .collect();
    Tensor::new(DataType::F32, vec![items, 3, 224, 224], Bytes::from(data)).unwrap()
}

/// The pieces' rows one after the other, then zero rows up to `items`.
fn assembled(pieces: &[Tensor], items: usize) -> Tensor {
    let mut data: Vec<u8> = pieces.iter().flat_map(|p| p.data().to_vec()).collect();
    data.resize(items * IMAGE * 4, 0);
    Tensor::new(DataType::F32, vec![items, 3, 224, 224], Bytes::from(data)).unwrap()
}

#[test]
fn a_large_batch_lands_in_order_and_padding_rows_are_zero() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../model_repository/efficientnet/1/model.onnx");
    let lib = sheaf_onnx::library::locate(None).expect("ONNX Runtime: run scripts/setup.sh");
    sheaf_onnx::init(&lib).unwrap();
    let bound = OnnxOptions {
        session_per_batch_size: true,
        io_binding: Some(true),
        ..OnnxOptions::default()
    };
    let mut staged = OnnxModel::load(&path, &bound).unwrap();
    let mut plain = OnnxModel::load(&path, &OnnxOptions::default()).unwrap();
    assert!(staged.stages_inputs());

    // 16 images (9.6 MB) in requests of 5, 1, 7 and 3: more than one thread copies them where
    // the machine has the cores.
    let full: Vec<Tensor> = [5, 1, 7, 3]
        .iter()
        .enumerate()
        .map(|(s, &n)| images(n, s))
        .collect();
    assert!(staged.stage(std::slice::from_ref(&full), 16).unwrap());
    let got = staged.infer_staged().unwrap();
    let want = plain.infer(&[assembled(&full, 16)]).unwrap();
    assert_eq!(got[0].shape(), [16, 1000]);
    assert_eq!(got[0].data(), want[0].data(), "the full batch");

    // 5 images in the same bucket of 16: rows 5..16 must be zero again, not the 16's images.
    let part = vec![images(2, 9), images(3, 10)];
    assert!(staged.stage(std::slice::from_ref(&part), 16).unwrap());
    let got = staged.infer_staged().unwrap();
    let want = plain.infer(&[assembled(&part, 16)]).unwrap();
    assert_eq!(
        got[0].data(),
        want[0].data(),
        "a smaller batch, padded with zeros"
    );
    // And the padding rows answer as a zero image does, not as an image of the batch before.
    let row = 1000 * 4;
    let stale = plain.infer(&[assembled(&full, 16)]).unwrap();
    assert_ne!(
        got[0].data()[5 * row..6 * row],
        stale[0].data()[5 * row..6 * row]
    );
}
