//! A tokenizer's model, shared by the text front's tokenizers, and a WordPiece vocabulary kept compact.
//!
//! The tokenizers library keeps a WordPiece vocabulary as two hash maps, token to id and id to token, each entry an
//! owned `String`: for BERT's 30,522 tokens about 5.7 MB, nearly all of it the maps' 65,536 slots of 32 bytes each.
//! [`WordPieceVocab`] holds the same vocabulary as one string of every token's text, where each token ends, and a
//! table of ids found by hash: about 0.7 MB, and it tokenizes as the library's WordPiece does (tested word for word
//! against it). Other models (BPE, Unigram, WordLevel) stay the library's own.

use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::models::TrainerWrapper;
use tokenizers::{Model, ModelWrapper, TruncationDirection};

/// A tokenizer's model behind an `Arc`: cloning it clones a pointer.
#[derive(Clone, Debug)]
pub struct SharedModel(pub(super) Arc<Held>);

/// The model as it is held.
#[derive(Debug)]
pub(super) enum Held {
    WordPiece(WordPieceVocab),
    Library(ModelWrapper),
}

impl SharedModel {
    fn new(model: ModelWrapper) -> SharedModel {
        let held = match &model {
            ModelWrapper::WordPiece(wordpiece) => WordPieceVocab::new(wordpiece).map(Held::WordPiece),
            _ => None,
        };
        SharedModel(Arc::new(held.unwrap_or_else(|| Held::Library(model))))
    }

    /// The text a word's later pieces start with ("##" in BERT's), and the unknown token, where the model has them.
    pub fn subword_prefix_and_unk(&self) -> (Option<String>, Option<String>) {
        match &*self.0 {
            Held::WordPiece(m) => (Some(m.continuing_subword_prefix.clone()), Some(m.unk_token.clone())),
            Held::Library(ModelWrapper::WordPiece(m)) => {
                (Some(m.continuing_subword_prefix.clone()), Some(m.unk_token.clone()))
            }
            Held::Library(ModelWrapper::BPE(m)) => (m.continuing_subword_prefix.clone(), m.unk_token.clone()),
            Held::Library(ModelWrapper::WordLevel(m)) => (None, Some(m.unk_token.clone())),
            Held::Library(ModelWrapper::Unigram(_)) => (None, None),
        }
    }

    /// The model as `dyn Model`, for the calls both kinds answer alike.
    fn model(&self) -> &dyn Model<Trainer = TrainerWrapper> {
        match &*self.0 {
            Held::WordPiece(m) => m,
            Held::Library(m) => m,
        }
    }
}

/// Read as the library's model, then held compact where it is a WordPiece one: `tokenizer.json` loads straight into
/// the shared model, with no second copy of the vocabulary.
impl<'de> serde::Deserialize<'de> for SharedModel {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SharedModel, D::Error> {
        ModelWrapper::deserialize(deserializer).map(SharedModel::new)
    }
}

impl Model for SharedModel {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<tokenizers::Token>> {
        self.model().tokenize(sequence)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.model().token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.model().id_to_token(id)
    }

    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        self.model().get_vocab()
    }

    fn get_vocab_size(&self) -> usize {
        self.model().get_vocab_size()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.model().save(folder, prefix)
    }

    fn get_trainer(&self) -> TrainerWrapper {
        self.model().get_trainer()
    }

    fn tokenize_in_pretokenized(
        &self,
        pretokenized: &mut tokenizers::PreTokenizedString,
        truncation: Option<(usize, TruncationDirection)>,
    ) -> tokenizers::Result<()> {
        self.model().tokenize_in_pretokenized(pretokenized, truncation)
    }
}

/// A WordPiece vocabulary whose ids are 0 to n − 1, each token's text stored once.
pub(super) struct WordPieceVocab {
    /// Every token's text, in id order, one after another.
    text: Box<str>,
    /// Where each token's text ends in `text`; it starts where the one before ends.
    ends: Box<[u32]>,
    /// The ids, found by their text's hash.
    ids: HashTable<u32>,
    hasher: DefaultHashBuilder,
    unk_token: String,
    continuing_subword_prefix: String,
    max_input_chars_per_word: usize,
}

