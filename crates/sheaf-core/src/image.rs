//! Images at the edge of a model, so that clients send and receive images rather than float
//! tensors.
//!
//! - An input named in the model's `image_inputs` takes encoded images (JPEG, PNG, WebP) as a
//!   BYTES tensor, one image per item. Each is decoded, its shorter side scaled (bilinear, with
//!   the `image` crate), centre-cropped, put in the model's channel order, scaled and
//!   normalised, and laid out channels first or last. The images of a request are decoded side
//!   by side on blocking threads, before the request joins the model's queue, so the execution
//!   threads only ever see float tensors.
//! - An output named in `image_outputs` goes back as encoded images (PNG or JPEG), one per item.
//! - Triton's classification extension: an output asked for with `classification: K` goes back
//!   as the K best classes of each item, as `score:index:label` strings, named from the model's
//!   `labels.txt`.

use std::io::Cursor;

use bytes::Bytes;
use image::imageops::FilterType;
use image::{ImageFormat, ImageReader, Limits, RgbImage};
use sheaf_backend::{DataType, Tensor, TensorSpec};

use crate::config::{ColorOrder, ImageFormatConfig, ImageInputConfig, ImageOutputConfig, Layout};
use crate::request::{ByteTensor, NamedTensor};
use crate::InferError;

/// The largest image sheaf decodes, per side, and the most memory one decode may take: an image
/// that declares more is refused before its pixels are allocated.
const MAX_SIDE: u32 = 16_384;
const MAX_DECODE_BYTES: u64 = 512 << 20;

/// Decodes the images of `input` into the tensor the model input `spec` takes.
pub(crate) async fn decode_input(
    input: ByteTensor,
    config: &ImageInputConfig,
    spec: &TensorSpec,
) -> Result<NamedTensor, InferError> {
    let (height, width) = target_size(config, spec).ok_or_else(|| {
        InferError::invalid(format!(
            "input '{}': the model's shape {:?} does not fix the image size; give \
             image_inputs.{}.crop in the model's config",
            spec.name, spec.shape, spec.name
        ))
    })?;
    let count = input.items.len();
    let tasks: Vec<_> = input
        .items
        .into_iter()
        .map(|item| {
            let config = config.clone();
            tokio::task::spawn_blocking(move || pixels(&item, &config, height, width))
        })
        .collect();
    let mut data = Vec::with_capacity(count * 3 * (height * width) as usize * 4);
    for (i, task) in futures::future::join_all(tasks)
        .await
        .into_iter()
        .enumerate()
    {
        let values = task
            .map_err(|e| InferError::internal(format!("image decoding stopped: {e}")))?
            .map_err(|e| InferError::invalid(format!("input '{}': image {i}: {e}", input.name)))?;
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
    }
    let (h, w) = (height as usize, width as usize);
    let mut shape = match config.layout {
        Layout::Nchw => vec![count, 3, h, w],
        Layout::Nhwc => vec![count, h, w, 3],
    };
    // A model without a batch dimension takes one image, as the model declares it.
    if spec.shape.len() == 3 && count == 1 {
        shape.remove(0);
    }
    let tensor = Tensor::new(DataType::F32, shape, Bytes::from(data)).map_err(InferError::from)?;
    Ok(NamedTensor {
        name: input.name,
        tensor,
    })
}

/// One encoded image's values for the model input `spec`, decoded on the calling thread (for
/// images read at load, such as a frame store's).
pub(crate) fn decode_one(
    encoded: &[u8],
    config: &ImageInputConfig,
    spec: &TensorSpec,
) -> Result<(Vec<f32>, Vec<usize>), String> {
    let (height, width) = target_size(config, spec)
        .ok_or_else(|| "the model's shape does not fix the image size; give a crop".to_string())?;
    let (h, w) = (height as usize, width as usize);
    let shape = match config.layout {
        Layout::Nchw => vec![3, h, w],
        Layout::Nhwc => vec![h, w, 3],
    };
    Ok((pixels(encoded, config, height, width)?, shape))
}

