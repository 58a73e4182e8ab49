//! CLIP and SigLIP (`[candle] architecture = "clip"`, `task = "embed"`): pictures and texts into one space. A picture
//! is decoded and made into pixel values as the folder's `preprocessor_config.json` says (or `model.toml`'s
//! `[image]`) and runs on the model's own engines; a text is tokenized and runs on its text towers
//! ([`Tower::Text`]), batched apart. Both answer as the embed task does: one vector each, cut to the dimensions asked
//! for, unit length unless the request or `model.toml` says otherwise. The tensor protocols send texts as the
//! optional `BYTES` input `text`, or pictures' files as the optional `BYTES` input `image`: one of the two.

use std::sync::Arc;

use anyhow::Context;
use inferd_core::text::Contract;
use inferd_core::{Backend, DataType, ImageConfig, ModelConfig, ModelMetadata, TensorSpec, PROCESSOR_CONFIG_FILE};

use super::embed::{dimensions, shape_vectors, EmbedTask, Normalize};
use super::image::ImageTask;
use super::{Input, Prepared, Registration, Request, Service, Task, TaskError, TextFront, Tower, TEXT_INPUT};

/// The name of a model of two towers' input of pictures on the tensor protocols: each element a picture's file
/// (JPEG, PNG, …; in base64 where the protocol's JSON carries it).
pub const IMAGE_INPUT: &str = "image";

pub(super) const REGISTRATION: Registration = Registration {
    service: Service::Embed,
    contracts: &[Contract::Pooled],
    load: |config: &ModelConfig, pictures: &ModelMetadata, texts: Option<&ModelMetadata>| {
        let texts = texts.context("its engine has no text tower: this is a bug")?;
        Ok(Arc::new(ClipTask::load(config, pictures, texts)?))
    },
};

/// Whether `config` is a model of two towers, pictures and texts (CLIP, SigLIP).
pub(super) fn two_towers(config: &ModelConfig) -> bool {
    config.backend == Backend::Candle && config.candle.as_ref().is_some_and(|c| c.architecture == "clip")
}

/// A model that embeds pictures and texts into one space.
#[derive(Debug)]
pub struct ClipTask {
    pictures: ImageTask,
    texts: EmbedTask,
    /// Its face on the tensor protocols: texts or pictures in, the embedding out.
    public: ModelMetadata,
}

impl ClipTask {
    /// The task of a model whose engines report `pictures` and whose text towers report `texts`. Blocking.
    pub fn load(config: &ModelConfig, pictures: &ModelMetadata, texts: &ModelMetadata) -> anyhow::Result<ClipTask> {
        let mut config = config.clone();
        if config.image.is_none() {
            let input = pictures.inputs.first().context("its engine takes no picture: this is a bug")?;
            let processor = config.dir.join(PROCESSOR_CONFIG_FILE);
            let image = ImageConfig::from_processor(&processor, &input.name).with_context(|| {
                format!("its pictures are made as {PROCESSOR_CONFIG_FILE} says, or as model.toml's [image] does")
            })?;
            config.image = Some(image);
        }
        let texts = EmbedTask::load(texts)?;
        let mut public = texts.metadata().clone();
        let bytes =
            |name: &str| TensorSpec { name: name.into(), datatype: DataType::Bytes, shape: vec![-1], optional: true };
        public.inputs = vec![bytes(TEXT_INPUT), bytes(IMAGE_INPUT)];
        Ok(ClipTask { pictures: ImageTask::load(&config, pictures)?, texts, public })
    }
}

impl Task for ClipTask {
    fn metadata(&self) -> &ModelMetadata {
        &self.public
    }

    fn service(&self) -> Service {
        REGISTRATION.service
    }

    fn takes_pictures(&self) -> bool {
        true
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError> {
        let Request { input, options, deadline, reserve } = request;
        // A tensor protocol's request is one tower's: its one input becomes that task's own.
        let (input, pictures) = match input {
            Input::Tensors(tensors) => match <[_; 2]>::try_from(tensors) {
                Ok([Some(text), None]) => (Input::Tensors(vec![Some(text)]), false),
                Ok([None, Some(image)]) => (Input::Tensors(vec![Some(image)]), true),
                Ok([Some(_), Some(_)]) => {
                    return Err(TaskError::Invalid(format!(
                        "inputs `{TEXT_INPUT}` and `{IMAGE_INPUT}`: send one of the two, as texts and pictures run \
                         on different towers"
                    )))
                }
                _ => {
                    return Err(TaskError::Invalid(format!(
                        "missing input: `{TEXT_INPUT}` (texts) or `{IMAGE_INPUT}` (pictures' files)"
                    )))
                }
            },
            input @ Input::Images(_) => (input, true),
            input => (input, false),
        };
        let request = Request { input, options, deadline, reserve };
        if !pictures {
            let mut prepared = self.texts.prepare(request, max_rows)?;
            prepared.tower = Tower::Text;
            return Ok(prepared);
        }
        // The text tower's settings say the vectors' length, and whether they are normalised unless a request says.
        let info = self.texts.info();
        let full = info.dimensions;
        let dimensions = dimensions(&request.options, full)?;
        let normalize = request.options.get::<Normalize>().map_or(info.normalize, |n| n.0);
        let mut prepared = self.pictures.prepare(request, max_rows)?;
        // The picture task reads its answer from the vectors as they will be answered.
        let finish = prepared.finish;
        prepared.finish = Box::new(move |outputs| finish(shape_vectors(outputs, dimensions, full, normalize)?));
        Ok(prepared)
    }

    fn tokenizer(&self) -> Option<&TextFront> {
        self.texts.tokenizer()
    }
}