impl std::fmt::Debug for WordPieceVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordPieceVocab").field("tokens", &self.ends.len()).finish_non_exhaustive()
    }
}

impl WordPieceVocab {
    /// `model`'s vocabulary, compact; `None` where its ids are not 0 to n − 1 each once, or its text would not fit
    /// 32-bit offsets (the library's model is kept then).
    fn new(model: &WordPiece) -> Option<WordPieceVocab> {
        let vocab = model.get_vocab();
        let mut by_id: Vec<Option<&str>> = vec![None; vocab.len()];
        for (token, &id) in &vocab {
            let slot = by_id.get_mut(usize::try_from(id).ok()?)?;
            if slot.replace(token.as_str()).is_some() {
                return None;
            }
        }
        let mut text = String::with_capacity(vocab.keys().map(String::len).sum());
        let mut ends = Vec::with_capacity(by_id.len());
        for token in by_id {
            text.push_str(token?);
            ends.push(u32::try_from(text.len()).ok()?);
        }
        let mut compact = WordPieceVocab {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
            ids: HashTable::with_capacity(vocab.len()),
            hasher: DefaultHashBuilder::default(),
            unk_token: model.unk_token.clone(),
            continuing_subword_prefix: model.continuing_subword_prefix.clone(),
            max_input_chars_per_word: model.max_input_chars_per_word,
        };
        for id in 0..compact.ends.len() as u32 {
            let hash = compact.hasher.hash_one(compact.token(id)?);
            let WordPieceVocab { ids, text, ends, hasher, .. } = &mut compact;
            ids.insert_unique(hash, id, |&id| hasher.hash_one(token_in(text, ends, id).unwrap_or_default()));
        }
        Some(compact)
    }

    /// Token `id`'s text.
    fn token(&self, id: u32) -> Option<&str> {
        token_in(&self.text, &self.ends, id)
    }

    /// The id of the token whose text is `token`.
    fn id(&self, token: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(token);
        self.ids.find(hash, |&id| self.token(id) == Some(token)).copied()
    }

    /// The unknown token standing for the whole of a word of `len` bytes.
    fn unknown(&self, len: usize) -> tokenizers::Result<Vec<tokenizers::Token>> {
        let id = self.id(&self.unk_token).ok_or(tokenizers::models::wordpiece::Error::MissingUnkToken)?;
        Ok(vec![tokenizers::Token { value: self.unk_token.clone(), id, offsets: (0, len) }])
    }
}

/// Token `id`'s text in `text`, where `ends` says where each token ends.
fn token_in<'a>(text: &'a str, ends: &[u32], id: u32) -> Option<&'a str> {
    let id = usize::try_from(id).ok()?;
    let end = *ends.get(id)? as usize;
    let start = match id {
        0 => 0,
        _ => ends[id - 1] as usize,
    };
    text.get(start..end)
}

