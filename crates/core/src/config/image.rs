//! `[image]` and `[output.NAME]`: how a vision model's encoded pictures become its input tensor, and how its
//! outputs become labels or boxes.

use std::path::PathBuf;

use serde::Deserialize;

/// Largest picture decoded by default, in pixels (width × height), checked from the file's header before any pixel
/// is decoded: 40 megapixels, a 7,300 × 5,500 photo.
pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;

/// Largest `width`, `height`, `shorter_side` and `max_side` accepted.
pub const MAX_IMAGE_SIDE: u32 = 16_384;

/// `[image]`: a model that takes pictures. Every field but `input` has a default; see the README's vision section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// The input that takes the picture; default: the model's only input.
    pub input: Option<String>,
    /// The input's layout: `nchw` (channels first, the default) or `nhwc`.
    #[serde(default)]
    pub layout: Layout,
    /// The tensor's width and height; default: the input's own fixed dimensions.
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// How the picture becomes `width` × `height`.
    #[serde(default)]
    pub resize: Resize,
    /// `resize = "crop"`: the shorter side is first resized to this (224 / 256 for ImageNet models); default: the
    /// crop's longer side.
    pub shorter_side: Option<u32>,
    /// `resize = "crop"`: how the longer side's resized length is rounded.
    #[serde(default)]
    pub rounding: Rounding,
    /// `resize = "letterbox"`: where the resized picture sits in the padded tensor.
    #[serde(default)]
    pub anchor: Anchor,
    /// `resize = "letterbox"` and `"multiple"`: the value of padded pixels, in every channel, before scaling.
    #[serde(default = "default_pad_value")]
    pub pad_value: u8,
    /// `resize = "multiple"`: each side is rounded to a multiple of this.
    pub multiple_of: Option<u32>,
    /// `resize = "multiple"`: a picture whose longer side is longer is first scaled down to it.
    pub max_side: Option<u32>,
    #[serde(default)]
    pub filter: Filter,
    #[serde(default)]
    pub channels: Channels,
    /// Each 0–255 value is multiplied by `scale`, less `mean`, divided by `std` (per channel, in `channels`'
    /// order; one value applies to all). Floating-point inputs only: a UINT8 input takes the pixels as they are.
    #[serde(default = "default_scale")]
    pub scale: f32,
    #[serde(default = "zero")]
    pub mean: Vec<f32>,
    #[serde(default = "one")]
    pub std: Vec<f32>,
    /// Largest picture taken, in pixels, checked from the file's header before decoding.
    #[serde(default = "default_max_pixels")]
    pub max_pixels: u64,
}

fn default_pad_value() -> u8 {
    114
}

fn default_scale() -> f32 {
    1.0 / 255.0
}

fn zero() -> Vec<f32> {
    vec![0.0]
}

fn one() -> Vec<f32> {
    vec![1.0]
}

fn default_max_pixels() -> u64 {
    DEFAULT_MAX_PIXELS
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    #[default]
    Nchw,
    Nhwc,
}

/// How a picture becomes the tensor's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resize {
    /// To `width` × `height`, whatever its aspect ratio.
    #[default]
    Stretch,
    /// Scaled to fit inside `width` × `height` keeping its aspect ratio, the rest padded with `pad_value`
    /// (YOLO-style detectors).
    Letterbox,
    /// The shorter side to `shorter_side`, keeping the aspect ratio (the longer side rounded to the nearest pixel),
    /// then the centre `width` × `height` cut out, its offsets rounded down (ImageNet classifiers).
    Crop,
    /// Its own size (at most `max_side`), each side then resized to a multiple of `multiple_of`: models with
    /// dynamic height and width (text detectors).
    Multiple,
}

/// How a resized side's length is rounded to whole pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rounding {
    /// To the nearest (torchvision, timm).
    #[default]
    Nearest,
    /// Down (transformers' image processors).
    Down,
}

/// `resize = "letterbox"`: where the picture sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Anchor {
    /// Centred, the padding split between both sides (Ultralytics' YOLO).
    #[default]
    Center,
    /// At the top left, the padding at the right and the bottom.
    TopLeft,
}

/// The resampling filter (with antialiasing when shrinking, as Pillow does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Filter {
    Nearest,
    #[default]
    Bilinear,
    Bicubic,
    Lanczos3,
}

/// The channels the model takes, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channels {
    #[default]
    Rgb,
    Bgr,
    /// One channel: luma (ITU-R 601, as Pillow's `L`).
    Grey,
}

