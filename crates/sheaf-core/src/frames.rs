//! A store of frames a model holds, so that requests name frames by id instead of sending them:
//! a lip-sync client sends `frame_ids: [100, 101, 102]` for the frames of a clip the server
//! already has.
//!
//! The `frames` section of a model's config names the input the frames feed and their source:
//! a float32 NPY file `[frames, ...]`, a raw little-endian float32 file, or a folder of images
//! (decoded, resized and normalised as the input's `image_inputs` says). They are read once, at
//! load. A request then sends a `frame_ids` input (INT64 or INT32) in place of the frames' input;
//! the frames are gathered into that input's tensor before the request joins the queue, and the
//! response carries a `frame_ids` output (INT64) beside the model's outputs, so that each item is
//! tied to its frame.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use sheaf_backend::{DataType, Signature, Tensor, TensorSpec};

use crate::config::{FramesConfig, ImageInputConfig};
use crate::request::NamedTensor;
use crate::InferError;

/// The input (and output) that names frames by id.
pub const FRAME_IDS: &str = "frame_ids";

/// The frames of one model input, as float32.
#[derive(Debug)]
pub struct FrameStore {
    input: String,
    /// One frame's shape.
    item_shape: Vec<usize>,
    /// Whether the model's tensors start with a batch dimension.
    batched: bool,
    frames: Bytes,
    count: usize,
}

impl FrameStore {
    /// Reads the frames of `config`, found beside `model_file` or in the model folder above it.
    pub fn load(
        model_file: &Path,
        config: &FramesConfig,
        signature: &Signature,
        images: Option<&ImageInputConfig>,
        batched: bool,
    ) -> Result<FrameStore, String> {
        let spec = signature
            .inputs
            .iter()
            .find(|s| s.name == config.input)
            .ok_or_else(|| format!("frames.input: the model has no input '{}'", config.input))?;
        if spec.dtype != DataType::F32 {
            return Err(format!(
                "frames.input: '{}' is {}, and frames are float32",
                spec.name, spec.dtype
            ));
        }
        let source = locate(model_file, &config.source)
            .ok_or_else(|| format!("frames.source: '{}' is not there", config.source))?;
        let (values, item_shape) = if source.is_dir() {
            let images = images.ok_or_else(|| {
                format!(
                    "frames.source is a folder of images: give image_inputs.{} to say how to \
                     decode them",
                    spec.name
                )
            })?;
            read_images(&source, images, spec)?
        } else if source.extension().is_some_and(|e| e == "npy") {
            read_npy(&source)?
        } else {
            read_raw(&source, spec, batched)?
        };
        let item: usize = item_shape.iter().product();
        let count = values.len().checked_div(item).unwrap_or(0);
        check_shape(spec, &item_shape, batched)?;
        let frames = Bytes::from(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        tracing::info!(
            input = %spec.name,
            source = %source.display(),
            frames = count,
            frame_shape = ?item_shape,
            "frame store loaded"
        );
        Ok(FrameStore {
            input: spec.name.clone(),
            item_shape,
            batched,
            frames,
            count,
        })
    }

    /// Bytes the frames hold.
    pub fn bytes(&self) -> u64 {
        self.frames.len() as u64
    }

    /// The frames `ids` names, as the tensor of the store's input, and the ids in order.
    pub fn gather(&self, ids: &Tensor) -> Result<(NamedTensor, Vec<i64>), InferError> {
        let data = ids.data();
        let ids: Vec<i64> = match ids.dtype() {
            DataType::I64 => data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
            DataType::I32 => data
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            other => {
                return Err(InferError::invalid(format!(
                    "input '{FRAME_IDS}' is {other}; frame ids are INT64 or INT32"
                )))
            }
        };
        if ids.is_empty() {
            return Err(InferError::invalid(format!(
                "input '{FRAME_IDS}' names no frame"
            )));
        }
        if !self.batched && ids.len() != 1 {
            return Err(InferError::invalid(format!(
                "input '{FRAME_IDS}' names {} frames; this model takes one at a time",
                ids.len()
            )));
        }
        let item_bytes = self.item_shape.iter().product::<usize>() * 4;
        let mut out = Vec::with_capacity(ids.len() * item_bytes);
        for &id in &ids {
            let index = usize::try_from(id)
                .ok()
                .filter(|&i| i < self.count)
                .ok_or_else(|| {
                    InferError::invalid(format!(
                        "frame {id} is not in the store (frames 0 to {})",
                        self.count.saturating_sub(1)
                    ))
                })?;
            out.extend_from_slice(&self.frames[index * item_bytes..(index + 1) * item_bytes]);
        }
        let mut shape = self.item_shape.clone();
        if self.batched {
            shape.insert(0, ids.len());
        }
        let tensor = Tensor::new(DataType::F32, shape, Bytes::from(out))?;
        Ok((
            NamedTensor {
                name: self.input.clone(),
                tensor,
            },
            ids,
        ))
    }
}

/// `source` in the version folder of `model_file`, else in the model folder.
fn locate(model_file: &Path, source: &str) -> Option<PathBuf> {
    let version = model_file.parent()?;
    [Some(version), version.parent()]
        .into_iter()
        .flatten()
        .map(|dir| dir.join(source))
        .find(|p| p.exists())
}

fn read_images(
    folder: &Path,
    config: &ImageInputConfig,
    spec: &TensorSpec,
) -> Result<(Vec<f32>, Vec<usize>), String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| format!("frames.source: {e}"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut values = Vec::new();
    let mut shape = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let (v, s) = crate::image::decode_one(&bytes, config, spec)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        values.extend(v);
        shape = s;
    }
    if files.is_empty() {
        return Err(format!(
            "frames.source: {} holds no images",
            folder.display()
        ));
    }
    Ok((values, shape))
}

fn read_npy(file: &Path) -> Result<(Vec<f32>, Vec<usize>), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| format!("{}: {e}", file.display()))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    if shape.is_empty() {
        return Err(format!(
            "{}: a frame store needs [frames, ...]",
            file.display()
        ));
    }
    let values = npy
        .into_vec::<f32>()
        .map_err(|e| format!("{}: frames must be float32 ({e})", file.display()))?;
    Ok((values, shape[1..].to_vec()))
}

fn read_raw(
    file: &Path,
    spec: &TensorSpec,
    batched: bool,
) -> Result<(Vec<f32>, Vec<usize>), String> {
    let item: Vec<usize> = spec.shape[usize::from(batched)..]
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!(
                "frames.source: a raw file needs the input's frame shape fixed, and '{}' is {:?}; \
                 use an NPY file",
                spec.name, spec.shape
            )
        })?;
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let frame_bytes = item.iter().product::<usize>() * 4;
    if frame_bytes == 0 || bytes.len() % frame_bytes != 0 {
        return Err(format!(
            "{}: {} bytes are not a whole number of {frame_bytes}-byte frames",
            file.display(),
            bytes.len()
        ));
    }
    let values = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((values, item))
}

/// A frame's shape must be the input's, past its batch dimension (where fixed).
fn check_shape(spec: &TensorSpec, item: &[usize], batched: bool) -> Result<(), String> {
    let model = &spec.shape[usize::from(batched).min(spec.shape.len())..];
    let agree = model.len() == item.len()
        && model
            .iter()
            .zip(item)
            .all(|(&m, &i)| m < 0 || m as usize == i);
    if agree {
        Ok(())
    } else {
        Err(format!(
            "frames are {item:?} each, but input '{}' takes {model:?}",
            spec.name
        ))
    }
}
