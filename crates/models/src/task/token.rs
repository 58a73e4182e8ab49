//! The token classification task (named entities): texts in, tokenized with each token's span in characters; the
//! engine's per-token logits become probabilities, and the tokens become entities as transformers'
//! `TokenClassificationPipeline` makes them (the Hugging Face Inference API's answer): each token with its best label
//! (`none`), runs of tokens of one label grouped (`simple`), or tokens first merged into words whose label comes
//! from their first token, their average or their most certain token (`first`, `average`, `max`), then grouped.
//! Labels in `ignore_labels` (default `O`) are left out. Entities are made where a request asks for them with an
//! [`Aggregation`] (its answer's payload, `Vec<Vec<Entity>>`). On the tensor protocols it takes `text` (`BYTES`) and
//! gives each token's probabilities, `token_scores` (`FP32 [texts, tokens, labels]`, zero past a text's own tokens),
//! and `token_count` (`INT64 [texts]`).

use std::sync::Arc;

use inferd_batcher::InferRequest;
use inferd_core::text::Contract;
use inferd_core::{DataType, ModelConfig, ModelMetadata, Tensor, TensorSpec};
use tokenizers::{Decoder, Encoding};

use super::text::{single_texts, text_face, TextFront};
use super::{Answer, Prepared, Registration, Request, Service, Task, TaskError, Texts};

pub(super) const REGISTRATION: Registration = Registration {
    service: Service::TokenClassify,
    contracts: &[Contract::TokenScores],
    load: |_: &ModelConfig, engine: &ModelMetadata, _: Option<&ModelMetadata>| Ok(Arc::new(TokenTask::load(engine)?)),
};

/// Each token's probabilities on the tensor protocols: `FP32 [texts, tokens, labels]`.
pub const TOKEN_SCORES_OUTPUT: &str = "token_scores";
/// Each text's count of tokens on the tensor protocols (special tokens included): `INT64 [texts]`.
pub const TOKEN_COUNT_OUTPUT: &str = "token_count";

/// How tokens become entities, as transformers' pipeline names its strategies; a request with one is answered its
/// entities. The Inference API's default is `simple`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Every token with its best label (`entity`) and its position (`index`).
    None,
    /// Tokens grouped while their labels continue one entity (`B-PER`, `I-PER`, …).
    #[default]
    Simple,
    /// Tokens merged into words labelled as their first token, then grouped.
    First,
    /// Tokens merged into words labelled by their tokens' average probabilities, then grouped.
    Average,
    /// Tokens merged into words labelled as their most certain token, then grouped.
    Max,
}

impl Aggregation {
    /// The names a request may give, in any case.
    pub const NAMES: [&'static str; 5] = ["none", "simple", "first", "average", "max"];

    pub fn as_str(self) -> &'static str {
        match self {
            Aggregation::None => "none",
            Aggregation::Simple => "simple",
            Aggregation::First => "first",
            Aggregation::Average => "average",
            Aggregation::Max => "max",
        }
    }

    /// Whether its entities are groups (`entity_group`) rather than single tokens (`entity`, `index`).
    pub fn groups(self) -> bool {
        self != Aggregation::None
    }
}

impl std::str::FromStr for Aggregation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" => Aggregation::None,
            "simple" => Aggregation::Simple,
            "first" => Aggregation::First,
            "average" => Aggregation::Average,
            "max" => Aggregation::Max,
            _ => {
                return Err(format!(
                    "aggregation_strategy: `{s}` is not one of {}",
                    Aggregation::NAMES.map(|n| format!("`{n}`")).join(", ")
                ))
            }
        })
    }
}

/// The labels whose entities are left out of the answer (default `["O"]`): a token's full label with
/// [`Aggregation::None`], a group's entity (the label without its `B-`/`I-`) otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoreLabels(pub Vec<String>);

/// One entity: a token, a word or a group of them, with its label and its span in the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Entity {
    /// A token's label (`B-PER`), or a group's entity (`PER`).
    pub label: String,
    /// The label's probability; a group's: its members' mean.
    pub score: f32,
    /// The tokens' text as the tokenizer's decoder writes them (lowercased by an uncased model, say): the exact text
    /// is `start..end`.
    pub word: String,
    /// The span in the text, in characters (Unicode code points), end exclusive.
    pub start: usize,
    pub end: usize,
    /// A token's position in the tokenized text, special tokens included ([`Aggregation::None`] only).
    pub index: Option<usize>,
}