impl Channels {
    pub fn count(self) -> usize {
        match self {
            Channels::Rgb | Channels::Bgr => 3,
            Channels::Grey => 1,
        }
    }
}

/// `[output.NAME]`: what an output's values mean, and how they are answered.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    pub kind: OutputKind,
    /// Class names by index: a list, or a text file with one name a line (resolved against the model's folder).
    pub labels: Option<Labels>,
    /// `classification`: the best `top_k` classes of each picture.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// `classification`: turn scores into probabilities; default: when they are not already (any outside 0–1, or
    /// a row not summing to 1).
    pub softmax: Option<bool>,
    /// `detection`: the least class score kept.
    #[serde(default = "default_confidence")]
    pub confidence: f32,
    /// `detection`: a box overlapping a better one of its class by more than this (intersection over union) is
    /// dropped.
    #[serde(default = "default_iou")]
    pub iou: f32,
    /// `detection`: the most boxes answered per picture, best first.
    #[serde(default = "default_max_detections")]
    pub max_detections: usize,
}

fn default_top_k() -> usize {
    5
}

fn default_confidence() -> f32 {
    0.25
}

fn default_iou() -> f32 {
    0.45
}

fn default_max_detections() -> usize {
    300
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// Scores (or logits) per class, `[batch, classes]`: answered as the top-k labels.
    Classification,
    /// A YOLO-style head, `[batch, 4 + classes, anchors]` (or `[batch, anchors, 4 + classes]`): per anchor a box
    /// (centre x, centre y, width, height, in the tensor's pixels) and a score per class; answered as boxes in the
    /// original picture's pixels after non-maximum suppression per class.
    Detection,
    /// The tensor as it is.
    Raw,
}

/// Class names, inline or in a file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Labels {
    Names(Vec<String>),
    File(PathBuf),
}

impl ImageConfig {
    /// What is wrong with these settings, if anything (the model's input is checked when it is loaded).
    pub fn validate(&self) -> Result<(), String> {
        let sides = [
            ("width", self.width),
            ("height", self.height),
            ("shorter_side", self.shorter_side),
            ("max_side", self.max_side),
            ("multiple_of", self.multiple_of),
        ];
        for (field, side) in sides {
            if side.is_some_and(|s| s == 0 || s > MAX_IMAGE_SIDE) {
                return Err(format!("image.{field}: must be between 1 and {MAX_IMAGE_SIDE}"));
            }
        }
        let only = |field: &str, set: bool, mode: &str| {
            if set {
                Err(format!("image.{field}: only applies with resize = \"{mode}\""))
            } else {
                Ok(())
            }
        };
        only("shorter_side", self.shorter_side.is_some() && self.resize != Resize::Crop, "crop")?;
        only("rounding", self.rounding != Rounding::Nearest && self.resize != Resize::Crop, "crop")?;
        only("anchor", self.anchor != Anchor::Center && self.resize != Resize::Letterbox, "letterbox")?;
        only("multiple_of", self.multiple_of.is_some() && self.resize != Resize::Multiple, "multiple")?;
        only("max_side", self.max_side.is_some() && self.resize != Resize::Multiple, "multiple")?;
        if self.resize == Resize::Multiple && (self.width.is_some() || self.height.is_some()) {
            return Err("image.width, image.height: resize = \"multiple\" keeps each picture's own size".into());
        }
        let channels = self.channels.count();
        for (field, values) in [("mean", &self.mean), ("std", &self.std)] {
            if values.len() != 1 && values.len() != channels {
                return Err(format!("image.{field}: one value, or one per channel ({channels})"));
            }
            if values.iter().any(|v| !v.is_finite()) {
                return Err(format!("image.{field}: finite numbers only"));
            }
        }
        if self.std.contains(&0.0) {
            return Err("image.std: must not be 0".into());
        }
        if !self.scale.is_finite() || self.scale == 0.0 {
            return Err("image.scale: a finite number other than 0".into());
        }
        if self.max_pixels == 0 {
            return Err("image.max_pixels: must be at least 1".into());
        }
        Ok(())
    }

    /// `mean` and `std` for channel `c`.
    pub fn mean_std(&self, c: usize) -> (f32, f32) {
        let pick = |v: &[f32]| if v.len() == 1 { v[0] } else { v[c] };
        (pick(&self.mean), pick(&self.std))
    }
}

