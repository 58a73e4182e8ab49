//! The image task: a vision model (`[image]` in its `model.toml`) takes encoded pictures. Before the batcher each is
//! decoded, resized and scaled into the model's input tensor ([`pixels`]); pictures of one request become one
//! batch of rows, which batches with other requests' of the same size. After it, each output is answered as
//! `[output.NAME]` says ([`readings`]): top-k classes, boxes, or the tensor. On the tensor protocols the image
//! input is a `BYTES` tensor, one encoded file per element, and the outputs are the model's own.

mod pixels;
mod readings;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inferd_batcher::InferRequest;
use inferd_core::{
    DataType, ImageConfig, Labels, Layout, ModelConfig, ModelMetadata, OutputConfig, OutputKind, Resize, Tensor,
    TensorSpec,
};

pub use self::pixels::Geometry;
pub use self::readings::{triton_classification, Class, Detection, Reading};
use super::{refused, Answer, Input, Prepared, Registration, Request, Service, Task, TaskError};

pub(super) const REGISTRATION: Registration = Registration {
    service: Service::Images,
    contracts: &[],
    load: |config: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| {
        Ok(Arc::new(ImageTask::load(config, engine)?))
    },
};

/// A model that takes pictures.
#[derive(Debug)]
pub struct ImageTask {
    metadata: ModelMetadata,
    plan: Arc<Plan>,
}

/// What every request to the model shares: how pictures become the input, and how outputs become answers.
#[derive(Debug)]
struct Plan {
    config: ImageConfig,
    /// The input tensor's element type: UINT8, FP16 or FP32.
    dtype: DataType,
    /// The fixed tensor size (width, height); `None` with `resize = "multiple"`.
    target: Option<(u32, u32)>,
    /// Whether the model's input has a batch dimension (more than one picture a request).
    batched: bool,
    /// Per model output, in order: its post-processing, and its labels.
    outputs: Vec<(Option<OutputConfig>, Option<Vec<String>>)>,
}

/// One picture's answer: its size, and one reading per model output, in the model's order. A vision model's answer
/// to pictures carries one for each ([`Answer::payload`] of `Vec<Picture>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub readings: Vec<Reading>,
}