/// A loaded token classifier.
pub struct TokenTask {
    front: TextFront,
    words: Words,
    public: ModelMetadata,
}

impl std::fmt::Debug for TokenTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenTask").field("info", self.front.info()).finish_non_exhaustive()
    }
}

/// How the tokenizer tells words apart and writes them.
#[derive(Clone)]
struct Words {
    /// A word-aware tokenizer's prefix of a word's later pieces (WordPiece's `##`); `None`: the position in the
    /// text decides (a piece not after a space continues a word).
    prefix: Option<String>,
    /// The unknown token: it stands for its text, and is never a piece of a word.
    unk: Option<u32>,
    /// Tokens' strings as the tokenizer's decoder joins them.
    decode: Arc<dyn Fn(Vec<String>) -> String + Send + Sync>,
}

impl TokenTask {
    /// Loads the tokenizer a token classifier's engine metadata names. Blocking.
    pub fn load(engine: &ModelMetadata) -> anyhow::Result<TokenTask> {
        let front = TextFront::load(engine)?;
        let tokenizer = front.tokenizer();
        let (prefix, unk) = tokenizer.get_model().subword_prefix_and_unk();
        let decoder = tokenizer.get_decoder().cloned();
        let decode = move |tokens: Vec<String>| match &decoder {
            Some(d) => d.decode(tokens.clone()).unwrap_or_else(|_| tokens.join(" ")),
            None => tokens.join(" "),
        };
        let words = Words {
            prefix: prefix.filter(|p| !p.is_empty()),
            unk: unk.and_then(|t| tokenizer.token_to_id(&t)),
            decode: Arc::new(decode),
        };
        let labels = front.info().labels.len() as i64;
        let public = text_face(
            engine,
            vec![
                TensorSpec {
                    name: TOKEN_SCORES_OUTPUT.into(),
                    datatype: DataType::Fp32,
                    shape: vec![-1, -1, labels],
                    optional: false,
                },
                TensorSpec {
                    name: TOKEN_COUNT_OUTPUT.into(),
                    datatype: DataType::Int64,
                    shape: vec![-1],
                    optional: false,
                },
            ],
        );
        Ok(TokenTask { front, words, public })
    }
}

impl Task for TokenTask {
    fn metadata(&self) -> &ModelMetadata {
        &self.public
    }

    fn service(&self) -> Service {
        REGISTRATION.service
    }

    fn prepare_is_heavy(&self) -> bool {
        true
    }

    fn prepare(&self, request: Request, max_rows: usize) -> Result<Prepared, TaskError> {
        let input = single_texts(request.input, REGISTRATION.service)?;
        let Texts::Strings(texts) = &input.texts else {
            return Err(TaskError::Invalid("it classifies the tokens of single texts: send texts".into()));
        };
        // Entities are made where the request asks for them (its protocol answers them), and only then are the
        // tokens' spans in the text worked out.
        let strategy = request.options.get::<Aggregation>().copied();
        let encodings = self.front.encodings(&input, max_rows, "classify", strategy.is_some())?;
        let sequences = encodings.iter().map(|e| self.front.sequence_of(e)).collect::<Result<Vec<_>, _>>()?;
        let tokens = encodings.iter().map(|e| e.get_ids().len()).sum();
        let ignore = request.options.get::<IgnoreLabels>().map_or_else(|| vec!["O".to_owned()], |i| i.0.clone());
        let labels = self.front.info().labels.clone();
        let (texts, words) = (texts.clone(), self.words.clone());
        Ok(Prepared::new(
            InferRequest::sequences(sequences, Contract::TokenScores)
                .with_deadline(request.deadline)
                .with_pieces_apart(),
            Box::new(move |logits| {
                if logits.len() != encodings.len() {
                    return Err(TaskError::Internal(format!("{} answers for {} texts", logits.len(), texts.len())));
                }
                let mut probabilities = Vec::with_capacity(texts.len());
                let mut entities = Vec::with_capacity(texts.len());
                for ((logits, encoding), text) in logits.iter().zip(&encodings).zip(&texts) {
                    let scores = softmax_rows(logits, encoding.get_ids().len(), labels.len())?;
                    if let Some(strategy) = strategy {
                        let tokens = Tokens::of(encoding, text, &scores, labels.len());
                        entities.push(tokens.entities(&words, &labels, strategy, &ignore));
                    }
                    probabilities.push(scores);
                }
                let answer = Answer::tensors(padded(&probabilities, labels.len())?, tokens);
                Ok(if strategy.is_some() { answer.with_payload(entities) } else { answer })
            }),
        ))
    }

