//! A model's task: what it does with a request before the batcher (the client's form → the engine's tensors) and
//! after it (the engine's outputs → the answer), what it asks of the engine (its contracts), and what it serves.
//! Protocols decode into a [`Request`], ask the task what it serves ([`Service`]) rather than its name, and encode
//! an [`Answer`]; they never see a task's insides. A new task is one new type implementing [`Task`] with its
//! [`Registration`], one line in [`registration`], and its kind in `model.toml` (`inferd_core::Task`).

mod clip;
mod embed;
mod image;
mod score;
mod sparse;
mod tensors;
mod text;
mod token;
mod vocab;

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferd_batcher::InferRequest;
use inferd_core::text::Contract;
use inferd_core::{ModelConfig, ModelMetadata, Tensor, TensorSpec};

pub use self::clip::ClipTask;
pub use self::embed::{Dimensions, EmbedTask, Normalize, PerToken, TEXT_INPUT};
pub use self::image::{file_from_base64, triton_classification, Class, Detection, ImageTask, Picture, Reading};
pub use self::score::{RawScores, ScoreTask, QUERY_INPUT, SCORES_OUTPUT, SCORE_OUTPUT};
pub use self::sparse::SparseTask;
pub use self::tensors::TensorTask;
pub use self::text::TextFront;
pub use self::token::{Aggregation, Entity, IgnoreLabels, TokenTask};

/// Holds `bytes` more of the server's in-flight budget for a request, or refuses it.
pub type Reserve = Arc<dyn Fn(usize) -> Result<(), TaskError> + Send + Sync>;

/// What a model serves, as its task says: what the protocols ask of a model rather than the name of its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// Tensors in, tensors out.
    Tensors,
    /// Pictures in, each output read per picture (labels, boxes).
    Images,
    /// Texts in, one dense vector each.
    Embed,
    /// Texts in, one sparse vector of vocabulary weights each.
    EmbedSparse,
    /// A query and texts in, a relevance score per text.
    Rerank,
    /// Texts or pairs of texts in, a score per label each.
    Classify,
    /// Texts in, the labelled spans (entities) of each.
    TokenClassify,
}

impl Service {
    /// Every service.
    pub const ALL: [Service; 7] = [
        Service::Tensors,
        Service::Images,
        Service::Embed,
        Service::EmbedSparse,
        Service::Rerank,
        Service::Classify,
        Service::TokenClassify,
    ];

    /// What it does, in a message: "embeds text", "reranks text", ….
    pub fn does(self) -> &'static str {
        match self {
            Service::Tensors => "takes and gives tensors",
            Service::Images => "reads pictures",
            Service::Embed => "embeds text",
            Service::EmbedSparse => "gives sparse embeddings of text",
            Service::Rerank => "reranks text",
            Service::Classify => "classifies text",
            Service::TokenClassify => "classifies the tokens of text",
        }
    }

    /// What it does, as an infinitive: "embed text", "rerank text", ….
    pub fn action(self) -> &'static str {
        match self {
            Service::Tensors => "take tensors",
            Service::Images => "read pictures",
            Service::Embed => "embed text",
            Service::EmbedSparse => "give sparse embeddings",
            Service::Rerank => "rerank text",
            Service::Classify => "classify text",
            Service::TokenClassify => "classify tokens",
        }
    }

    /// Whether it takes texts, which the server tokenizes.
    pub fn takes_text(self) -> bool {
        !matches!(self, Service::Tensors | Service::Images)
    }
}

/// How a kind of model is served: what it serves, what it asks of its engine, and how its task is made.
#[derive(Clone, Copy)]
pub struct Registration {
    pub service: Service,
    /// A text engine's contracts: the first it must compute, the others where it can. None: a tensor model.
    pub contracts: &'static [Contract],
    /// Makes the task of a model configured by the config and run by engines of the metadata (and, for a model of
    /// two towers, text towers of the second). Blocking.
    load: Load,
}

/// How a registration makes a task: from the model's configuration, its engines' metadata and, for a model of two
/// towers, its text towers'.
type Load = fn(&ModelConfig, &ModelMetadata, Option<&ModelMetadata>) -> anyhow::Result<Arc<dyn Task>>;

/// How the model `config` describes is served: the one place that picks a task.
pub fn registration(config: &ModelConfig) -> Registration {
    use inferd_core::Task as Kind;
    match config.task {
        Kind::Tensors if config.image.is_some() => image::REGISTRATION,
        Kind::Tensors => tensors::REGISTRATION,
        Kind::Embed if clip::two_towers(config) => clip::REGISTRATION,
        Kind::Embed => embed::REGISTRATION,
        Kind::EmbedSparse => sparse::REGISTRATION,
        Kind::Rerank => score::RERANK,
        Kind::Classify => score::CLASSIFY,
        Kind::TokenClassify => token::REGISTRATION,
    }
}