/// The height and width images are cropped to: the configured crop, or the model's own.
fn target_size(config: &ImageInputConfig, spec: &TensorSpec) -> Option<(u32, u32)> {
    match config.crop.as_slice() {
        [side] => return Some((*side, *side)),
        [h, w] => return Some((*h, *w)),
        _ => {}
    }
    let dims = &spec.shape[spec.shape.len().checked_sub(3)?..];
    let (h, w) = match config.layout {
        Layout::Nchw => (dims[1], dims[2]),
        Layout::Nhwc => (dims[0], dims[1]),
    };
    Some((u32::try_from(h).ok()?, u32::try_from(w).ok()?))
}

/// One image's values, in the model's layout: decoded, resized, cropped and normalised.
fn pixels(
    encoded: &[u8],
    config: &ImageInputConfig,
    height: u32,
    width: u32,
) -> Result<Vec<f32>, String> {
    let mut reader = ImageReader::new(Cursor::new(encoded))
        .with_guessed_format()
        .map_err(|e| format!("unreadable: {e}"))?;
    if reader.format().is_none() {
        return Err("not an image sheaf decodes (JPEG, PNG or WebP)".into());
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let image = reader
        .decode()
        .map_err(|e| format!("cannot be decoded: {e}"))?
        .to_rgb8();
    let (w, h) = image.dimensions();
    if w == 0 || h == 0 {
        return Err("the image is empty".into());
    }
    // The shorter side to `resize`, the longer in proportion (truncated, as torchvision does).
    let short = config.resize.unwrap_or(height.max(width));
    let (nw, nh) = if w <= h {
        (
            short,
            (u64::from(h) * u64::from(short) / u64::from(w)) as u32,
        )
    } else {
        (
            (u64::from(w) * u64::from(short) / u64::from(h)) as u32,
            short,
        )
    };
    if nw < width || nh < height {
        return Err(format!(
            "resized to {nw}x{nh}, it is smaller than the {width}x{height} crop"
        ));
    }
    let resized = if (nw, nh) == (w, h) {
        image
    } else {
        image::imageops::resize(&image, nw, nh, FilterType::Triangle)
    };
    let x0 = ((nw - width) as f32 / 2.0).round() as u32;
    let y0 = ((nh - height) as f32 / 2.0).round() as u32;
    let crop: RgbImage = image::imageops::crop_imm(&resized, x0, y0, width, height).to_image();
    let order: [usize; 3] = match config.color {
        ColorOrder::Rgb => [0, 1, 2],
        ColorOrder::Bgr => [2, 1, 0],
    };
    let plane = (width * height) as usize;
    let mut out = vec![0f32; plane * 3];
    for (i, pixel) in crop.pixels().enumerate() {
        for (c, &from) in order.iter().enumerate() {
            let v = (f32::from(pixel.0[from]) * config.scale - config.mean[c]) / config.std[c];
            match config.layout {
                Layout::Nchw => out[c * plane + i] = v,
                Layout::Nhwc => out[i * 3 + c] = v,
            }
        }
    }
    Ok(out)
}

/// The items of the float output `tensor` as encoded images.
pub(crate) async fn encode_output(
    name: &str,
    tensor: &Tensor,
    config: &ImageOutputConfig,
) -> Result<ByteTensor, InferError> {
    let values = floats(name, tensor)?;
    let shape = tensor.shape();
    let (count, dims) = match shape.len() {
        4 => (shape[0], &shape[1..]),
        3 => (1, shape),
        _ => {
            return Err(InferError::internal(format!(
                "output '{name}' has shape {shape:?}; image_outputs needs [batch, 3, H, W] or \
                 [batch, H, W, 3]"
            )))
        }
    };
    let (c, h, w) = match config.layout {
        Layout::Nchw => (dims[0], dims[1], dims[2]),
        Layout::Nhwc => (dims[2], dims[0], dims[1]),
    };
    if c != 3 {
        return Err(InferError::internal(format!(
            "output '{name}' has {c} channels; image_outputs encodes 3"
        )));
    }
    let per = c * h * w;
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let item = values[i * per..(i + 1) * per].to_vec();
            let config = config.clone();
            tokio::task::spawn_blocking(move || encode_one(&item, &config, h, w))
        })
        .collect();
    let mut items = Vec::with_capacity(count);
    for task in futures::future::join_all(tasks).await {
        let encoded = task
            .map_err(|e| InferError::internal(format!("image encoding stopped: {e}")))?
            .map_err(|e| InferError::internal(format!("output '{name}': {e}")))?;
        items.push(Bytes::from(encoded));
    }
    Ok(ByteTensor {
        name: name.to_string(),
        shape: if shape.len() == 4 {
            vec![count]
        } else {
            vec![1]
        },
        items,
    })
}