impl ImageTask {
    /// The task of the vision model `config`, whose engine reports `engine`. Blocking (a labels file is read).
    pub fn load(config: &ModelConfig, engine: &ModelMetadata) -> anyhow::Result<ImageTask> {
        let image = config.image.clone().context("an image model needs an [image] table: this is a bug")?;
        let [input] = engine.inputs.as_slice() else {
            bail!("image: a vision model takes one input, the picture; this one takes {}", engine.inputs.len());
        };
        if let Some(name) = image.input.as_deref().filter(|&n| n != input.name) {
            bail!("image.input: the model has no input `{name}`; its input is `{}`", input.name);
        }
        if ![DataType::Uint8, DataType::Fp16, DataType::Fp32].contains(&input.datatype) {
            bail!("image: the input `{}` is {}; a picture becomes UINT8, FP16 or FP32", input.name, input.datatype);
        }
        let [_, a, b, c] = input.shape.as_slice() else {
            bail!(
                "image: the input `{}` has shape {:?}; a picture is [batch, C, H, W] or [batch, H, W, C]",
                input.name,
                input.shape
            );
        };
        let (channels, height, width) = match image.layout {
            Layout::Nchw => (*a, *b, *c),
            Layout::Nhwc => (*c, *a, *b),
        };
        let wanted = image.channels.count() as i64;
        if channels != -1 && channels != wanted {
            bail!(
                "image.channels: the input `{}` has {channels} channels in its {:?} layout; {:?} gives {wanted}",
                input.name,
                image.layout,
                image.channels
            );
        }
        let side = |declared: Option<u32>, model: i64, name: &str| -> anyhow::Result<Option<u32>> {
            match (declared, u32::try_from(model).ok()) {
                (Some(d), Some(m)) if d != m => bail!("image.{name}: {d}, but the model's input is {m} pixels {name}"),
                (Some(d), _) => Ok(Some(d)),
                (None, m) => Ok(m),
            }
        };
        let target = match image.resize {
            Resize::Multiple => {
                if width > 0 || height > 0 {
                    bail!("image.resize: \"multiple\" is for a model whose height and width are dynamic");
                }
                None
            }
            _ => match (side(image.width, width, "width")?, side(image.height, height, "height")?) {
                (Some(w), Some(h)) => Some((w, h)),
                _ => bail!(
                    "image.width, image.height: the model's input size is dynamic; say the size to resize to, or \
                     resize = \"multiple\""
                ),
            },
        };
        if let (Resize::Crop, Some((w, h)), Some(s)) = (image.resize, target, image.shorter_side) {
            if s < w.max(h) {
                bail!("image.shorter_side: {s} is shorter than the {w} × {h} crop");
            }
        }
        let mut outputs: Vec<(Option<OutputConfig>, Option<Vec<String>>)> = vec![(None, None); engine.outputs.len()];
        for (name, output) in &config.postprocess {
            let i = engine.outputs.iter().position(|o| &o.name == name).with_context(|| {
                let names: Vec<&str> = engine.outputs.iter().map(|o| o.name.as_str()).collect();
                format!("output.{name}: the model has no such output; its outputs are {names:?}")
            })?;
            let labels = match &output.labels {
                None => None,
                Some(Labels::Names(names)) => Some(names.clone()),
                Some(Labels::File(path)) => Some(read_labels(path).with_context(|| format!("output.{name}.labels"))?),
            };
            let rank = engine.outputs[i].shape.len();
            let want = match output.kind {
                OutputKind::Classification => 2,
                OutputKind::Detection => 3,
                OutputKind::Raw => rank,
            };
            if rank != want {
                bail!("output.{name}: a {:?} output is {want}-D with its batch; this one is {rank}-D", output.kind);
            }
            outputs[i] = (Some(output.clone()), labels);
        }
        let batched = input.shape[0] == -1;
        let metadata = ModelMetadata {
            inputs: vec![TensorSpec {
                name: input.name.clone(),
                datatype: DataType::Bytes,
                shape: vec![if batched { -1 } else { 1 }],
                optional: false,
            }],
            ..engine.clone()
        };
        let plan = Plan { config: image, dtype: input.datatype, target, batched, outputs };
        Ok(ImageTask { metadata, plan: Arc::new(plan) })
    }
}

/// The file a `BYTES` element holds in base64 (or as a `data:` URL); `None` when it is not base64 text but, say, the
/// file itself.
fn unbase64(element: &[u8]) -> Option<Vec<u8>> {
    file_from_base64(std::str::from_utf8(element).ok()?).ok()
}

/// A picture's file sent as base64 text: plain, or a `data:` URL (its payload follows the first comma); line breaks
/// are allowed, as `base64` writes them. The JSON protocols' one reading of pictures in text.
pub fn file_from_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::Engine as _;
    let text = text.trim();
    let payload = match text.strip_prefix("data:") {
        Some(url) => url.split_once(',').map_or("", |(_, data)| data),
        None => text,
    };
    let payload: Vec<u8> = payload.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(payload)
}

/// A one-row tensor without its batch dimension (the picture's own reading).
fn without_batch(row: Tensor) -> inferd_core::Result<Tensor> {
    match row.raw_bytes() {
        Some(bytes) => Tensor::new(row.dtype(), row.shape()[1..].to_vec(), bytes.to_vec()),
        None => Ok(row),
    }
}

/// A labels file: one name a line, blank lines at the end ignored.
fn read_labels(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let labels: Vec<String> = text.trim_end().lines().map(|l| l.trim().to_owned()).collect();
    if labels.is_empty() || labels.iter().any(String::is_empty) {
        bail!("{}: one non-empty name a line", path.display());
    }
    Ok(labels)
}