    fn tokenizer(&self) -> Option<&TextFront> {
        Some(&self.front)
    }
}

/// The softmax over the labels of the first `len` positions of one text's logits `FP32 [1, seq, labels]`.
fn softmax_rows(logits: &Tensor, len: usize, labels: usize) -> Result<Vec<f32>, TaskError> {
    let &[1, seq, width] = logits.shape() else {
        return Err(TaskError::Internal(format!("per-token logits came back as {:?}", logits.shape())));
    };
    if width != labels || len > seq {
        return Err(TaskError::Internal(format!("logits [{seq}, {width}] for {len} tokens of {labels} labels")));
    }
    let mut values = logits.to_vec::<f32>().map_err(|e| TaskError::Internal(e.to_string()))?;
    values.truncate(len * labels);
    for row in values.chunks_exact_mut(labels.max(1)) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row.iter_mut().for_each(|v| *v = (*v - max).exp());
        let sum: f32 = row.iter().sum();
        row.iter_mut().for_each(|v| *v /= sum);
    }
    Ok(values)
}

/// The tensor protocols' outputs: each text's probabilities padded with zeros to the longest, and the counts.
fn padded(probabilities: &[Vec<f32>], labels: usize) -> Result<Vec<Tensor>, TaskError> {
    let internal = |e: inferd_core::Error| TaskError::Internal(e.to_string());
    let counts: Vec<i64> = probabilities.iter().map(|p| (p.len() / labels.max(1)) as i64).collect();
    let longest = counts.iter().copied().max().unwrap_or(0) as usize;
    let mut values = vec![0f32; probabilities.len() * longest * labels];
    for (text, p) in values.chunks_exact_mut((longest * labels).max(1)).zip(probabilities) {
        text[..p.len()].copy_from_slice(p);
    }
    Ok(vec![
        Tensor::from_slice(vec![probabilities.len(), longest, labels], &values).map_err(internal)?,
        Tensor::from_slice(vec![counts.len()], &counts).map_err(internal)?,
    ])
}

/// One text's tokens as the pipeline reads them.
struct Tokens<'a> {
    text: Vec<char>,
    tokens: &'a [String],
    ids: &'a [u32],
    offsets: &'a [(usize, usize)],
    special: &'a [u32],
    /// `[tokens, labels]` probabilities.
    scores: &'a [f32],
    labels: usize,
}

/// A token before aggregation (transformers' "pre-entity"), or a word once tokens are merged.
struct Piece {
    word: String,
    /// The label's index and probability.
    label: usize,
    score: f32,
    start: usize,
    end: usize,
    index: Option<usize>,
}

impl<'a> Tokens<'a> {
    fn of(encoding: &'a Encoding, text: &str, scores: &'a [f32], labels: usize) -> Self {
        Tokens {
            text: text.chars().collect(),
            tokens: encoding.get_tokens(),
            ids: encoding.get_ids(),
            offsets: encoding.get_offsets(),
            special: encoding.get_special_tokens_mask(),
            scores,
            labels,
        }
    }