fn encode_one(
    values: &[f32],
    config: &ImageOutputConfig,
    h: usize,
    w: usize,
) -> Result<Vec<u8>, String> {
    let [lo, hi] = config.range;
    let plane = h * w;
    let order: [usize; 3] = match config.color {
        ColorOrder::Rgb => [0, 1, 2],
        ColorOrder::Bgr => [2, 1, 0],
    };
    let mut rgb = vec![0u8; plane * 3];
    for i in 0..plane {
        for (c, &to) in order.iter().enumerate() {
            let v = match config.layout {
                Layout::Nchw => values[c * plane + i],
                Layout::Nhwc => values[i * 3 + c],
            };
            rgb[i * 3 + to] = (((v - lo) / (hi - lo)).clamp(0.0, 1.0) * 255.0).round() as u8;
        }
    }
    let image = RgbImage::from_raw(w as u32, h as u32, rgb)
        .ok_or_else(|| "the pixels do not fill the image".to_string())?;
    let mut out = Cursor::new(Vec::new());
    match config.format {
        ImageFormatConfig::Png => image.write_to(&mut out, ImageFormat::Png),
        ImageFormatConfig::Jpeg => {
            let encoder =
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, config.quality);
            image.write_with_encoder(encoder)
        }
    }
    .map_err(|e| format!("cannot encode: {e}"))?;
    Ok(out.into_inner())
}

/// The `k` best classes of each item of the float output `tensor`, best first, as Triton's
/// classification extension gives them: `score:index:label` (or `score:index` without a label).
pub(crate) fn classify(
    name: &str,
    tensor: &Tensor,
    k: usize,
    labels: Option<&[String]>,
) -> Result<ByteTensor, InferError> {
    let values = floats(name, tensor)?;
    let shape = tensor.shape();
    let (count, classes) = match shape {
        [n, c] => (*n, *c),
        [c] => (1, *c),
        _ => {
            return Err(InferError::invalid(format!(
                "output '{name}' has shape {shape:?}; classification needs [batch, classes]"
            )))
        }
    };
    if k == 0 {
        return Err(InferError::invalid(format!(
            "output '{name}': classification needs a count of at least 1"
        )));
    }
    let k = k.min(classes);
    let mut items = Vec::with_capacity(count * k);
    for row in values.chunks(classes.max(1)).take(count) {
        let mut order: Vec<usize> = (0..classes).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &i in &order[..k] {
            let text = match labels.and_then(|l| l.get(i)) {
                Some(label) => format!("{:.6}:{i}:{label}", row[i]),
                None => format!("{:.6}:{i}", row[i]),
            };
            items.push(Bytes::from(text));
        }
    }
    Ok(ByteTensor {
        name: name.to_string(),
        shape: if shape.len() == 2 {
            vec![count, k]
        } else {
            vec![k]
        },
        items,
    })
}