/// The task of a model whose engines report `engine` as their metadata (and a model of two towers, whose text
/// towers report `texts`). Blocking (a text model's tokenizer is read).
pub fn for_model(
    config: &ModelConfig,
    engine: &ModelMetadata,
    texts: Option<&ModelMetadata>,
) -> anyhow::Result<Arc<dyn Task>> {
    (registration(config).load)(config, engine, texts)
}

/// What a client asks of a model, in the form a protocol decoded it into.
pub struct Request {
    pub input: Input,
    /// What the client asked of the task beyond its input, by type (see [`Options`]).
    pub options: Options,
    /// The latest instant the request may start running.
    pub deadline: Option<Instant>,
    /// Called by a task before it allocates much for the request (a decoded picture); none: nothing is counted.
    pub reserve: Option<Reserve>,
}

impl Request {
    pub fn new(input: Input) -> Self {
        Request { input, options: Options::default(), deadline: None, reserve: None }
    }

    /// With `option` among its options (replacing one of its type).
    pub fn with<T: Any + Send>(mut self, option: T) -> Self {
        self.options.insert(option);
        self
    }

    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    pub fn with_reserve(mut self, reserve: Reserve) -> Self {
        self.reserve = Some(reserve);
        self
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("input", &self.input).field("deadline", &self.deadline).finish_non_exhaustive()
    }
}

/// A request's options, by type: each task defines the options it reads (embed's [`Dimensions`], token
/// classification's [`Aggregation`], …), and a protocol sets those of the service it speaks for. A task never sees
/// an option of a type it does not define.
#[derive(Default)]
pub struct Options(Vec<Box<dyn Any + Send>>);

impl Options {
    /// Sets `option`, replacing one of its type.
    pub fn insert<T: Any + Send>(&mut self, option: T) {
        self.0.retain(|o| !o.is::<T>());
        self.0.push(Box::new(option));
    }

    /// The option of type `T`, if it was set.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.iter().find_map(|o| o.downcast_ref::<T>())
    }
}

/// The forms a request's input comes in.
#[derive(Debug)]
pub enum Input {
    /// Tensors in the order of the task's [`Task::metadata`] inputs, each already checked against its spec (data
    /// type and shape) by the protocol's decoder; `None` for an optional input the client left out. A text model's
    /// are `BYTES` inputs of texts.
    Tensors(Vec<Option<Tensor>>),
    /// Texts (or pairs of texts, or token ids), as the text protocols send them.
    Texts(TextInput),
    /// Encoded pictures (JPEG, PNG, …) for a vision model, as sent.
    Images(Vec<bytes::Bytes>),
}

impl Input {
    /// What it holds, in a message.
    fn holds(&self) -> &'static str {
        match self {
            Input::Tensors(_) => "tensors",
            Input::Texts(_) => "text",
            Input::Images(_) => "pictures",
        }
    }
}

/// A tensor request's inputs, for a task that needs every one of its `specs`.
fn every_input(tensors: Vec<Option<Tensor>>, specs: &[TensorSpec]) -> Result<Vec<Tensor>, TaskError> {
    tensors
        .into_iter()
        .zip(specs)
        .map(|(t, spec)| t.ok_or_else(|| TaskError::Invalid(format!("missing input `{}`", spec.name))))
        .collect()
}

/// Why `service` refuses `input`: the client sent a form it does not take.
fn refused(service: Service, input: &Input) -> TaskError {
    TaskError::Invalid(format!("it {}: it takes no {}", service.does(), input.holds()))
}

/// Texts and how a text model takes them: what every text task reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TextInput {
    pub texts: Texts,
    /// Cut texts longer than the model takes (`false`: refuse them).
    pub truncate: bool,
    /// Cut a long text's start rather than its end (a pair: still the second text first).
    pub truncate_left: bool,
    /// The model's prompt to put before each text (sentence-transformers' `prompt_name`); `None`: its default
    /// prompt, if it has one.
    pub prompt_name: Option<String>,
}

impl TextInput {
    pub fn new(texts: Texts) -> Self {
        TextInput { texts, truncate: true, truncate_left: false, prompt_name: None }
    }
}

/// Texts, or the token ids a client tokenized itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Texts {
    Strings(Vec<String>),
    /// Used as they are (OpenAI's lists of token ids).
    Ids(Vec<Vec<u32>>),
    /// Pairs tokenized together, with the tokenizer's segment ids: (query, passage), (premise, hypothesis).
    Pairs(Vec<(String, String)>),
}

