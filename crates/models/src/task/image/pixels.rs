//! From an encoded picture to a vision model's input: the file's header checked, the picture decoded (JPEG, PNG,
//! WebP, BMP) and turned upright by its EXIF orientation, resized to the model's size as `[image]` says, and its
//! values scaled into the tensor's type and layout. Blocking CPU work: callers run it off the async runtime.

use std::io::Cursor;

use fast_image_resize as fir;
use image::{DynamicImage, ImageDecoder, ImageReader};
use inferd_core::half::f16;
use inferd_core::{Anchor, Channels, DataType, Filter, ImageConfig, Layout, Resize, Rounding};

use super::super::TaskError;

/// The longest side a picture is resized to on its way to a crop.
pub const MAX_RESIZED_SIDE: u32 = 1 << 16;

/// The formats decoded, as errors name them.
pub const FORMATS: &str = "JPEG, PNG, WebP or BMP";

/// Where a picture went in the tensor: what undoes the resize for boxes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// The picture's own size, upright.
    pub width: u32,
    pub height: u32,
    /// Tensor pixels per picture pixel, across and down.
    pub scale_x: f32,
    pub scale_y: f32,
    /// Where the picture's top left corner is in the tensor (negative where it was cropped).
    pub left: f32,
    pub top: f32,
}

impl Geometry {
    /// A point in the tensor's pixels as the picture's, kept inside the picture.
    pub fn to_picture(self, x: f32, y: f32) -> (f32, f32) {
        let x = ((x - self.left) / self.scale_x).clamp(0.0, self.width as f32);
        let y = ((y - self.top) / self.scale_y).clamp(0.0, self.height as f32);
        (x, y)
    }
}

/// A decoded, upright picture: 8-bit RGB or grey pixels, row by row.
pub struct Decoded {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Decodes picture `index` of a request. `reserve` is told its decoded bytes (from the header) before they are
/// allocated, and may refuse them; a picture over `max_pixels`, or not a picture, or a broken one, is the client's fault.
pub fn decode(
    file: &[u8],
    index: usize,
    config: &ImageConfig,
    reserve: &mut dyn FnMut(usize) -> Result<(), TaskError>,
) -> Result<Decoded, TaskError> {
    let invalid = |what: String| TaskError::Invalid(format!("picture {index}: {what}"));
    if file.is_empty() {
        return Err(invalid("the file is empty".into()));
    }
    let reader = ImageReader::new(Cursor::new(file))
        .with_guessed_format()
        .map_err(|e| invalid(format!("cannot read it: {e}")))?;
    let format = match reader.format() {
        Some(f @ (image::ImageFormat::Jpeg | image::ImageFormat::Png | image::ImageFormat::WebP))
        | Some(f @ image::ImageFormat::Bmp) => f,
        Some(other) => {
            return Err(invalid(format!("{} pictures are not taken, only {FORMATS}", other.to_mime_type())));
        }
        None => return Err(invalid(format!("not a picture: the bytes are not {FORMATS}"))),
    };
    let name = format.to_mime_type();
    if format == image::ImageFormat::Jpeg && !jpeg_is_whole(file) {
        // The JPEG decoder makes up what is missing; Pillow and libjpeg refuse it, and so does this server.
        return Err(invalid("the image/jpeg is truncated: it ends before its end-of-image marker".into()));
    }
    let mut decoder = reader.into_decoder().map_err(|e| invalid(format!("a broken {name} header: {e}")))?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > config.max_pixels || width == 0 || height == 0 {
        return Err(invalid(format!(
            "it is {width} × {height} pixels; this model takes pictures of 1 to {} pixels (image.max_pixels)",
            config.max_pixels
        )));
    }
    // At its peak a picture is held in the file's own format and as 8-bit RGB, and again when EXIF turns it (a grey
    // model's luma plane is smaller than that copy): the budget holds all of it before any is allocated.
    let rgb = pixels.saturating_mul(3);
    let peak = decoder.total_bytes().saturating_add(rgb.saturating_mul(2));
    reserve(usize::try_from(peak).unwrap_or(usize::MAX))?;
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut picture = DynamicImage::from_decoder(decoder)
        .map_err(|e| invalid(format!("cannot decode the {name}, it is truncated or corrupt: {e}")))?;
    picture.apply_orientation(orientation);
    let (width, height) = (picture.width(), picture.height());
    let rgb = picture.into_rgb8().into_raw();
    let pixels = match config.channels {
        Channels::Rgb | Channels::Bgr => rgb,
        Channels::Grey => rgb.chunks_exact(3).map(|p| luma(p[0], p[1], p[2])).collect(),
    };
    Ok(Decoded { width, height, pixels })
}

/// Whether a JPEG file holds its end-of-image marker after its first scan. The segments before the scan are walked by
/// their lengths (an EXIF thumbnail, itself a JPEG, has an end marker of its own); within a scan's coded data a 0xFF
/// byte is always followed by 0x00 or a restart marker, so the end marker there is the real one.
fn jpeg_is_whole(file: &[u8]) -> bool {
    let mut at = 2; // past the start-of-image marker
    while at + 4 <= file.len() {
        if file[at] != 0xFF {
            return true; // not a marker: the decoder says what is wrong
        }
        let marker = file[at + 1];
        let length = usize::from(u16::from_be_bytes([file[at + 2], file[at + 3]]));
        match marker {
            0xFF => at += 1, // fill byte
            0xD0..=0xD8 | 0x01 => at += 2,
            0xDA => {
                let coded = file.get(at + 2 + length..).unwrap_or_default();
                return coded.windows(2).rev().any(|pair| pair == [0xFF, 0xD9]);
            }
            _ => at += 2 + length,
        }
    }
    false
}

/// ITU-R 601 luma in Pillow's fixed point (its `L` mode), rather than the image crate's Rec. 709.
fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((u32::from(r) * 19595 + u32::from(g) * 38470 + u32::from(b) * 7471 + 0x8000) >> 16) as u8
}

