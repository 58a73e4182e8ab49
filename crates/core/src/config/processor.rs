//! A hub folder's `preprocessor_config.json` (transformers' image processors: CLIP's, SigLIP's, ViT's) as an
//! [`ImageConfig`]: the same resize, crop, filter, rescale and normalisation through the `[image]` pipeline.

use std::path::Path;

use serde_json::Value;

use super::image::{Anchor, Channels, Filter, ImageConfig, Layout, Resize, Rounding, DEFAULT_MAX_PIXELS};
use crate::error::{Error, Result};

/// The file's name in a model's folder.
pub const PROCESSOR_CONFIG_FILE: &str = "preprocessor_config.json";

impl ImageConfig {
    /// The preprocessing `path` describes, into input `input`. transformers' processors:
    /// - `size: {shortest_edge}` with `do_center_crop` and `crop_size`: the shorter side resized to the edge, the longer
    ///   rounded down as transformers rounds it, then the centre cut out (CLIP);
    /// - `size: {height, width}`: stretched to it (SigLIP, ViT), cropped only where the crop is that size;
    /// - `resample` as Pillow numbers its filters; `do_rescale` with `rescale_factor`; `do_normalize` with
    ///   `image_mean` and `image_std`; pictures converted to RGB.
    ///
    /// Where a key is left out, or a size is one number, it means what the processor's own class takes it to mean
    /// (`image_processor_type`): CLIP's reads a number as the shortest edge, crops the centre and resamples bicubic
    /// unless told otherwise; the others (SigLIP's, ViT's) read it as a square, crop nothing and resample bilinear.
    ///
    /// What the pipeline cannot do as the processor does (a shortest edge without a crop, padding, a filter it lacks)
    /// is refused, naming the field.
    pub fn from_processor(path: &Path, input: &str) -> Result<ImageConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::config(path, format!("cannot read: {e}")))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::config(path, format!("not JSON: {e}")))?;
        read(&json, input).map_err(|m| Error::config(path, m))
    }
}

fn read(json: &Value, input: &str) -> std::result::Result<ImageConfig, String> {
    let class = ["image_processor_type", "feature_extractor_type"]
        .iter()
        .find_map(|key| json.get(*key).and_then(Value::as_str))
        .unwrap_or_default();
    let clip = class.contains("CLIP");
    let flag = |name: &str, default: bool| match json.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{name}: {other} is not true or false")),
    };
    let side = |value: &Value, name: &str| -> std::result::Result<u32, String> {
        value
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("{name}: {value} is not a positive whole number of pixels"))
    };
    // A size is `{height, width}`, `{shortest_edge}`, or one number: the shortest edge where `edge` (CLIP's
    // `size`), else a square, as transformers reads them.
    let size_of = |name: &str, edge: bool| -> std::result::Result<Option<Size>, String> {
        match json.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(number @ Value::Number(_)) => {
                let s = side(number, name)?;
                Ok(Some(if edge { Size::Shortest(s) } else { Size::Exact(s, s) }))
            }
            Some(Value::Object(map)) => {
                if map.contains_key("longest_edge") {
                    return Err(format!("{name}.longest_edge: a bound on the longer side is not supported"));
                }
                match (map.get("height"), map.get("width"), map.get("shortest_edge")) {
                    (Some(h), Some(w), _) => {
                        Ok(Some(Size::Exact(side(w, &format!("{name}.width"))?, side(h, &format!("{name}.height"))?)))
                    }
                    (None, None, Some(edge)) => Ok(Some(Size::Shortest(side(edge, &format!("{name}.shortest_edge"))?))),
                    _ => Err(format!(
                        "{name}: {} is not {{height, width}} or {{shortest_edge}}",
                        Value::Object(map.clone())
                    )),
                }
            }
            Some(other) => Err(format!("{name}: {other} is not a size")),
        }
    };
    if !flag("do_resize", true)? {
        return Err("do_resize: false: pictures of every size would reach the model; inferd resizes them".into());
    }
    let size = size_of("size", clip)?.ok_or("size: missing")?;
    let crop = match flag("do_center_crop", clip)? {
        true => match size_of("crop_size", false)?.ok_or("crop_size: missing, while do_center_crop is true")? {
            Size::Shortest(_) => return Err("crop_size: a crop is {height, width} or one number".into()),
            exact => Some(exact),
        },
        false => None,
    };
    let (resize, (width, height), shorter_side) = match (size, crop) {
        (Size::Shortest(edge), Some(Size::Exact(w, h))) => (Resize::Crop, (w, h), Some(edge)),
        (Size::Exact(w, h), None) => (Resize::Stretch, (w, h), None),
        (Size::Exact(w, h), Some(Size::Exact(cw, ch))) if (w, h) == (cw, ch) => (Resize::Stretch, (w, h), None),
        (Size::Shortest(_), None) => {
            return Err("size.shortest_edge without do_center_crop: each picture would keep its proportions, and a \
                        batch needs one size"
                .into())
        }
        _ => return Err("size, crop_size: a crop smaller than an exact size is not supported".into()),
    };
    if shorter_side.is_some_and(|edge| edge < width.max(height)) {
        return Err(format!("size.shortest_edge: shorter than the {width} × {height} crop"));
    }
    // Pillow's numbering, which transformers keeps.
    let filter = match json.get("resample") {
        None | Some(Value::Null) if clip => Filter::Bicubic,
        None | Some(Value::Null) => Filter::Bilinear,
        Some(value) => match value.as_u64() {
            Some(0) => Filter::Nearest,
            Some(1) => Filter::Lanczos3,
            Some(2) => Filter::Bilinear,
            Some(3) => Filter::Bicubic,
            Some(4 | 5) => return Err(format!("resample: Pillow's filter {value} (box or hamming) is not supported")),
            _ => return Err(format!("resample: {value} is not one of Pillow's filters (0 to 3)")),
        },
    };
    let numbers = |name: &str| -> std::result::Result<Vec<f32>, String> {
        match json.get(name) {
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| v.as_f64().map(|v| v as f32).ok_or_else(|| format!("{name}: {v} is not a number")))
                .collect(),
            Some(Value::Number(n)) => Ok(vec![n.as_f64().unwrap_or(0.0) as f32]),
            _ => Err(format!("{name}: missing, while do_normalize is true")),
        }
    };
    let scale = match flag("do_rescale", true)? {
        true => {
            json.get("rescale_factor").map_or(Some(1.0 / 255.0), Value::as_f64).ok_or("rescale_factor: not a number")?
                as f32
        }
        false => 1.0,
    };
    let (mean, std) = match flag("do_normalize", true)? {
        true => (numbers("image_mean")?, numbers("image_std")?),
        false => (vec![0.0], vec![1.0]),
    };
    if flag("do_pad", false)? {
        return Err("do_pad: padding pictures is not supported".into());
    }
    let config = ImageConfig {
        input: Some(input.to_owned()),
        layout: Layout::Nchw,
        width: Some(width),
        height: Some(height),
        resize,
        shorter_side,
        rounding: if resize == Resize::Crop { Rounding::Down } else { Rounding::Nearest },
        anchor: Anchor::Center,
        pad_value: 0,
        multiple_of: None,
        max_side: None,
        filter,
        channels: Channels::Rgb,
        scale,
        mean,
        std,
        max_pixels: DEFAULT_MAX_PIXELS,
    };
    config.validate()?;
    Ok(config)
}