impl Texts {
    pub fn len(&self) -> usize {
        match self {
            Texts::Strings(t) => t.len(),
            Texts::Ids(i) => i.len(),
            Texts::Pairs(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One token of a tokenized text, as `/tokenize` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    pub text: String,
    /// A special token the tokenizer added (`[CLS]`, `[SEP]`), which has no place in the text.
    pub special: bool,
    /// The token's byte span in the text; `None` for a special token.
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

/// A model's answer to one request.
pub struct Answer {
    /// In the order of the task's [`Task::metadata`] outputs (what the tensor protocols answer), or as the task's
    /// service says (an embedder's vectors per token: one tensor per text).
    pub tensors: Vec<Tensor>,
    /// Text models: the tokens the request took, special tokens included; 0 otherwise.
    pub tokens: usize,
    /// What the task's service answers beyond tensors (a vision model's readings of each picture, a token
    /// classifier's entities), of the task's own type: its protocol reads it with [`Answer::payload`].
    payload: Option<Box<dyn Any + Send>>,
}

impl Answer {
    /// An answer of tensors alone.
    pub fn tensors(tensors: Vec<Tensor>, tokens: usize) -> Self {
        Answer { tensors, tokens, payload: None }
    }

    /// With the service's own answer beside the tensors.
    pub fn with_payload<T: Any + Send>(mut self, payload: T) -> Self {
        self.payload = Some(Box::new(payload));
        self
    }

    /// The service's own answer, if the task gave one of type `T`.
    pub fn payload<T: Any>(&self) -> Option<&T> {
        self.payload.as_ref().and_then(|p| p.downcast_ref::<T>())
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer").field("tensors", &self.tensors).field("tokens", &self.tokens).finish_non_exhaustive()
    }
}

/// The step after the batcher, made by the step before it: it holds what the answer needs from the request.
pub type Finish = Box<dyn FnOnce(Vec<Tensor>) -> Result<Answer, TaskError> + Send>;

/// Which of a model's engines runs a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tower {
    /// The model's own.
    #[default]
    Main,
    /// A model of two towers' text tower ([`inferd_core::Engine::text_tower`]), batched apart.
    Text,
}

/// A request made ready for the batcher, and how its outputs become the answer.
pub struct Prepared {
    pub request: InferRequest,
    pub finish: Finish,
    /// The engines that run it.
    pub tower: Tower,
    /// How long each named step of preparing took (a vision model's `decode` and `resize`), for the metrics.
    pub stages: Vec<(&'static str, Duration)>,
    /// Whether the task has already held the request's tensors against the in-flight budget (through
    /// [`Request::reserve`], before it made them), so that they are not counted twice.
    pub counted: bool,
}

impl Prepared {
    pub fn new(request: InferRequest, finish: Finish) -> Self {
        Prepared { request, finish, tower: Tower::Main, stages: Vec::new(), counted: false }
    }

    /// A text request's token sequences (each its token inputs `[1, len]`), for the engine benchmark.
    pub fn into_sequences(self) -> Option<Vec<Vec<Tensor>>> {
        match self.request.inputs {
            inferd_batcher::Inputs::Sequences(sequences) => Some(sequences),
            inferd_batcher::Inputs::Rows(_) => None,
        }
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("request", &self.request).finish_non_exhaustive()
    }
}

/// Why a task refused a request, or could not answer it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The request does not fit the task: the client's fault.
    #[error("{0}")]
    Invalid(String),
    /// The request holds more than the server takes.
    #[error("{0}")]
    OverLimit(String),
    /// The server is too busy for the request now: worth retrying.
    #[error("{0}")]
    Busy(String),
    /// The answer could not be made: ours.
    #[error("{0}")]
    Internal(String),
}

/// What a model does with requests, around its batcher. Shared by every request to the model.
pub trait Task: Send + Sync + std::fmt::Debug {
    /// The model as the tensor protocols show it (a text model: texts in, embeddings out).
    fn metadata(&self) -> &ModelMetadata;

    /// What it serves: what the protocols ask of it.
    fn service(&self) -> Service;

    /// Whether it takes pictures ([`Input::Images`]): a vision model's, or a model of two towers' beside its texts.
    fn takes_pictures(&self) -> bool {
        self.service() == Service::Images
    }

    /// Whether [`Task::prepare`] is CPU work that must leave an async runtime's threads (tokenizing).
    fn prepare_is_heavy(&self) -> bool {
        false
    }

    /// The step before the batcher: `request` as the batcher's request, with at most `max_rows` rows (texts
    /// count as rows), and the step after it. May block when [`Task::prepare_is_heavy`].
    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError>;

    /// The class names of output `output` (by its index in [`Task::metadata`]), if the model has them.
    fn labels(&self, _output: usize) -> Option<&[String]> {
        None
    }

    /// A text model's tokenizer, for its own services (`/tokenize`, `/decode`).
    fn tokenizer(&self) -> Option<&TextFront> {
        None
    }
}