/// The tensor size a picture of `width` × `height` gets, before padding to a batch's largest (`multiple`), given the
/// fixed `target` (width, height) of every other mode.
pub fn planned_size(config: &ImageConfig, target: Option<(u32, u32)>, width: u32, height: u32) -> (u32, u32) {
    match (config.resize, target) {
        (Resize::Multiple, _) | (_, None) => {
            let step = config.multiple_of.unwrap_or(1);
            let longer = width.max(height);
            let ratio = config.max_side.map_or(1.0, |m| (f64::from(m) / f64::from(longer)).min(1.0));
            let round = |side: u32| {
                let scaled = (f64::from(side) * ratio / f64::from(step)).round().max(1.0);
                (scaled as u32).saturating_mul(step)
            };
            (round(width), round(height))
        }
        (_, Some(target)) => target,
    }
}

/// A picture resized into a canvas of `canvas` (width, height) pixels filled with `pad_value`, and where it went.
pub fn fit(
    config: &ImageConfig,
    picture: &Decoded,
    index: usize,
    size: (u32, u32),
    canvas: (u32, u32),
) -> Result<(Vec<u8>, Geometry), TaskError> {
    let (w, h) = (picture.width, picture.height);
    let (tw, th) = size;
    let (fw, fh) = (f64::from(w), f64::from(h));
    if config.resize == Resize::Crop {
        // The shorter side to `shorter_side`: a picture of extreme proportions would be resized far past any
        // model's size before its centre is cut out.
        let r = f64::from(config.shorter_side.unwrap_or(tw.max(th))) / fw.min(fh);
        if (fw.max(fh) * r).round() > f64::from(MAX_RESIZED_SIDE) {
            return Err(TaskError::Invalid(format!(
                "picture {index}: {w} × {h} is too narrow for this model: its shorter side resized to {} pixels makes \
                 its longer side more than {MAX_RESIZED_SIDE}",
                (fw.min(fh) * r).round()
            )));
        }
    }
    // (resized width, height; its top left corner in the canvas; the part of the resized picture kept)
    let (rw, rh, left, top, crop) = match config.resize {
        Resize::Stretch | Resize::Multiple => (tw, th, 0i64, 0i64, None),
        Resize::Letterbox => {
            let r = (f64::from(tw) / fw).min(f64::from(th) / fh);
            let rw = ((fw * r).round() as u32).clamp(1, tw);
            let rh = ((fh * r).round() as u32).clamp(1, th);
            let (left, top) = match config.anchor {
                Anchor::Center => (i64::from((tw - rw) / 2), i64::from((th - rh) / 2)),
                Anchor::TopLeft => (0, 0),
            };
            (rw, rh, left, top, None)
        }
        Resize::Crop => {
            let shorter = config.shorter_side.unwrap_or(tw.max(th));
            let r = f64::from(shorter) / fw.min(fh);
            // The shorter side is exactly `shorter`; the longer side rounded as configured.
            let side = |f: f64| match config.rounding {
                _ if f == fw.min(fh) => shorter,
                Rounding::Nearest => (f * r).round() as u32,
                // As transformers computes it: `int(size * long / short)`.
                Rounding::Down => (f64::from(shorter) * f / fw.min(fh)) as u32,
            };
            let rw = side(fw).max(tw);
            let rh = side(fh).max(th);
            let (cx, cy) = ((rw - tw) / 2, (rh - th) / 2);
            (rw, rh, -i64::from(cx), -i64::from(cy), Some((cx, cy)))
        }
    };
    let channels = config.channels.count();
    // Only the kept part of the resized picture is computed (a crop's centre): the same pixels as resizing it whole
    // and cutting them out.
    let (cx, cy) = crop.unwrap_or((0, 0));
    let (kept_w, kept_h) = if crop.is_some() { (tw, th) } else { (rw, rh) };
    let window = Window { size: (rw, rh), left: cx, top: cy, width: kept_w, height: kept_h };
    let resized = resize(config.filter, picture, channels, window)?;
    let (cw, ch) = canvas;
    let mut out = vec![config.pad_value; cw as usize * ch as usize * channels];
    let (ox, oy) = (left.max(0) as usize, top.max(0) as usize);
    let row = kept_w as usize * channels;
    for (y, kept) in resized.chunks_exact(row).enumerate() {
        let to = ((oy + y) * cw as usize + ox) * channels;
        out[to..to + row].copy_from_slice(kept);
    }
    let geometry = Geometry {
        width: w,
        height: h,
        scale_x: (f64::from(rw) / fw) as f32,
        scale_y: (f64::from(rh) / fh) as f32,
        left: left as f32,
        top: top as f32,
    };
    Ok((out, geometry))
}