impl Task for ImageTask {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError> {
        let name = &self.metadata.inputs[0].name;
        let tensor;
        let base64_files: Vec<Option<Vec<u8>>>;
        let files: Vec<&[u8]> = match &request.input {
            Input::Images(files) => files.iter().map(|f| f.as_ref()).collect(),
            Input::Tensors(tensors) => {
                tensor = tensors
                    .first()
                    .and_then(Option::as_ref)
                    .ok_or_else(|| TaskError::Invalid(format!("missing input `{name}`")))?;
                // KServe's JSON clients send a picture's file in base64, as JSON strings cannot hold its bytes.
                base64_files =
                    tensor.byte_strings().unwrap_or_default().iter().map(|f| unbase64(f)).collect::<Vec<_>>();
                base64_files
                    .iter()
                    .zip(tensor.byte_strings().unwrap_or_default())
                    .map(|(decoded, file)| decoded.as_deref().unwrap_or(file))
                    .collect()
            }
            Input::Texts(_) => return Err(refused(REGISTRATION.service, &request.input)),
        };
        let plan = &self.plan;
        if files.is_empty() {
            return Err(TaskError::Invalid("no picture was sent".into()));
        }
        if files.len() > max_rows {
            return Err(TaskError::OverLimit(format!(
                "{} pictures: a request takes at most {max_rows} (--max-rows)",
                files.len()
            )));
        }
        if !plan.batched && files.len() > 1 {
            return Err(TaskError::Invalid(format!(
                "{} pictures: this model has no batch dimension and takes one picture a request",
                files.len()
            )));
        }
        let no_reserve = |_: usize| Ok(());
        let reserve = request.reserve.as_deref().unwrap_or(&no_reserve);
        let config = &plan.config;
        let channels = config.channels.count();
        let bytes_per_picture =
            |(w, h): (u32, u32)| w as usize * h as usize * channels * plan.dtype.size().unwrap_or(1);
        let (mut decoding, mut resizing) = (Duration::ZERO, Duration::ZERO);
        let mut geometries = Vec::with_capacity(files.len());
        let (canvas, data) = match plan.target {
            // A fixed size: each picture is decoded and made into its row before the next is decoded, so a request
            // holds one decoded picture at a time, and the budget is held for the largest.
            Some(canvas) => {
                reserve(bytes_per_picture(canvas) * files.len())?;
                let mut data = Vec::with_capacity(bytes_per_picture(canvas) * files.len());
                let mut held = 0;
                for (i, file) in files.iter().enumerate() {
                    let started = Instant::now();
                    let picture = pixels::decode(file, i, config, &mut |bytes| {
                        if bytes > held {
                            reserve(bytes - held)?;
                            held = bytes;
                        }
                        Ok(())
                    })?;
                    decoding += started.elapsed();
                    let started = Instant::now();
                    let (pixels, geometry) = pixels::fit(config, &picture, i, canvas, canvas)?;
                    drop(picture);
                    pixels::write(config, plan.dtype, &pixels, canvas.0, canvas.1, &mut data);
                    geometries.push(geometry);
                    resizing += started.elapsed();
                }
                (canvas, data)
            }
            // Each picture's own size, padded to the request's largest: every picture is decoded first.
            None => {
                let started = Instant::now();
                let mut decoded = Vec::with_capacity(files.len());
                for (i, file) in files.iter().enumerate() {
                    let picture = pixels::decode(file, i, config, &mut |bytes| reserve(bytes))?;
                    let size = pixels::planned_size(config, None, picture.width, picture.height);
                    decoded.push((picture, size));
                }
                let canvas = decoded.iter().fold((1, 1), |(w, h), (_, (pw, ph))| (w.max(*pw), h.max(*ph)));
                decoding = started.elapsed();
                let started = Instant::now();
                reserve(bytes_per_picture(canvas) * decoded.len())?;
                let mut data = Vec::with_capacity(bytes_per_picture(canvas) * decoded.len());
                for (i, (picture, size)) in decoded.into_iter().enumerate() {
                    let (pixels, geometry) = pixels::fit(config, &picture, i, size, canvas)?;
                    drop(picture);
                    pixels::write(config, plan.dtype, &pixels, canvas.0, canvas.1, &mut data);
                    geometries.push(geometry);
                }
                resizing = started.elapsed();
                (canvas, data)
            }
        };
        let (width, height) = canvas;
        let (w, h, c) = (width as usize, height as usize, channels);
        let shape = match config.layout {
            Layout::Nchw => vec![geometries.len(), c, h, w],
            Layout::Nhwc => vec![geometries.len(), h, w, c],
        };
        let input = Tensor::new(plan.dtype, shape, data).map_err(|e| TaskError::Internal(e.to_string()))?;
        let plan = self.plan.clone();
        // The tensor protocols answer with the model's own outputs: labels and boxes are made only for pictures sent
        // as pictures, whose protocol reads them.
        let readings = matches!(request.input, Input::Images(_));
        let mut prepared = Prepared::new(
            InferRequest::new(vec![input]).with_deadline(request.deadline),
            Box::new(move |outputs| {
                let pictures = if readings { plan.read(&outputs, &geometries)? } else { Vec::new() };
                Ok(Answer::tensors(outputs, 0).with_payload(pictures))
            }),
        );
        prepared.stages = vec![("decode", decoding), ("resize", resizing)];
        prepared.counted = true;
        Ok(prepared)
    }

