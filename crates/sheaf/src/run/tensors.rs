//! A job on a tensor model: its inputs come from NPY files, raw files or a folder of images,
//! a chunk of items at a time, and each chunk is one request to the model's batcher.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use sheaf_backend::{DataType, Signature, Tensor};
use sheaf_core::{ByteTensor, InferResponse, ModelHandle, ModelManager, NamedTensor, RawRequest};

use super::npy::NpyInput;
use super::strategy::{Stages, Task};

/// Where one model input's items come from.
pub enum Source {
    /// NPY or raw items, read a slice at a time.
    Tensor { name: String, file: NpyInput },
    /// Encoded images (sorted by file name), decoded by the model's `image_inputs` step.
    Images { name: String, files: Vec<PathBuf> },
    /// Encoded images (sorted by file name) sent as they are, one a BYTES element, to a model
    /// that decodes them itself (a pipeline's `image` step, a Python model): `[items, ...tail]`.
    Encoded {
        name: String,
        files: Vec<PathBuf>,
        tail: Vec<usize>,
    },
}

impl Source {
    /// Opens `path` for `input` of `handle`: a folder of images, an NPY file, or raw items of
    /// the input's type and item shape.
    pub fn open(
        handle: &ModelHandle,
        signature: &Signature,
        input: &str,
        path: &Path,
    ) -> anyhow::Result<Source> {
        let spec = signature
            .inputs
            .iter()
            .find(|s| s.name == input)
            .with_context(|| {
                let names: Vec<&str> = signature.inputs.iter().map(|s| s.name.as_str()).collect();
                format!(
                    "model '{}' has no input '{input}' (its inputs: {names:?})",
                    handle.name
                )
            })?;
        if path.is_dir() {
            let decoded = handle.config.image_inputs.contains_key(input);
            anyhow::ensure!(
                decoded || spec.dtype == DataType::Bytes,
                "{} is a folder of images, but model '{}' decodes no images into '{input}' (its \
                 config names no image_inputs.{input}, and the input is {}, not BYTES)",
                path.display(),
                handle.name,
                spec.dtype.as_str()
            );
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| is_image(p))
                .collect();
            files.sort();
            anyhow::ensure!(
                !files.is_empty(),
                "{} holds no JPEG, PNG or WebP files",
                path.display()
            );
            if decoded {
                return Ok(Source::Images {
                    name: input.to_string(),
                    files,
                });
            }
            // One image an item: the first dimension counts them, the others are 1 where open.
            let tail = spec
                .shape
                .iter()
                .skip(1)
                .map(|&d| usize::try_from(d).unwrap_or(1));
            let tail: Vec<usize> = tail.collect();
            anyhow::ensure!(
                tail.iter().all(|&d| d == 1) && spec.shape.first().is_none_or(|&d| d < 0),
                "{} is a folder of images, one an item, but input '{input}' of model '{}' has \
                 shape {:?}",
                path.display(),
                handle.name,
                spec.shape
            );
            return Ok(Source::Encoded {
                name: input.to_string(),
                files,
                tail,
            });
        }
        let batching = handle.max_batch_size > 0;
        let model_item: &[i64] = if batching {
            &spec.shape[1..]
        } else {
            &spec.shape
        };
        let file = if path.extension().is_some_and(|e| e == "npy") {
            let file = NpyInput::open(path)?;
            anyhow::ensure!(
                file.dtype == spec.dtype,
                "{} holds {} items; input '{input}' takes {}",
                path.display(),
                file.dtype.as_str(),
                spec.dtype.as_str()
            );
            file
        } else {
            let item: Option<Vec<usize>> = model_item
                .iter()
                .map(|&d| usize::try_from(d).ok())
                .collect();
            let item = item.with_context(|| {
                format!(
                    "{}: a raw file needs an item shape, and input '{input}' has dynamic \
                     dimensions {model_item:?}; save the items as NPY",
                    path.display()
                )
            })?;
            NpyInput::raw(path, spec.dtype, item)?
        };
        let fits = file.item_shape.len() == model_item.len()
            && file
                .item_shape
                .iter()
                .zip(model_item)
                .all(|(&have, &want)| want < 0 || have as i64 == want);
        anyhow::ensure!(
            fits,
            "{}: items of shape {:?} do not fit input '{input}' of model '{}' (an item: {model_item:?}, -1 any size)",
            path.display(),
            file.item_shape,
            handle.name
        );
        Ok(Source::Tensor {
            name: input.to_string(),
            file,
        })
    }

    /// Items in the source.
    pub fn items(&self) -> usize {
        match self {
            Source::Tensor { file, .. } => file.items,
            Source::Images { files, .. } | Source::Encoded { files, .. } => files.len(),
        }
    }

    /// The names of items, when they have their own (image files); else `None`.
    pub fn names(&self) -> Option<Vec<String>> {
        match self {
            Source::Images { files, .. } | Source::Encoded { files, .. } => Some(
                files
                    .iter()
                    .map(|f| {
                        f.file_stem()
                            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
                    })
                    .collect(),
            ),
            Source::Tensor { .. } => None,
        }
    }
}