/// WordPiece as the library's: each word is cut greedily into the longest pieces the vocabulary holds, every piece
/// after the first looked up with the subword prefix; a word with a part no piece covers, or longer than
/// `max_input_chars_per_word` characters, is the unknown token.
impl Model for WordPieceVocab {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<tokenizers::Token>> {
        if sequence.chars().count() > self.max_input_chars_per_word {
            return self.unknown(sequence.len());
        }
        let mut pieces = Vec::new();
        let mut prefixed = String::new();
        let mut start = 0;
        while start < sequence.len() {
            let mut end = sequence.len();
            let found = loop {
                if end <= start {
                    break None;
                }
                let piece = &sequence[start..end];
                let key = match start {
                    0 => piece,
                    _ => {
                        prefixed.clear();
                        prefixed.push_str(&self.continuing_subword_prefix);
                        prefixed.push_str(piece);
                        &prefixed
                    }
                };
                if let Some(id) = self.id(key) {
                    break Some(tokenizers::Token { value: key.to_owned(), id, offsets: (start, end) });
                }
                end -= piece.chars().next_back().map_or(1, char::len_utf8);
            };
            match found {
                Some(token) => pieces.push(token),
                None => return self.unknown(sequence.len()),
            }
            start = end;
        }
        Ok(pieces)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.token(id).map(str::to_owned)
    }

    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        (0..self.ends.len() as u32).filter_map(|id| Some((self.token(id)?.to_owned(), id))).collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.ends.len()
    }

    /// `vocab.txt` (or `PREFIX-vocab.txt`) in `folder`: a token a line, in id order, as the library writes it.
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        let path = folder.join(match prefix {
            Some(prefix) => format!("{prefix}-vocab.txt"),
            None => "vocab.txt".to_owned(),
        });
        let mut lines = String::with_capacity(self.text.len() + self.ends.len());
        for token in (0..self.ends.len() as u32).filter_map(|id| self.token(id)) {
            lines.push_str(token);
            lines.push('\n');
        }
        std::fs::write(&path, lines)?;
        Ok(vec![path])
    }

    fn get_trainer(&self) -> TrainerWrapper {
        WordPieceTrainer::builder().build().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's WordPiece model in the bundled MiniLM's `tokenizer.json` (scripts/setup.sh unpacks it).
    fn minilm() -> WordPiece {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/minilm/tokenizer.json");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).expect("models/minilm")).expect("json");
        match serde_json::from_value(json["model"].clone()).expect("a model") {
            ModelWrapper::WordPiece(model) => model,
            other => panic!("MiniLM's model is WordPiece, not {other:?}"),
        }
    }

    /// Words to tokenize: each token of the vocabulary with and without its subword prefix, joins of random
    /// tokens (which split into several pieces, or have a part no piece covers), words in other scripts, and words
    /// past the longest a word may be.
    fn words(vocab: &WordPiece) -> Vec<String> {
        // In id order, so that the random joins are the same on every run.
        let tokens: Vec<String> = (0..vocab.get_vocab_size() as u32).filter_map(|id| vocab.id_to_token(id)).collect();
        let mut words: Vec<String> = tokens.iter().map(|t| t.trim_start_matches("##").to_owned()).collect();
        words.extend(tokens.iter().cloned());
        let mut rng = fastrand::Rng::with_seed(47);
        for _ in 0..20_000 {
            let n = rng.usize(2..5);
            words.push((0..n).map(|_| tokens[rng.usize(..tokens.len())].trim_start_matches("##")).collect());
        }
        words.extend(["", "ü", "naïve", "東京タワー", "🦀rust🦀", "a\u{301}"].map(str::to_owned));
        words.extend(["x".repeat(100), "x".repeat(101), "é".repeat(100), "é".repeat(101), "unbelievable".repeat(9)]);
        words
    }

    /// What a tokenizer's caller reads of each token.
    fn seen(tokens: &[tokenizers::Token]) -> Vec<(String, u32, (usize, usize))> {
        tokens.iter().map(|t| (t.value.clone(), t.id, t.offsets)).collect()
    }

    #[test]
    fn a_compact_wordpiece_tokenizes_every_word_as_the_library_does() {
        let library = minilm();
        let compact = WordPieceVocab::new(&library).expect("MiniLM's ids are 0 to n - 1");
        assert_eq!(compact.get_vocab_size(), library.get_vocab_size());
        assert_eq!(compact.get_vocab(), library.get_vocab());
        let words = words(&library);
        assert!(words.len() > 80_000, "{}", words.len());
        let mut pieces = 0;
        for word in &words {
            let expected = library.tokenize(word).expect("the library tokenizes");
            let got = compact.tokenize(word).expect("the compact model tokenizes");
            assert_eq!(seen(&got), seen(&expected), "{word:?}");
            pieces += got.len();
        }
        // The joins split: far more pieces than words.
        assert!(pieces > words.len() + 20_000, "{pieces} pieces of {} words", words.len());
        for id in [0, 100, 101, 7_592, library.get_vocab_size() as u32 - 1, library.get_vocab_size() as u32] {
            assert_eq!(compact.id_to_token(id), library.id_to_token(id), "id {id}");
        }
        for token in ["[UNK]", "[CLS]", "hello", "##ing", "not a token"] {
            assert_eq!(compact.token_to_id(token), library.token_to_id(token), "{token:?}");
        }
    }

    #[test]
    fn a_compact_wordpiece_saves_the_vocabulary_the_library_would() {
        let library = minilm();
        let compact = WordPieceVocab::new(&library).expect("compact");
        let dir = tempfile::tempdir().expect("tempdir");
        let saved = compact.save(dir.path(), Some("compact")).expect("saved");
        let expected = library.save(dir.path(), None).expect("saved");
        let read = |paths: Vec<PathBuf>| std::fs::read(&paths[0]).expect("read");
        assert_eq!(read(saved), read(expected));
    }

    #[test]
    fn a_vocabulary_whose_ids_skip_stays_the_librarys() {
        let json = serde_json::json!({
            "type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "a": 1, "##b": 3},
        });
        let shared: SharedModel = serde_json::from_value(json).expect("a model");
        let Held::Library(ModelWrapper::WordPiece(library)) = &*shared.0 else {
            panic!("{shared:?} is not the library's")
        };
        assert!(WordPieceVocab::new(library).is_none());
        assert_eq!(shared.tokenize("ab").expect("tokenized").len(), 2);
        assert_eq!(shared.subword_prefix_and_unk(), (Some("##".to_owned()), Some("[UNK]".to_owned())));
    }

    /// A small vocabulary of `tokens` (ids in order), with `prefix`, `max` characters a word, and no unknown token
    /// unless listed: read the way `tokenizer.json` is, as the shared model and as the library's.
    fn small(tokens: &[&str], prefix: &str, max: usize) -> (SharedModel, WordPiece) {
        let vocab: serde_json::Map<String, serde_json::Value> =
            tokens.iter().enumerate().map(|(id, t)| ((*t).to_owned(), id.into())).collect();
        let json = serde_json::json!({
            "type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": prefix,
            "max_input_chars_per_word": max, "vocab": vocab,
        });
        let shared: SharedModel = serde_json::from_value(json.clone()).expect("the shared model");
        let ModelWrapper::WordPiece(library) = serde_json::from_value(json).expect("the library's") else {
            panic!("a WordPiece model")
        };
        (shared, library)
    }

    #[test]
    fn a_dense_vocabulary_is_held_compact_with_its_own_prefix_limit_and_unknown_token() {
        let (shared, library) = small(&["[UNK]", "un", "ü", "→able", "→ü", "a", "→a"], "→", 6);
        assert!(matches!(&*shared.0, Held::WordPiece(_)), "{shared:?}");
        for word in ["unable", "unü", "üü", "aaaaaa", "aaaaaaa", "unx", "", "ü→a"] {
            let got = shared.tokenize(word).expect("tokenized");
            let expected = library.tokenize(word).expect("tokenized");
            assert_eq!(seen(&got), seen(&expected), "{word:?}");
        }
        assert_eq!(shared.tokenize("unable").expect("tokenized").len(), 2);
        assert_eq!(shared.subword_prefix_and_unk(), (Some("→".to_owned()), Some("[UNK]".to_owned())));
        // Without the unknown token, a word it would stand for is the library's error, and other words are fine.
        let (shared, library) = small(&["un", "→able"], "→", 6);
        assert!(matches!(&*shared.0, Held::WordPiece(_)), "{shared:?}");
        for word in ["unx", "unable"] {
            let got = shared.tokenize(word).map_err(|e| e.to_string());
            let expected = library.tokenize(word).map_err(|e| e.to_string());
            assert_eq!(got.as_ref().map(Vec::len), expected.as_ref().map(Vec::len), "{word:?}");
        }
        let missing = shared.tokenize("unx").expect_err("no unknown token");
        assert!(missing.downcast_ref::<tokenizers::models::wordpiece::Error>().is_some(), "{missing}");
        assert_eq!(shared.tokenize("unable").expect("covered").len(), 2);
    }
}