/// The part of a resized picture that is kept: the picture resized to `size`, then `width` × `height` pixels from
/// (`left`, `top`).
#[derive(Debug, Clone, Copy)]
struct Window {
    size: (u32, u32),
    left: u32,
    top: u32,
    width: u32,
    height: u32,
}

/// The `window` of `picture` resampled with `filter`, as Pillow's `resize` does: convolution filters are antialiased
/// when shrinking and run across, then down, each pass rounding to 8 bits (the order matters where a filter
/// overshoots: bicubic, Lanczos); nearest takes the pixel under each output pixel's centre.
fn resize(filter: Filter, picture: &Decoded, channels: usize, window: Window) -> Result<Vec<u8>, TaskError> {
    let (w, h) = (picture.width, picture.height);
    if window.size == (w, h) && (window.width, window.height) == (w, h) {
        return Ok(picture.pixels.clone());
    }
    let kind = match filter {
        Filter::Nearest => return Ok(nearest(picture, channels, window)),
        Filter::Bilinear => fir::FilterType::Bilinear,
        Filter::Bicubic => fir::FilterType::CatmullRom,
        Filter::Lanczos3 => fir::FilterType::Lanczos3,
    };
    let internal = |e: &dyn std::fmt::Display| TaskError::Internal(format!("resizing a picture: {e}"));
    let pixel_type = if channels == 1 { fir::PixelType::U8 } else { fir::PixelType::U8x3 };
    let mut resizer = fir::Resizer::new();
    // One axis a call, across first (the resizer alone would go down first for 8-bit pixels); each pass reads the
    // source span its kept pixels come from, with the whole picture around it for the filter's support.
    let mut pass = |pixels: &[u8], from: (u32, u32), to: (u32, u32), crop: (f64, f64, f64, f64)| {
        let src = fir::images::ImageRef::new(from.0, from.1, pixels, pixel_type).map_err(|e| internal(&e))?;
        let mut dst = fir::images::Image::new(to.0, to.1, pixel_type);
        let options = fir::ResizeOptions::new()
            .resize_alg(fir::ResizeAlg::Convolution(kind))
            .crop(crop.0, crop.1, crop.2, crop.3);
        resizer.resize(&src, &mut dst, &options).map_err(|e| internal(&e))?;
        Ok::<_, TaskError>(dst.into_vec())
    };
    // The source span (start, length) that `len` resized pixels from `start` come from: its end kept inside the
    // picture, where floating point would put it a hair past the edge (116 × 224 / 224 is 116.00000000000001).
    let span = |start: u32, len: u32, resized: u32, side: u32| {
        let (scale, side) = (f64::from(side) / f64::from(resized), f64::from(side));
        let from = (f64::from(start) * scale).min(side);
        let to = (f64::from(start + len) * scale).min(side);
        (from, to - from)
    };
    let across = if (window.size.0, window.width) == (w, w) {
        picture.pixels.clone()
    } else {
        let (left, width) = span(window.left, window.width, window.size.0, w);
        pass(&picture.pixels, (w, h), (window.width, h), (left, 0.0, width, f64::from(h)))?
    };
    if (window.size.1, window.height) == (h, h) {
        return Ok(across);
    }
    let (top, height) = span(window.top, window.height, window.size.1, h);
    pass(&across, (window.width, h), (window.width, window.height), (0.0, top, f64::from(window.width), height))
}

