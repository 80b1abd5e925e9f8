//! The image sections of a model's configuration: `frames` (frames a request may name by id),
//! `image_inputs` (encoded images decoded for an input) and `image_outputs` (an output encoded as
//! images).

use serde::Deserialize;

/// The `frames` section: a store of frames for one input, loaded with the model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FramesConfig {
    /// The model input the frames feed.
    pub input: String,
    /// A float32 NPY file `[frames, ...]`, a raw little-endian float32 file (frames of the
    /// input's shape), or a folder of images (decoded as `image_inputs.<input>` says, in file
    /// name order); relative to the version folder or the model folder.
    pub source: String,
}

/// How an encoded image becomes a model input (see `crate::image`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageInputConfig {
    /// The shorter side is scaled to this many pixels (bilinear) before the crop. Absent: to
    /// the crop's longer side.
    pub resize: Option<u32>,
    /// The centre crop, `[height, width]` (or `[side]`). Absent: the model input's own height
    /// and width.
    pub crop: Vec<u32>,
    /// Channel order the model takes.
    pub color: ColorOrder,
    /// Pixel values (0 to 255) are multiplied by `scale`, then `(x - mean) / std` per channel
    /// (in the model's channel order).
    pub scale: f32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Where the channels go: `nchw` (channels first) or `nhwc`.
    pub layout: Layout,
}

impl Default for ImageInputConfig {
    fn default() -> Self {
        ImageInputConfig {
            resize: None,
            crop: Vec::new(),
            color: ColorOrder::Rgb,
            scale: 1.0 / 255.0,
            mean: [0.0; 3],
            std: [1.0; 3],
            layout: Layout::Nchw,
        }
    }
}

/// How a float output becomes encoded images, one per item.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageOutputConfig {
    /// The values that become 0 and 255 (clamped between).
    pub range: [f32; 2],
    /// `png` or `jpeg`.
    pub format: ImageFormatConfig,
    /// JPEG quality, 1 to 100.
    pub quality: u8,
    pub color: ColorOrder,
    pub layout: Layout,
}

impl Default for ImageOutputConfig {
    fn default() -> Self {
        ImageOutputConfig {
            range: [0.0, 1.0],
            format: ImageFormatConfig::Png,
            quality: 90,
            color: ColorOrder::Rgb,
            layout: Layout::Nchw,
        }
    }
}

/// Channel order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ColorOrder {
    #[default]
    Rgb,
    Bgr,
}

/// Tensor layout of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    #[default]
    Nchw,
    Nhwc,
}

/// Encoded image formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ImageFormatConfig {
    #[default]
    Png,
    Jpeg,
}
