//! What every text task shares before the batcher: the model's tokenizer, texts (or pairs of texts, or token ids)
//! turned into one token sequence each in the engine's input order, the limits checked on the way, and the
//! tokenizer's own services (`/tokenize`, `/decode`). Tokenizing is CPU work: callers run it off the async runtime.

use inferd_core::text::{TextInfo, ATTENTION_MASK, INPUT_IDS};
use inferd_core::{DataType, ModelMetadata, Tensor, TensorSpec};

use tokenizers::{
    DecoderWrapper, EncodeInput, Encoding, NormalizerWrapper, PostProcessor, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerImpl, TruncationDirection, TruncationParams, TruncationStrategy,
};

use super::vocab::SharedModel;
use super::{refused, Input, Service, TaskError, TextInput, Texts, Token, TEXT_INPUT};

/// A tokenizer whose model (its vocabulary) is shared with its copies: [`TextFront`] keeps five that differ only in
/// how they truncate (benches/README.md, "MiniLM's idle memory").
pub type TextTokenizer =
    TokenizerImpl<SharedModel, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// A text model's tokenizer and limits.
pub struct TextFront {
    /// Neither pads nor truncates: the batcher pads, and truncation is asked per request.
    tokenizer: TextTokenizer,
    /// Truncates at `max_seq_len`, the longer text of a pair first: cutting the end, then the start.
    truncating: [TextTokenizer; 2],
    /// Truncates a pair's second text (the passage) alone, so the query stays whole where it can: cutting the end,
    /// then the start.
    truncating_second: [TextTokenizer; 2],
    pub(super) info: TextInfo,
    vocab_size: usize,
    /// The engine's token inputs, in its order.
    inputs: Vec<String>,
}

impl std::fmt::Debug for TextFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextFront").field("info", &self.info).finish_non_exhaustive()
    }
}

