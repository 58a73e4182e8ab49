//! A model's task: what it does with a request before the batcher (the client's form → the engine's tensors) and
//! after it (the engine's outputs → the answer). Protocols decode into a [`Request`] and encode an [`Answer`];
//! they never see a task's insides. A new task is one new type implementing [`Task`], and one line in [`for_model`].

mod embed;
mod image;
mod score;
mod tensors;
mod text;

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferd_batcher::InferRequest;
use inferd_core::{ModelConfig, ModelMetadata, Tensor};

pub use self::embed::{EmbedTask, TEXT_INPUT};
pub use self::image::{file_from_base64, triton_classification, Class, Detection, ImageTask, Picture, Reading};
pub use self::score::{ScoreTask, QUERY_INPUT, SCORES_OUTPUT, SCORE_OUTPUT};
pub use self::tensors::TensorTask;

/// Holds `bytes` more of the server's in-flight budget for a request, or refuses it.
pub type Reserve = Arc<dyn Fn(usize) -> Result<(), TaskError> + Send + Sync>;

/// What a client asks of a model, in the form a protocol decoded it into.
pub struct Request {
    pub input: Input,
    /// The latest instant the request may start running.
    pub deadline: Option<Instant>,
    /// Called by a task before it allocates much for the request (a decoded picture); none: nothing is counted.
    pub reserve: Option<Reserve>,
}

impl Request {
    pub fn new(input: Input) -> Self {
        Request { input, deadline: None, reserve: None }
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

/// The forms a request's input comes in.
#[derive(Debug)]
pub enum Input {
    /// Tensors in the order of the task's [`Task::metadata`] inputs, each already checked against its spec (data
    /// type and shape) by the protocol's decoder. A text model's is one `BYTES` input of texts.
    Tensors(Vec<Tensor>),
    /// Texts, or token ids, to embed, as the text protocols send them.
    Text(TextInput),
    /// Texts, or pairs of texts, to score: a reranker's (query, passage) pairs, a classifier's texts.
    Score(TextInput),
    /// Encoded pictures (JPEG, PNG, …) for a vision model, as sent.
    Images(Vec<bytes::Bytes>),
}

/// Texts to embed or score, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct TextInput {
    pub texts: Texts,
    /// Cut texts longer than the model takes (`false`: refuse them).
    pub truncate: bool,
    /// Cut a long text's start rather than its end (a pair: still the second text first).
    pub truncate_left: bool,
    /// Unit-length embeddings; `None`: as the model says.
    pub normalize: Option<bool>,
    /// The embedding's length the client asked for; `None`: the model's own.
    pub dimensions: Option<usize>,
    /// A scoring model's logits as they are, rather than as probabilities.
    pub raw_scores: bool,
    /// An embedding model's vector for each token, unpooled and as the encoder left it, rather than one per text:
    /// the answer is one FP32 `[tokens, dim]` tensor per text, special tokens included.
    pub per_token: bool,
}

impl TextInput {
    pub fn new(texts: Texts) -> Self {
        TextInput {
            texts,
            truncate: true,
            truncate_left: false,
            normalize: None,
            dimensions: None,
            raw_scores: false,
            per_token: false,
        }
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
#[derive(Debug)]
pub struct Answer {
    /// In the order of the task's [`Task::metadata`] outputs; for [`TextInput::per_token`], one per text.
    pub tensors: Vec<Tensor>,
    /// Text models: the tokens the request took, special tokens included; 0 otherwise.
    pub tokens: usize,
    /// Vision models sent [`Input::Images`]: each picture's readings of the outputs (labels, boxes); empty otherwise.
    pub pictures: Vec<Picture>,
}

impl Answer {
    /// An answer of tensors alone.
    pub fn tensors(tensors: Vec<Tensor>, tokens: usize) -> Self {
        Answer { tensors, tokens, pictures: Vec::new() }
    }
}

/// The step after the batcher, made by the step before it: it holds what the answer needs from the request.
pub type Finish = Box<dyn FnOnce(Vec<Tensor>) -> Result<Answer, TaskError> + Send>;

/// A request made ready for the batcher, and how its outputs become the answer.
pub struct Prepared {
    pub request: InferRequest,
    pub finish: Finish,
    /// How long each named step of preparing took (a vision model's `decode` and `resize`), for the metrics.
    pub stages: Vec<(&'static str, Duration)>,
    /// Whether the task has already held the request's tensors against the in-flight budget (through
    /// [`Request::reserve`], before it made them), so that they are not counted twice.
    pub counted: bool,
}

impl Prepared {
    pub fn new(request: InferRequest, finish: Finish) -> Self {
        Prepared { request, finish, stages: Vec::new(), counted: false }
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

    /// Whether [`Task::prepare`] is CPU work that must leave an async runtime's threads (tokenizing).
    fn prepare_is_heavy(&self) -> bool {
        false
    }

    /// The step before the batcher: `request` as the batcher's request, with at most `max_rows` rows (texts
    /// count as rows), and the step after it. May block when [`Task::prepare_is_heavy`].
    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError>;

    /// Whether the model takes pictures (a vision model): the seed API then reads pictures from its body.
    fn takes_images(&self) -> bool {
        false
    }

    /// The class names of output `output` (by its index in [`Task::metadata`]), if the model has them.
    fn labels(&self, _output: usize) -> Option<&[String]> {
        None
    }

    /// Each text's tokens as the model's tokenizer makes them, with its special tokens when `special`. Blocking.
    fn tokenize(&self, _texts: &[String], _special: bool) -> Result<Vec<Vec<Token>>, TaskError> {
        Err(TaskError::Invalid("it takes tensors, not text: it has no tokenizer".into()))
    }

    /// The text that token `ids` stand for, without special tokens when `skip_special`. Blocking.
    fn decode(&self, _ids: &[u32], _skip_special: bool) -> Result<String, TaskError> {
        Err(TaskError::Invalid("it takes tensors, not text: it has no tokenizer".into()))
    }
}

/// The task of a model whose engines report `engine` as their metadata: the one place that picks a task.
/// Blocking (a text model's tokenizer is read).
pub fn for_model(config: &ModelConfig, engine: &ModelMetadata) -> anyhow::Result<Arc<dyn Task>> {
    Ok(match config.task {
        inferd_core::Task::Tensors if config.image.is_some() => Arc::new(ImageTask::load(config, engine)?),
        inferd_core::Task::Tensors => Arc::new(TensorTask::new(engine.clone())),
        inferd_core::Task::Embed => Arc::new(EmbedTask::load(engine)?),
        inferd_core::Task::Rerank => Arc::new(ScoreTask::load(engine, true)?),
        inferd_core::Task::Classify => Arc::new(ScoreTask::load(engine, false)?),
    })
}