    /// The text's entities: tokens (or words) with their best labels, grouped as `strategy` says, those whose label
    /// is in `ignore` left out.
    fn entities(&self, words: &Words, labels: &[String], strategy: Aggregation, ignore: &[String]) -> Vec<Entity> {
        // The real tokens: their strings, spans, whether each continues a word, and their probabilities.
        let mut real = Vec::with_capacity(self.tokens.len());
        for (i, token) in self.tokens.iter().enumerate() {
            if self.special.get(i) == Some(&1) {
                continue;
            }
            let (start, end) = self.offsets.get(i).copied().unwrap_or_default();
            let span: String = self.text.get(start..end.max(start)).unwrap_or_default().iter().collect();
            let unknown = words.unk.is_some() && self.ids.get(i).copied() == words.unk;
            let continues = !unknown
                && match &words.prefix {
                    // A word-aware tokenizer marks a word's later pieces: they are longer than the text they cover.
                    Some(_) => token.chars().count() != span.chars().count(),
                    // Otherwise a piece continues a word unless it follows a space or starts with one.
                    None => {
                        start > 0
                            && !self
                                .text
                                .get(start - 1..(start + 1).min(self.text.len()))
                                .is_some_and(|c| c.contains(&' '))
                    }
                };
            let scores = self.scores.get(i * self.labels..(i + 1) * self.labels).unwrap_or_default();
            let word = if unknown { span } else { token.clone() };
            real.push((Piece { word, label: 0, score: 0.0, start, end, index: Some(i) }, continues, scores));
        }
        let pieces: Vec<Piece> = match strategy {
            Aggregation::None | Aggregation::Simple => real
                .into_iter()
                .map(|(piece, _, scores)| {
                    let (label, score) = best(scores);
                    Piece { label, score, ..piece }
                })
                .collect(),
            _ => {
                let mut merged = Vec::new();
                let mut word: Vec<(Piece, &[f32])> = Vec::new();
                for (piece, continues, scores) in real {
                    if !word.is_empty() && !continues {
                        merged.push(merge(std::mem::take(&mut word), words, strategy));
                    }
                    word.push((piece, scores));
                }
                if !word.is_empty() {
                    merged.push(merge(word, words, strategy));
                }
                merged
            }
        };
        let name = |p: &Piece| labels.get(p.label).map_or("", String::as_str);
        if strategy == Aggregation::None {
            return pieces
                .into_iter()
                .map(|p| Entity {
                    label: name(&p).to_owned(),
                    score: p.score,
                    word: p.word,
                    start: p.start,
                    end: p.end,
                    index: p.index,
                })
                .filter(|e| !ignore.contains(&e.label))
                .collect();
        }
        let mut groups: Vec<Entity> = Vec::new();
        let mut group: Vec<Piece> = Vec::new();
        for piece in pieces {
            if let Some(last) = group.last() {
                let ((bi, tag), (_, last_tag)) = (tag_of(name(&piece)), tag_of(name(last)));
                if tag != last_tag || bi == 'B' {
                    groups.push(entity_group(std::mem::take(&mut group), labels, words));
                }
            }
            group.push(piece);
        }
        if !group.is_empty() {
            groups.push(entity_group(group, labels, words));
        }
        groups.retain(|g| !ignore.contains(&g.label));
        groups
    }
}

/// The best label's index and probability (the first on a tie).
fn best(scores: &[f32]) -> (usize, f32) {
    scores.iter().copied().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, s)| if s > b.1 { (i, s) } else { b })
}

/// A word of tokens, labelled as `strategy` says.
fn merge(tokens: Vec<(Piece, &[f32])>, words: &Words, strategy: Aggregation) -> Piece {
    let (label, score) = match strategy {
        Aggregation::Max => {
            let most = tokens.iter().map(|(_, s)| *s).fold(None, |m: Option<&[f32]>, s| match m {
                Some(m) if best(m).1 >= best(s).1 => Some(m),
                _ => Some(s),
            });
            best(most.unwrap_or_default())
        }
        Aggregation::Average => {
            let n = tokens.len() as f32;
            let width = tokens.first().map_or(0, |(_, s)| s.len());
            let mean: Vec<f32> = (0..width).map(|l| tokens.iter().map(|(_, s)| s[l]).sum::<f32>() / n).collect();
            best(&mean)
        }
        _ => best(tokens.first().map(|(_, s)| *s).unwrap_or_default()),
    };
    let start = tokens.first().map_or(0, |(p, _)| p.start);
    let end = tokens.last().map_or(0, |(p, _)| p.end);
    let word = (words.decode)(tokens.into_iter().map(|(p, _)| p.word).collect());
    Piece { word, label, score, start, end, index: None }
}

/// A group of tokens or words as one entity: the first's label without its `B-`/`I-`, the mean score, the span from
/// the first to the last.
fn entity_group(members: Vec<Piece>, labels: &[String], words: &Words) -> Entity {
    let label = labels.get(members[0].label).map(String::as_str).unwrap_or_default();
    let label = label.split_once('-').map_or(label, |(_, rest)| rest).to_owned();
    let score = members.iter().map(|p| p.score).sum::<f32>() / members.len() as f32;
    let (start, end) = (members[0].start, members[members.len() - 1].end);
    let word = (words.decode)(members.into_iter().map(|p| p.word).collect());
    Entity { label, score, word, start, end, index: None }
}

/// A label's place in an entity and its tag: `B-X` begins X, `I-X` continues it, and a label without either
/// continues itself.
fn tag_of(label: &str) -> (char, &str) {
    match (label.strip_prefix("B-"), label.strip_prefix("I-")) {
        (Some(tag), _) => ('B', tag),
        (_, Some(tag)) => ('I', tag),
        _ => ('I', label),
    }
}

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;