impl TextFront {
    /// Loads the tokenizer a text engine's metadata names. Blocking.
    pub(super) fn load(engine: &ModelMetadata) -> anyhow::Result<TextFront> {
        let info = engine.text.clone().ok_or_else(|| anyhow::anyhow!("the engine is not a text model's"))?;
        let path = &info.tokenizer;
        let failed = |e: tokenizers::Error| anyhow::anyhow!("tokenizer {}: {e}", path.display());
        let mut tokenizer = TextTokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("cannot read the tokenizer {}: {e}", path.display()))?;
        // A hub tokenizer.json may pad to a fixed length and truncate at its own: both are inferd's to decide.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(failed)?;
        // The library takes the special tokens from the length it truncates at without checking for room: a length
        // that leaves a pair's text none is refused here, where the library's subtraction would underflow.
        let special = tokenizer.get_post_processor().map_or(0, |p| p.added_tokens(true));
        if info.max_seq_len <= special {
            anyhow::bail!(
                "max_seq_len {} leaves no room for text beside the {special} special tokens of {}",
                info.max_seq_len,
                path.display()
            );
        }
        let truncating_at = |strategy, direction| {
            let mut t = tokenizer.clone();
            t.with_truncation(Some(TruncationParams {
                max_length: info.max_seq_len,
                strategy,
                direction,
                ..TruncationParams::default()
            }))
            .map_err(failed)?;
            anyhow::Ok(t)
        };
        let both = |strategy| {
            anyhow::Ok([
                truncating_at(strategy, TruncationDirection::Right)?,
                truncating_at(strategy, TruncationDirection::Left)?,
            ])
        };
        let truncating = both(TruncationStrategy::LongestFirst)?;
        let truncating_second = both(TruncationStrategy::OnlySecond)?;
        let vocab_size = info.vocab_size.unwrap_or_else(|| tokenizer.get_vocab_size(true));
        Ok(TextFront {
            tokenizer,
            truncating,
            truncating_second,
            vocab_size,
            inputs: engine.inputs.iter().map(|s| s.name.clone()).collect(),
            info,
        })
    }

    /// One token sequence per text (or pair), and the tokens they hold, within `max_rows` texts. `what` names the
    /// work in errors ("embed"). Blocking.
    pub(super) fn sequences(
        &self,
        input: &TextInput,
        max_rows: usize,
        what: &str,
    ) -> Result<(Vec<Vec<Tensor>>, usize), TaskError> {
        let count = counted(input, max_rows, what)?;
        let mut sequences = Vec::with_capacity(count);
        let mut tokens = 0usize;
        let mut push = |ids: &[u32], types: &[u32]| -> Result<(), TaskError> {
            tokens += ids.len();
            sequences.push(self.sequence(ids, types)?);
            Ok(())
        };
        match &input.texts {
            Texts::Strings(_) | Texts::Pairs(_) => {
                for encoding in self.encodings(input, max_rows, what, false)? {
                    push(encoding.get_ids(), encoding.get_type_ids())?;
                }
            }
            Texts::Ids(lists) => {
                // Refuses a prompt named with token ids.
                self.prompt(input)?;
                let max = self.info.max_seq_len;
                for (i, ids) in lists.iter().enumerate() {
                    if ids.is_empty() {
                        return Err(TaskError::Invalid(format!("token list {i} is empty: there is nothing to {what}")));
                    }
                    self.check_ids(ids, &format!("token list {i}"))?;
                    let ids = match (ids.len() > max && input.truncate, input.truncate_left) {
                        (true, false) => &ids[..max],
                        (true, true) => &ids[ids.len() - max..],
                        (false, _) => &ids[..],
                    };
                    if ids.len() > max {
                        return Err(TaskError::Invalid(format!(
                            "token list {i} is {} tokens long; this model takes at most {max}",
                            ids.len()
                        )));
                    }
                    push(ids, &vec![0; ids.len()])?;
                }
            }
        }
        Ok((sequences, tokens))
    }

    /// Each text's (or pair's) tokens, within `max_rows` texts, truncated as `input` asks, with character offsets
    /// into the text when `offsets` (else none are worked out). `what` names the work in errors. Blocking.
    pub(super) fn encodings(
        &self,
        input: &TextInput,
        max_rows: usize,
        what: &str,
        offsets: bool,
    ) -> Result<Vec<Encoding>, TaskError> {
        counted(input, max_rows, what)?;
        let prompt = self.prompt(input)?;
        match &input.texts {
            Texts::Strings(texts) => texts
                .iter()
                .enumerate()
                .map(|(i, text)| match (text.is_empty(), prompt) {
                    (true, _) => Err(TaskError::Invalid(format!("text {i} is empty: there is nothing to {what}"))),
                    (false, None) => self.encode(text.as_str().into(), input, i, offsets),
                    // Tokenized with the text as one string, as sentence-transformers does.
                    (false, Some(prompt)) => self.encode(format!("{prompt}{text}").into(), input, i, offsets),
                })
                .collect(),
            Texts::Pairs(pairs) => pairs
                .iter()
                .enumerate()
                .map(|(i, (first, second))| {
                    if first.is_empty() || second.is_empty() {
                        let which = if first.is_empty() { "first" } else { "second" };
                        return Err(TaskError::Invalid(format!("pair {i}: its {which} text is empty")));
                    }
                    self.encode((first.as_str(), second.as_str()).into(), input, i, offsets)
                })
                .collect(),
            Texts::Ids(_) => Err(TaskError::Invalid(format!(
                "it needs the texts to {what}, not token ids: their words and spans are read from the text"
            ))),
        }
    }

    /// The prompt to put before each of `input`'s texts: the one it names, or the model's default. A name the model
    /// does not have is refused with the names it has; so is a name given with pairs or token ids, which take no
    /// prompt.
    fn prompt(&self, input: &TextInput) -> Result<Option<&str>, TaskError> {
        self.prompt_named(input.prompt_name.as_deref(), matches!(input.texts, Texts::Strings(_)))
    }

    /// The prompt named `name` (or the default) for single texts (`single`), or for pairs or ids.
    fn prompt_named(&self, name: Option<&str>, single: bool) -> Result<Option<&str>, TaskError> {
        let prompts = &self.info.prompts;
        let Some(name) = name else {
            return Ok(match single {
                true => self.info.default_prompt.as_ref().and_then(|n| prompts.get(n)).map(String::as_str),
                false => None,
            });
        };
        if !single {
            return Err(TaskError::Invalid(format!(
                "prompt_name `{name}`: a prompt goes before single texts, not pairs or token ids"
            )));
        }
        match prompts.get(name) {
            Some(prompt) => Ok(Some(prompt.as_str())),
            None if prompts.is_empty() => Err(TaskError::Invalid(format!(
                "prompt_name `{name}`: this model has no prompts (its folder has no config_sentence_transformers.json \
                 naming any); put the prompt's text before the input instead"
            ))),
            // TEI's words: tei-client's `prompt_names()` reads the list from this message.
            None => Err(TaskError::Invalid(format!(
                "prompt_name `{name}` is not one of this model's prompts. Available prompts: [{}]",
                prompts.keys().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// One sequence's token inputs `[1, len]` for an encoding, in the engine's order.
    pub(super) fn sequence_of(&self, encoding: &Encoding) -> Result<Vec<Tensor>, TaskError> {
        self.sequence(encoding.get_ids(), encoding.get_type_ids())
    }

    /// The tokenizer itself, neither padding nor truncating.
    pub(super) fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// How many tokenizers hold the one model.
    #[cfg(test)]
    pub(super) fn model_holders(&self) -> usize {
        std::sync::Arc::strong_count(&self.tokenizer.get_model().0)
    }

    /// The model's text settings, as its engine reports them.
    pub fn info(&self) -> &TextInfo {
        &self.info
    }

    /// Tokenizes text (or pair) `i`, truncated at the model's length as `how` asks; refused when longer. With
    /// `offsets`, each token's span in characters.
    fn encode(&self, input: EncodeInput<'_>, how: &TextInput, i: usize, offsets: bool) -> Result<Encoding, TaskError> {
        let pair = matches!(input, EncodeInput::Dual(..));
        let invalid = |e: tokenizers::Error| TaskError::Invalid(format!("text {i} cannot be tokenized: {e}"));
        let side = usize::from(how.truncate_left);
        let run = |tokenizer: &TextTokenizer, input: EncodeInput<'_>| match offsets {
            true => tokenizer.encode_char_offsets(input, true),
            false => tokenizer.encode_fast(input, true),
        };
        let encoding = match (how.truncate, pair) {
            (false, _) => run(&self.tokenizer, input),
            (true, false) => run(&self.truncating[side], input),
            // Cut the passage; where the query alone is too long, cut the longer of the two.
            (true, true) => {
                run(&self.truncating_second[side], input.clone()).or_else(|_| run(&self.truncating[side], input))
            }
        }
        .map_err(invalid)?;
        let (len, max) = (encoding.get_ids().len(), self.info.max_seq_len);
        if len == 0 {
            // A tokenizer without special tokens may read nothing in a text of spaces: nothing to run.
            return Err(TaskError::Invalid(format!("text {i} has no tokens for this model's tokenizer")));
        }
        if len > max {
            let what = if pair { "pair" } else { "text" };
            return Err(TaskError::Invalid(format!(
                "{what} {i} is {len} tokens long; this model takes at most {max} (send \"truncate\": true to cut it)"
            )));
        }
        Ok(encoding)
    }

    /// Refuses an id outside the vocabulary.
    fn check_ids(&self, ids: &[u32], what: &str) -> Result<(), TaskError> {
        match ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            Some(bad) => Err(TaskError::Invalid(format!(
                "{what}: id {bad} is outside the model's vocabulary of {} tokens",
                self.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// One sequence's token inputs `[1, len]`, in the engine's order.
    fn sequence(&self, ids: &[u32], types: &[u32]) -> Result<Vec<Tensor>, TaskError> {
        let len = ids.len();
        self.inputs
            .iter()
            .map(|name| {
                let values: Vec<i64> = match name.as_str() {
                    INPUT_IDS => ids.iter().map(|&i| i64::from(i)).collect(),
                    ATTENTION_MASK => vec![1; len],
                    _ => types.iter().map(|&i| i64::from(i)).collect(),
                };
                Tensor::from_slice(vec![1, len], &values).map_err(|e| TaskError::Internal(e.to_string()))
            })
            .collect()
    }

    /// Each text's tokens, with the special tokens when `special`, untruncated. Blocking.
    pub fn tokens(
        &self,
        texts: &[String],
        special: bool,
        prompt_name: Option<&str>,
    ) -> Result<Vec<Vec<Token>>, TaskError> {
        let prompt = self.prompt_named(prompt_name, true)?;
        texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                // With the prompt, as the text is embedded: spans are then in the prompted text.
                let text = match prompt {
                    Some(prompt) => format!("{prompt}{text}"),
                    None => text.clone(),
                };
                // `encode`, not `encode_fast`: the spans are wanted here.
                let encoding = self
                    .tokenizer
                    .encode(text.as_str(), special)
                    .map_err(|e| TaskError::Invalid(format!("text {i} cannot be tokenized: {e}")))?;
                let special_mask = encoding.get_special_tokens_mask();
                Ok(encoding
                    .get_ids()
                    .iter()
                    .zip(encoding.get_tokens())
                    .zip(encoding.get_offsets())
                    .zip(special_mask)
                    .map(|(((&id, token), &(start, stop)), &s)| {
                        let special = s == 1;
                        // A text's token is shown as the span of the text it covers (byte offsets).
                        let span = text.get(start..stop).filter(|_| !special);
                        Token {
                            id,
                            text: span.map_or_else(|| token.clone(), str::to_owned),
                            special,
                            start: (!special).then_some(start),
                            stop: (!special).then_some(stop),
                        }
                    })
                    .collect())
            })
            .collect()
    }

    /// The text of token ids, without the special tokens when `skip_special`. Blocking.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TaskError> {
        self.check_ids(ids, "ids")?;
        self.tokenizer.decode(ids, skip_special).map_err(|e| TaskError::Invalid(format!("cannot decode: {e}")))
    }
}

/// How many texts `input` holds, or why they are too few (none) or too many (past `max_rows`).
fn counted(input: &TextInput, max_rows: usize, what: &str) -> Result<usize, TaskError> {
    match input.texts.len() {
        0 => Err(TaskError::Invalid(format!("no texts to {what}: the input is empty"))),
        count if count > max_rows => Err(TaskError::OverLimit(format!(
            "the request has {count} texts; this server takes at most {max_rows} per request (--max-rows)"
        ))),
        count => Ok(count),
    }
}

/// What a text model shows the tensor protocols, its engine being `engine`: one `BYTES` input of texts, `text`, and
/// the task's own `outputs`.
pub(super) fn text_face(engine: &ModelMetadata, outputs: Vec<TensorSpec>) -> ModelMetadata {
    let text = TensorSpec { name: TEXT_INPUT.into(), datatype: DataType::Bytes, shape: vec![-1], optional: false };
    ModelMetadata { inputs: vec![text], outputs, ..engine.clone() }
}

/// The single texts of a request to a task of `service` (an embedder, a token classifier): as a text protocol sent
/// them, or a tensor protocol's one `BYTES` input `text`; pairs of texts are refused, as is any other form.
pub(super) fn single_texts(input: Input, service: Service) -> Result<TextInput, TaskError> {
    let input = match input {
        Input::Texts(input) => input,
        Input::Tensors(tensors) => match tensors.as_slice() {
            [Some(t)] => TextInput::new(Texts::Strings(strings_of(t, TEXT_INPUT)?)),
            _ => return Err(TaskError::Invalid(format!("a text model takes one input, `{TEXT_INPUT}`"))),
        },
        other => return Err(refused(service, &other)),
    };
    match input.texts {
        Texts::Pairs(_) => Err(TaskError::Invalid(format!("it {}: it takes single texts, not pairs", service.does()))),
        _ => Ok(input),
    }
}

/// The texts of a request on a tensor protocol's `BYTES` input `name`, each element UTF-8.
pub(super) fn strings_of(tensor: &Tensor, name: &str) -> Result<Vec<String>, TaskError> {
    tensor
        .byte_strings()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            String::from_utf8(bytes.clone())
                .map_err(|_| TaskError::Invalid(format!("input `{name}`: element {i} is not UTF-8 text")))
        })
        .collect()
}