/// The files' bytes, read on a thread that may block.
fn read_files(files: &[PathBuf]) -> anyhow::Result<Vec<Bytes>> {
    tokio::task::block_in_place(|| {
        files
            .iter()
            .map(|f| {
                std::fs::read(f)
                    .map(Bytes::from)
                    .with_context(|| format!("cannot read {}", f.display()))
            })
            .collect()
    })
}

fn is_image(path: &Path) -> bool {
    path.is_file()
        && path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
            matches!(
                e.to_ascii_lowercase().as_str(),
                "png" | "jpg" | "jpeg" | "webp"
            )
        })
}

/// A tensor job: items `first..total` of every source, `chunk` at a time.
pub struct TensorJob {
    pub manager: Arc<ModelManager>,
    pub handle: Arc<ModelHandle>,
    pub sources: Vec<Source>,
    pub first: usize,
    pub total: usize,
    pub chunk: usize,
    pub outputs: Option<Vec<String>>,
    pub classes: Option<usize>,
    /// The model's first output, which `classes` names when `outputs` does not.
    pub first_output: Option<String>,
}

impl TensorJob {
    /// The items of chunk `k`: its first item and count.
    pub fn span(&self, k: usize) -> (usize, usize) {
        let start = self.first + k * self.chunk;
        (start, self.chunk.min(self.total - start))
    }

    /// Chunks left to run.
    pub fn chunks(&self) -> usize {
        (self.total - self.first).div_ceil(self.chunk.max(1))
    }

    async fn request(&self, k: usize) -> anyhow::Result<RawRequest> {
        let (start, count) = self.span(k);
        let batching = self.handle.max_batch_size > 0;
        let mut raw = RawRequest {
            outputs: self.outputs.clone(),
            ..RawRequest::default()
        };
        for source in &self.sources {
            match source {
                Source::Tensor { name, file } => {
                    let data = tokio::task::block_in_place(|| file.read(start, count))?;
                    let mut shape = file.item_shape.clone();
                    if batching {
                        shape.insert(0, count);
                    }
                    raw.inputs.push(NamedTensor {
                        name: name.clone(),
                        tensor: Tensor::new(file.dtype, shape, Bytes::from(data))?,
                    });
                }
                Source::Images { name, files } => {
                    let items = read_files(&files[start..start + count])?;
                    // Decoded here, in the load stage, so that it overlaps the model's compute.
                    let images = ByteTensor {
                        name: name.clone(),
                        shape: vec![count],
                        items,
                    };
                    let decoded = self.handle.decode_images(vec![images]).await.map_err(|e| {
                        anyhow::anyhow!("items {start}..{}: {}", start + count, e.message)
                    })?;
                    raw.inputs.extend(decoded);
                }
                Source::Encoded { name, files, tail } => {
                    let items = read_files(&files[start..start + count])?;
                    raw.byte_inputs.push(ByteTensor {
                        name: name.clone(),
                        shape: std::iter::once(count).chain(tail.iter().copied()).collect(),
                        items,
                    });
                }
            }
        }
        if let Some(k) = self.classes {
            let named = self
                .outputs
                .clone()
                .unwrap_or_else(|| self.first_output.iter().cloned().collect());
            raw.classification = named.into_iter().map(|n| (n, k)).collect();
        }
        Ok(raw)
    }
}

impl Stages for TensorJob {
    type Input = (usize, RawRequest);
    type Output = InferResponse;

    fn load(&self, k: usize) -> Task<'_, Option<Self::Input>> {
        Box::pin(async move { Ok(Some((k, self.request(k).await?))) })
    }

    fn compute(&self, (k, raw): Self::Input) -> Task<'_, InferResponse> {
        Box::pin(async move {
            let (start, count) = self.span(k);
            self.manager
                .infer(&self.handle, raw)
                .await
                .map_err(|e| anyhow::anyhow!("items {start}..{}: {}", start + count, e.message))
        })
    }
}