/// Nearest-neighbour resampling with Pillow's sampling positions: the source pixel under each output pixel's centre,
/// the positions stepped in floating point as Pillow steps them, so that centres falling exactly on a pixel edge
/// pick the same side.
fn nearest(picture: &Decoded, channels: usize, window: Window) -> Vec<u8> {
    let positions = |from: u32, to: u32, skip: u32, take: u32| {
        let step = f64::from(from) / f64::from(to);
        let mut at = step * 0.5;
        (0..to)
            .map(|_| {
                let i = (at as usize).min(from as usize - 1);
                at += step;
                i
            })
            .skip(skip as usize)
            .take(take as usize)
            .collect::<Vec<usize>>()
    };
    let xs = positions(picture.width, window.size.0, window.left, window.width);
    let ys = positions(picture.height, window.size.1, window.top, window.height);
    let row = picture.width as usize * channels;
    let mut out = Vec::with_capacity(xs.len() * ys.len() * channels);
    for y in ys {
        for &x in &xs {
            let at = y * row + x * channels;
            out.extend_from_slice(&picture.pixels[at..at + channels]);
        }
    }
    out
}

/// Writes one canvas of `width` × `height` 8-bit pixels into `out` (the bytes of one picture's row of the tensor)
/// as `dtype`, in `config`'s layout and channel order, scaled as it says.
pub fn write(config: &ImageConfig, dtype: DataType, canvas: &[u8], width: u32, height: u32, out: &mut Vec<u8>) {
    let channels = config.channels.count();
    let plane = width as usize * height as usize;
    // Tensor channel c reads canvas channel source(c).
    let source = |c: usize| if config.channels == Channels::Bgr { 2 - c } else { c };
    // Each tensor channel's value of each 0-255 level: a table lookup rather than arithmetic per value. A UINT8
    // input takes the levels as they are.
    let tables: Vec<[f32; 256]> = (0..channels)
        .map(|c| {
            let (mean, std) = config.mean_std(c);
            std::array::from_fn(|v| (v as f32 * config.scale - mean) / std)
        })
        .collect();
    let mut put = |c: usize, level: u8| match dtype {
        DataType::Uint8 => out.push(level),
        DataType::Fp16 => out.extend_from_slice(&f16::from_f32(tables[c][usize::from(level)]).to_le_bytes()),
        _ => out.extend_from_slice(&tables[c][usize::from(level)].to_le_bytes()),
    };
    match config.layout {
        Layout::Nchw => {
            for c in 0..channels {
                let from = source(c);
                for p in 0..plane {
                    put(c, canvas[p * channels + from]);
                }
            }
        }
        Layout::Nhwc => {
            for p in 0..plane {
                for c in 0..channels {
                    put(c, canvas[p * channels + source(c)]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ImageConfig {
        toml::from_str(text).expect("valid [image]")
    }

    fn picture(width: u32, height: u32) -> Decoded {
        let pixels = (0..width * height * 3).map(|i| (i % 251) as u8).collect();
        Decoded { width, height, pixels }
    }

    #[test]
    fn letterbox_keeps_the_aspect_ratio_and_maps_boxes_back() {
        let c = config("resize = \"letterbox\"");
        let (canvas, g) = fit(&c, &picture(200, 100), 0, (64, 64), (64, 64)).expect("fit");
        assert_eq!(canvas.len(), 64 * 64 * 3);
        assert_eq!((g.scale_x, g.scale_y, g.left, g.top), (0.32, 0.32, 0.0, 16.0));
        // The padding above the picture holds the pad value.
        assert!(canvas[..16 * 64 * 3].iter().all(|&v| v == 114));
        assert_eq!(g.to_picture(32.0, 32.0), (100.0, 50.0));
        assert_eq!(g.to_picture(64.0, 0.0), (200.0, 0.0));
    }

    #[test]
    fn crop_cuts_the_centre_of_the_shorter_side_resized() {
        let c = config("resize = \"crop\"\nshorter_side = 4");
        let (canvas, g) = fit(&c, &picture(16, 8), 0, (4, 4), (4, 4)).expect("fit");
        assert_eq!(canvas.len(), 4 * 4 * 3);
        assert_eq!((g.scale_x, g.left, g.top), (0.5, -2.0, 0.0));
        assert_eq!(g.to_picture(2.0, 2.0), (8.0, 4.0));
    }

    #[test]
    fn resizing_never_reads_past_the_picture_where_floating_point_would() {
        // 116 × (116 / 224) × 224 is a hair over 116 in f64: a crop box past the edge would be refused.
        let c = config("");
        for (w, h) in [(116, 116), (29, 58), (123, 7)] {
            let (canvas, _) = fit(&c, &picture(w, h), 0, (224, 224), (224, 224)).expect("fits");
            assert_eq!(canvas.len(), 224 * 224 * 3);
        }
        let c = config("resize = \"letterbox\"");
        for (w, h) in [(321, 182), (800, 217), (1920, 427)] {
            assert!(fit(&c, &picture(w, h), 0, (320, 320), (320, 320)).is_ok(), "{w} × {h}");
        }
        let c = config("resize = \"crop\"\nfilter = \"nearest\"");
        let err = fit(&c, &picture(400_000, 1), 3, (224, 224), (224, 224)).expect_err("too narrow");
        assert!(err.to_string().starts_with("picture 3: 400000 × 1 is too narrow"), "{err}");
    }

    #[test]
    fn multiple_rounds_each_side_after_capping_the_longer() {
        let c = config("resize = \"multiple\"\nmultiple_of = 32\nmax_side = 640");
        assert_eq!(planned_size(&c, None, 1280, 720), (640, 352));
        assert_eq!(planned_size(&c, None, 100, 10), (96, 32));
    }

    #[test]
    fn values_are_scaled_per_channel_in_the_layout_asked() {
        let c = config("channels = \"bgr\"\nmean = [0.0, 1.0, 2.0]\nstd = [0.5]\nscale = 1.0");
        let canvas = [10u8, 20, 30, 40, 50, 60]; // two RGB pixels
        let mut out = Vec::new();
        write(&c, DataType::Fp32, &canvas, 2, 1, &mut out);
        let values: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        // Channel 0 is blue (30, 60), channel 1 green less 1, channel 2 red less 2; all divided by 0.5.
        assert_eq!(values, [60.0, 120.0, 38.0, 98.0, 16.0, 76.0]);
        let c = config("layout = \"nhwc\"");
        let mut out = Vec::new();
        write(&c, DataType::Uint8, &canvas, 2, 1, &mut out);
        assert_eq!(out, canvas);
    }

    #[test]
    fn a_jpeg_without_its_end_marker_is_truncated() {
        // Start of image, a comment segment holding an end marker, a scan header, coded data, end of image.
        let whole =
            [0xFF, 0xD8, 0xFF, 0xFE, 0x00, 0x04, 0xFF, 0xD9, 0xFF, 0xDA, 0x00, 0x02, 0x12, 0xFF, 0x00, 0xFF, 0xD9];
        assert!(jpeg_is_whole(&whole));
        assert!(!jpeg_is_whole(&whole[..whole.len() - 2]));
        assert!(!jpeg_is_whole(&whole[..8]));
    }

    #[test]
    fn broken_files_are_refused_and_never_panic() {
        use image::ImageFormat;
        // Headers that claim a large picture are refused cheaply: at most a megapixel is decoded per try.
        let c = config("width = 32\nheight = 24\nresize = \"letterbox\"\nmax_pixels = 1000000");
        let source = image::RgbImage::from_fn(64, 48, |x, y| image::Rgb([(x * 4) as u8, (y * 5) as u8, (x + y) as u8]));
        let mut rng = fastrand::Rng::with_seed(7);
        for format in [ImageFormat::Png, ImageFormat::Jpeg, ImageFormat::Bmp, ImageFormat::WebP] {
            let mut file = Cursor::new(Vec::new());
            DynamicImage::ImageRgb8(source.clone()).write_to(&mut file, format).expect("encodes");
            let file = file.into_inner();
            let whole = decode(&file, 0, &c, &mut |_| Ok(())).expect("the whole file decodes");
            assert_eq!((whole.width, whole.height), (64, 48), "{format:?}");
            for _ in 0..300 {
                let mut broken = file.clone();
                match rng.u8(0..3) {
                    0 => broken.truncate(rng.usize(0..broken.len())),
                    1 => {
                        for _ in 0..rng.usize(1..8) {
                            let i = rng.usize(0..broken.len());
                            broken[i] = rng.u8(..);
                        }
                    }
                    _ => broken.insert(rng.usize(0..broken.len()), rng.u8(..)),
                }
                // Either a clear refusal, or a picture that then fits.
                if let Ok(picture) = decode(&broken, 0, &c, &mut |_| Ok(())) {
                    let (canvas, _) = fit(&c, &picture, 0, (32, 24), (32, 24)).expect("a decoded picture fits");
                    assert_eq!(canvas.len(), 32 * 24 * 3);
                }
            }
        }
    }

    #[test]
    fn pillow_luma_weights() {
        assert_eq!(luma(255, 255, 255), 255);
        assert_eq!(luma(255, 0, 0), 76);
        assert_eq!(luma(0, 255, 0), 150);
        assert_eq!(luma(0, 0, 255), 29);
    }
}