/// A float output's values as f32.
fn floats(name: &str, tensor: &Tensor) -> Result<Vec<f32>, InferError> {
    let data = tensor.data();
    match tensor.dtype() {
        DataType::F32 => Ok(data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        DataType::F16 => Ok(data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()),
        other => Err(InferError::invalid(format!(
            "output '{name}' is {other}; images and classes come from FP32 or FP16 outputs"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32, f: impl Fn(u32, u32) -> [u8; 3]) -> Bytes {
        let image = RgbImage::from_fn(w, h, |x, y| image::Rgb(f(x, y)));
        let mut out = Cursor::new(Vec::new());
        image.write_to(&mut out, ImageFormat::Png).unwrap();
        Bytes::from(out.into_inner())
    }

    fn spec(shape: Vec<i64>) -> TensorSpec {
        TensorSpec {
            name: "x".into(),
            dtype: DataType::F32,
            shape,
        }
    }

    #[tokio::test]
    async fn images_become_normalised_tensors_in_the_models_layout() {
        // Left half red, right half blue, 8x4: resized to 4 high (the crop's side), cropped
        // to the middle 4x4.
        let image = png(8, 4, |x, _| if x < 4 { [255, 0, 0] } else { [0, 0, 255] });
        let input = ByteTensor {
            name: "x".into(),
            shape: vec![2],
            items: vec![image.clone(), image],
        };
        let config = ImageInputConfig {
            crop: vec![4],
            color: ColorOrder::Bgr,
            mean: [0.5; 3],
            std: [0.5; 3],
            ..ImageInputConfig::default()
        };
        let out = decode_input(input.clone(), &config, &spec(vec![-1, 3, -1, -1]))
            .await
            .unwrap();
        assert_eq!(out.tensor.shape(), [2, 3, 4, 4]);
        let v = floats("x", &out.tensor).unwrap();
        // Channel 0 is blue (BGR): -1 on the red left, 1 on the blue right; red the opposite.
        assert_eq!((v[0], v[3]), (-1.0, 1.0));
        assert_eq!((v[32], v[35]), (1.0, -1.0));
        let nhwc = ImageInputConfig {
            layout: Layout::Nhwc,
            ..config
        };
        let out = decode_input(input, &nhwc, &spec(vec![-1, 4, 4, 3]))
            .await
            .unwrap();
        assert_eq!(out.tensor.shape(), [2, 4, 4, 3]);
        assert_eq!(&floats("x", &out.tensor).unwrap()[..3], [-1.0, -1.0, 1.0]);
    }

    #[tokio::test]
    async fn bad_images_are_named_by_item() {
        let good = png(4, 4, |_, _| [9, 9, 9]);
        let mut corrupt = good.to_vec();
        corrupt.truncate(30);
        for (items, resize, says) in [
            (
                vec![good.clone(), Bytes::from(corrupt)],
                None,
                "image 1: cannot be decoded",
            ),
            (
                vec![Bytes::from_static(b"hello")],
                None,
                "image 0: not an image",
            ),
            (vec![good], Some(4), "smaller than the 8x8 crop"),
        ] {
            let input = ByteTensor {
                name: "x".into(),
                shape: vec![items.len()],
                items,
            };
            let config = ImageInputConfig {
                crop: vec![8],
                resize,
                ..ImageInputConfig::default()
            };
            let e = decode_input(input, &config, &spec(vec![-1, 3, 8, 8]))
                .await
                .unwrap_err();
            assert!(e.message.contains(says), "{e}");
        }
    }

    #[tokio::test]
    async fn outputs_become_pngs_and_classes() {
        // Two 2x2 images in [-1, 1]: all -1 (black) and all 1 (white).
        let values: Vec<f32> = [vec![-1.0f32; 12], vec![1.0f32; 12]].concat();
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new(DataType::F32, vec![2, 3, 2, 2], Bytes::from(data)).unwrap();
        let config = ImageOutputConfig {
            range: [-1.0, 1.0],
            ..ImageOutputConfig::default()
        };
        let out = encode_output("y", &t, &config).await.unwrap();
        assert_eq!(out.shape, [2]);
        let white = image::load_from_memory(&out.items[1]).unwrap().to_rgb8();
        assert_eq!(white.get_pixel(1, 1).0, [255, 255, 255]);
        let black = image::load_from_memory(&out.items[0]).unwrap().to_rgb8();
        assert_eq!(black.get_pixel(0, 0).0, [0, 0, 0]);

        let logits: Vec<u8> = [0.1f32, 3.0, -2.0, 0.5, 0.2, 0.3]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = Tensor::new(DataType::F32, vec![2, 3], Bytes::from(logits)).unwrap();
        let labels = ["a".to_string(), "b".into(), "c".into()];
        let top = classify("y", &t, 2, Some(&labels)).unwrap();
        assert_eq!(top.shape, [2, 2]);
        let text: Vec<&str> = top
            .items
            .iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .collect();
        assert_eq!(
            text,
            [
                "3.000000:1:b",
                "0.100000:0:a",
                "0.500000:0:a",
                "0.300000:2:c"
            ]
        );
        let unnamed = classify("y", &t, 9, None).unwrap();
        assert_eq!(unnamed.shape, [2, 3]);
        assert_eq!(&unnamed.items[0][..], b"3.000000:1");
        assert!(classify("y", &t, 0, None).is_err());
    }
}