    fn service(&self) -> Service {
        REGISTRATION.service
    }

    fn labels(&self, output: usize) -> Option<&[String]> {
        self.plan.outputs.get(output).and_then(|(_, labels)| labels.as_deref())
    }
}

impl Plan {
    /// Each picture's readings of the model's `outputs` (one row per picture).
    fn read(&self, outputs: &[Tensor], geometries: &[Geometry]) -> Result<Vec<Picture>, TaskError> {
        let pictures = geometries.len();
        let mut answers: Vec<Picture> = geometries
            .iter()
            .map(|g| Picture { width: g.width, height: g.height, readings: Vec::with_capacity(outputs.len()) })
            .collect();
        for (output, (config, labels)) in outputs.iter().zip(&self.outputs) {
            let kind = config.as_ref().map_or(OutputKind::Raw, |c| c.kind);
            let labels = labels.as_deref();
            let rows = match kind {
                OutputKind::Raw => output
                    .split_rows(&vec![1; pictures])
                    .and_then(|rows| rows.into_iter().map(without_batch).collect::<Result<Vec<_>, _>>())
                    .map_err(|e| TaskError::Internal(e.to_string()))?
                    .into_iter()
                    .map(Reading::Tensor)
                    .collect::<Vec<_>>(),
                OutputKind::Classification | OutputKind::Detection => {
                    let config = config.as_ref().expect("a post-processed output has its config: this is a bug");
                    let values = readings::floats(output)?;
                    let per_row = values.len() / pictures.max(1);
                    let mut rows = Vec::with_capacity(pictures);
                    for (row, geometry) in values.chunks(per_row.max(1)).zip(geometries) {
                        rows.push(match kind {
                            OutputKind::Classification => Reading::Classes(readings::classify(row, config, labels)),
                            _ => {
                                let dims = (output.shape()[1], output.shape()[2]);
                                Reading::Boxes(readings::detect(row, dims, config, labels, geometry)?)
                            }
                        });
                    }
                    rows
                }
            };
            if rows.len() != pictures {
                return Err(TaskError::Internal(format!(
                    "an output of shape {:?} has no row for each of the {pictures} pictures",
                    output.shape()
                )));
            }
            for (answer, reading) in answers.iter_mut().zip(rows) {
                answer.readings.push(reading);
            }
        }
        Ok(answers)
    }
}