enum Size {
    /// Width, height.
    Exact(u32, u32),
    Shortest(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_and_siglip_processors_read_as_the_pipeline_runs_them() {
        let clip = serde_json::json!({
            "image_processor_type": "CLIPImageProcessor", "do_resize": true, "size": {"shortest_edge": 224},
            "resample": 3, "do_center_crop": true, "crop_size": {"height": 224, "width": 224}, "do_rescale": true,
            "rescale_factor": 0.00392156862745098, "do_normalize": true,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]
        });
        let config = read(&clip, "pixel_values").expect("CLIP's processor");
        assert_eq!((config.resize, config.width, config.height), (Resize::Crop, Some(224), Some(224)));
        assert_eq!((config.shorter_side, config.rounding, config.filter), (Some(224), Rounding::Down, Filter::Bicubic));
        assert_eq!(config.mean.len(), 3);
        assert!((config.scale - 1.0 / 255.0).abs() < 1e-9);
        // openai/clip-vit-base-patch32's older form: sizes as numbers, the size a shortest edge, crop and filter
        // by the class's defaults.
        let old = serde_json::json!({"feature_extractor_type": "CLIPFeatureExtractor", "size": 224, "crop_size": 224,
                                     "image_mean": [0.5], "image_std": [0.5]});
        let config = read(&old, "pixel_values").expect("CLIP's older processor");
        assert_eq!((config.resize, config.shorter_side, config.width), (Resize::Crop, Some(224), Some(224)));
        assert_eq!(config.filter, Filter::Bicubic);
        // SigLIP's: stretched (a number is a square; a crop of that size changes nothing), bilinear by default.
        let siglip = serde_json::json!({"image_processor_type": "SiglipImageProcessor", "size": 384,
                                        "image_mean": [0.5], "image_std": [0.5], "do_center_crop": true,
                                        "crop_size": 384});
        let config = read(&siglip, "pixel_values").expect("SigLIP's processor");
        assert_eq!((config.resize, config.width, config.filter), (Resize::Stretch, Some(384), Filter::Bilinear));
        assert_eq!((config.mean.clone(), config.std.clone()), (vec![0.5], vec![0.5]));
        // What the pipeline cannot do is refused by its field.
        let refused = |json: serde_json::Value, field: &str| {
            let message = read(&json, "pixel_values").expect_err("refused");
            assert!(message.starts_with(field), "{message}");
        };
        refused(serde_json::json!({"size": {"shortest_edge": 224}}), "size.shortest_edge");
        refused(serde_json::json!({"size": {"height": 224, "width": 224}, "resample": 4}), "resample");
        refused(serde_json::json!({"size": {"height": 224, "width": 224}, "resample": "bicubic"}), "resample");
        refused(serde_json::json!({"size": {"shortest_edge": 224, "longest_edge": 1333}}), "size.longest_edge");
        refused(serde_json::json!({"size": {"height": 0, "width": 224}}), "size.height");
        refused(serde_json::json!({"size": 224, "do_resize": false}), "do_resize");
        refused(serde_json::json!({"size": 224, "image_mean": [0.5, 0.5], "image_std": [0.5]}), "image.mean");
    }
}