impl OutputConfig {
    pub fn validate(&self, name: &str) -> Result<(), String> {
        let field = |f: &str| format!("output.{name}.{f}");
        if self.kind == OutputKind::Classification && self.top_k == 0 {
            return Err(format!("{}: must be at least 1", field("top_k")));
        }
        if !(0.0..=1.0).contains(&self.confidence) {
            return Err(format!("{}: between 0 and 1", field("confidence")));
        }
        if !(0.0..=1.0).contains(&self.iou) {
            return Err(format!("{}: between 0 and 1", field("iou")));
        }
        if self.max_detections == 0 {
            return Err(format!("{}: must be at least 1", field("max_detections")));
        }
        if let Some(Labels::Names(names)) = &self.labels {
            if names.is_empty() || names.iter().any(String::is_empty) {
                return Err(format!("{}: a list of non-empty names, or a file", field("labels")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::config::ModelConfig;

    fn parse(text: &str) -> crate::Result<ModelConfig> {
        ModelConfig::parse("m", Path::new("/models/m"), text)
    }

    fn error_of(text: &str) -> String {
        parse(text).expect_err("invalid").to_string()
    }

    #[test]
    fn a_vision_model_reads_its_image_and_output_tables() {
        let c = parse(
            "backend = \"onnx\"\nfile = \"m.onnx\"\n[image]\nresize = \"letterbox\"\nanchor = \"top-left\"\n\
             mean = [0.485, 0.456, 0.406]\nstd = 0.5\n[output.output0]\nkind = \"detection\"\n\
             labels = \"labels.txt\"\n[output.probs]\nkind = \"classification\"\nlabels = [\"a\", \"b\"]\n",
        );
        let err = c.expect_err("std is a list").to_string();
        assert!(err.contains("std"), "{err}");
        let c = parse(
            "backend = \"onnx\"\nfile = \"m.onnx\"\n[image]\nresize = \"letterbox\"\nanchor = \"top-left\"\n\
             std = [0.5]\n[output.output0]\nkind = \"detection\"\nlabels = \"labels.txt\"\n\
             [output.probs]\nkind = \"classification\"\nlabels = [\"a\", \"b\"]\n",
        )
        .expect("valid");
        let image = c.image.expect("image");
        assert_eq!((image.resize, image.anchor, image.pad_value), (Resize::Letterbox, Anchor::TopLeft, 114));
        assert_eq!(image.mean_std(2), (0.0, 0.5));
        assert_eq!(c.postprocess.len(), 2);
        let (name, detection) = &c.postprocess[0];
        assert_eq!((name.as_str(), detection.kind, detection.iou), ("output0", OutputKind::Detection, 0.45));
        assert_eq!(detection.labels, Some(Labels::File(PathBuf::from("/models/m/labels.txt"))));
        assert_eq!(c.postprocess[1].1.labels, Some(Labels::Names(vec!["a".into(), "b".into()])));
    }

    #[test]
    fn image_settings_that_cannot_work_are_refused() {
        let base = "backend = \"onnx\"\nfile = \"m.onnx\"\n";
        let cases = [
            (format!("{base}[image]\nmean = [1.0, 2.0]"), "image.mean: one value, or one per channel (3)"),
            (format!("{base}[image]\nstd = [0.0]"), "image.std: must not be 0"),
            (format!("{base}[image]\nshorter_side = 256"), "only applies with resize = \"crop\""),
            (format!("{base}[image]\nresize = \"multiple\"\nwidth = 32"), "keeps each picture's own size"),
            (format!("{base}[image]\nwidth = 0"), "image.width: must be between 1"),
            (format!("{base}[image]\nresize = \"fit\""), "unknown variant `fit`"),
            (format!("{base}[output.y]\nkind = \"classification\""), "add an [image] table"),
            (format!("{base}[image]\n[output.y]\nkind = \"boxes\""), "output.y: unknown variant `boxes`"),
            (format!("{base}[image]\n[output.y]\nkind = \"detection\"\niou = 2.0"), "output.y.iou"),
            (format!("{base}[[output]]\nname = \"y\"\ndatatype = \"FLOAT\"\nshape = [-1]"), "unknown datatype"),
            ("backend = \"candle\"\ntask = \"embed\"\n[image]\n".to_owned(), "task is the default"),
        ];
        for (text, expected) in cases {
            let err = error_of(&text);
            assert!(err.contains(expected), "{text:?}: expected {expected:?} in {err:?}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
    }
}
