//! `architecture = "bert"`: an encoder of BERT's family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT) from a folder in
//! the Hugging Face hub's layout (`config.json`, `model.safetensors`), computing the contracts it was asked for:
//! pooled vectors and each token's state (the encoder alone), the head of a `*ForSequenceClassification` model (one
//! row of logits per sequence) or of a `*ForTokenClassification` one (a row per token), or SPLADE's sparse weights
//! through the masked-LM head of a `*ForMaskedLM` model.
//!
//! The encoder layers are in `encoder.rs`, the configuration in `config.rs`. The additive attention mask is made in
//! F32 from the dtype's own lowest finite value and cast after (`f32::MIN` cast into FP16 or BF16 is −∞, and
//! `0 × −∞` would turn every unmasked score into NaN), so FP16 and BF16 compute as FP32 does. RoBERTa's family
//! differs from BERT only in where positions start (past the padding id), in having one token type, and in its head.
//! DistilBERT's layers are BERT's under other names (read through a renaming of its tensors), with no token types,
//! its own config keys and its own head.

mod config;
mod encoder;

use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Activation, Embedding, LayerNorm, Linear, VarBuilder};
use inferd_core::text::{is_roberta, Contract};
use inferd_core::{Error, Pooling, Result};

pub(crate) use config::Config;
use config::{distil_name, DISTILBERT};
use encoder::Encoder;

use crate::batch::Batch;
use crate::transformer::{last_linear, Dims, TextModel};

/// A loaded encoder and the heads it was asked for.
pub(crate) struct Bert {
    words: Embedding,
    positions: Embedding,
    /// `None` in DistilBERT, which has none.
    token_types: Option<Embedding>,
    norm: LayerNorm,
    encoder: Encoder,
    /// How a pooled vector is made from the last hidden state.
    pooling: Pooling,
    /// The contracts it computes, in the order it was asked for them.
    contracts: Vec<Contract>,
    sequence_head: Option<SequenceHead>,
    /// `*ForTokenClassification`: `classifier` on every token's state.
    token_head: Option<Linear>,
    mlm_head: Option<MlmHead>,
    /// The first position's index: 0 in BERT, `pad_token_id + 1` in RoBERTa's family.
    first_position: u32,
    pub(crate) config: Config,
}

/// The head of a `*ForSequenceClassification` model, on the first token's state.
enum SequenceHead {
    /// BERT's pooler (dense, tanh), then the classifier.
    Bert { pooler: Linear, classifier: Linear },
    /// RoBERTa's and XLM-RoBERTa's: dense, tanh, and the output projection.
    Roberta { dense: Linear, out_proj: Linear },
    /// DistilBERT's: pre_classifier, ReLU, and the classifier.
    Distil { pre_classifier: Linear, classifier: Linear },
}

/// The masked-LM head of a `*ForMaskedLM` model: a transform (dense, activation, LayerNorm) and the decoder onto the
/// vocabulary, whose weight is the word embeddings' where the checkpoint ties them (and stores none of its own).
struct MlmHead {
    dense: Linear,
    activation: Activation,
    norm: LayerNorm,
    /// The decoder's weight transposed, `[hidden, vocab]`, contiguous: a matrix product reads it as it is, where the
    /// tied `[vocab, hidden]` table would be copied into that layout on every batch.
    decoder_t: Tensor,
    /// `[vocab]`.
    bias: Tensor,
}

/// Which member of BERT's family a checkpoint is, from its `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Bert,
    Roberta,
    Distil,
}

impl Family {
    fn of(config: &Config) -> Family {
        match config.model_type.as_deref() {
            Some(t) if is_roberta(t) => Family::Roberta,
            Some(DISTILBERT) => Family::Distil,
            _ => Family::Bert,
        }
    }
}

/// The most logits a sparse run holds at once (rows × tokens × vocabulary): a batch's masked-LM logits are made and
/// reduced in slices of rows, so that a full token budget over a 30,522-token vocabulary (some 2 GB as FP32) never
/// exists at once.
const MAX_SPARSE_LOGITS: usize = 64 << 20;

impl Bert {
    /// Loads the weights of `file` (with or without the `bert.`, `roberta.` or `distilbert.` prefix) in `dtype` onto
    /// `device`, with the heads that `wants` needs; a contract whose head the checkpoint lacks fails the load.
    pub(crate) fn load(
        file: &Path,
        config: Config,
        wants: &[Contract],
        pooling: Pooling,
        dtype: DType,
        device: &Device,
    ) -> Result<Bert> {
        let weights = |e: candle_core::Error| Error::config(file, format!("cannot load the encoder's weights: {e}"));
        // SAFETY: as for the mlp: the map lives only while VarBuilder copies each tensor onto the device, and
        // inferd never writes model files.
        #[allow(unsafe_code)]
        let root = unsafe { VarBuilder::from_mmaped_safetensors(&[file], dtype, device) }.map_err(weights)?;
        let family = Family::of(&config);
        let root = match family {
            Family::Distil => root.rename_f(distil_name),
            _ => root,
        };
        let prefix = ["bert", "roberta", DISTILBERT]
            .into_iter()
            .find(|p| root.contains_tensor(&format!("{p}.embeddings.word_embeddings.weight")));
        let vb = match prefix {
            Some(p) => root.pp(p),
            None => root.clone(),
        };
        let e = vb.pp("embeddings");
        let (hidden, c) = (config.hidden_size, &config);
        let words = candle_nn::embedding(c.vocab_size, hidden, e.pp("word_embeddings")).map_err(weights)?;
        let wanted = |contract| wants.contains(&contract);
        let sequence_head = match wanted(Contract::SequenceScores) {
            false => None,
            true => Some(match family {
                Family::Distil => SequenceHead::Distil {
                    pre_classifier: candle_nn::linear(hidden, hidden, root.pp("pre_classifier")).map_err(weights)?,
                    classifier: last_linear(&root.pp("classifier"), hidden).map_err(weights)?,
                },
                Family::Roberta => {
                    let head = root.pp("classifier");
                    SequenceHead::Roberta {
                        dense: candle_nn::linear(hidden, hidden, head.pp("dense")).map_err(weights)?,
                        out_proj: last_linear(&head.pp("out_proj"), hidden).map_err(weights)?,
                    }
                }
                Family::Bert => SequenceHead::Bert {
                    pooler: candle_nn::linear(hidden, hidden, vb.pp("pooler").pp("dense")).map_err(weights)?,
                    classifier: last_linear(&root.pp("classifier"), hidden).map_err(weights)?,
                },
            }),
        };
        let token_head = match wanted(Contract::TokenScores) {
            false => None,
            true => Some(last_linear(&root.pp("classifier"), hidden).map_err(weights)?),
        };
        let mlm_head = match wanted(Contract::SparseWeights) {
            false => None,
            true => Some(MlmHead::load(&root, family, c, &words).map_err(weights)?),
        };
        Ok(Bert {
            positions: candle_nn::embedding(c.max_position_embeddings, hidden, e.pp("position_embeddings"))
                .map_err(weights)?,
            token_types: match family {
                Family::Distil => None,
                _ => Some(
                    candle_nn::embedding(c.type_vocab_size, hidden, e.pp("token_type_embeddings")).map_err(weights)?,
                ),
            },
            norm: candle_nn::layer_norm(hidden, c.layer_norm_eps, e.pp("LayerNorm")).map_err(weights)?,
            encoder: Encoder::load(vb.pp("encoder"), c).map_err(weights)?,
            words,
            pooling,
            contracts: wants.to_vec(),
            sequence_head,
            token_head,
            mlm_head,
            first_position: if family == Family::Roberta { c.pad_token_id as u32 + 1 } else { 0 },
            config,
        })
    }

    /// The encoder's last hidden state `[rows, seq, hidden]` in the model's dtype.
    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let first = self.first_position;
        let words = self.words.forward(&batch.ids)?;
        let words = match &self.token_types {
            Some(token_types) => (words + token_types.forward(&batch.types)?)?,
            None => words,
        };
        let embedded = (words + self.positions.forward(&batch.positions(first, first)?)?)?;
        let embedded = self.norm.forward(&embedded)?;
        self.encoder.forward(&embedded, batch.key_mask(embedded.dtype())?)
    }
}

impl TextModel for Bert {
    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn head_labels(&self) -> Option<usize> {
        let last = match (&self.sequence_head, &self.token_head) {
            (Some(SequenceHead::Bert { classifier: last, .. }), _)
            | (Some(SequenceHead::Roberta { out_proj: last, .. }), _)
            | (Some(SequenceHead::Distil { classifier: last, .. }), _)
            | (None, Some(last)) => last,
            (None, None) => return None,
        };
        last.weight().dim(0).ok()
    }

    fn dims(&self) -> Dims {
        // A model with one token type takes none from the tokenizer (RoBERTa's marks a pair's second text).
        Dims {
            hidden: self.config.hidden_size,
            vocab: self.config.vocab_size,
            token_types: self.config.type_vocab_size,
        }
    }

    fn run(&self, contract: Contract, batch: &Batch) -> candle_core::Result<Tensor> {
        let hidden = self.encode(batch)?;
        let first_token = || hidden.narrow(1, 0, 1)?.squeeze(1);
        let missing = || candle_core::Error::Msg(format!("this model has no head for {}", contract.as_str()));
        match contract {
            Contract::TokenStates => hidden.to_dtype(DType::F32),
            Contract::Pooled => crate::pool::pooled(&hidden, batch, self.pooling),
            Contract::SequenceScores => match self.sequence_head.as_ref().ok_or_else(missing)? {
                SequenceHead::Bert { pooler, classifier } => {
                    classifier.forward(&pooler.forward(&first_token()?)?.tanh()?)?.to_dtype(DType::F32)
                }
                SequenceHead::Roberta { dense, out_proj } => {
                    out_proj.forward(&dense.forward(&first_token()?)?.tanh()?)?.to_dtype(DType::F32)
                }
                SequenceHead::Distil { pre_classifier, classifier } => {
                    classifier.forward(&pre_classifier.forward(&first_token()?)?.relu()?)?.to_dtype(DType::F32)
                }
            },
            Contract::TokenScores => {
                self.token_head.as_ref().ok_or_else(missing)?.forward(&hidden)?.to_dtype(DType::F32)
            }
            Contract::SparseWeights => self.mlm_head.as_ref().ok_or_else(missing)?.sparse(&hidden, &batch.mask),
        }
    }
}

impl MlmHead {
    /// The head as each family names it: BERT's `cls.predictions.*`, RoBERTa's `lm_head.*`, DistilBERT's
    /// `vocab_transform`, `vocab_layer_norm` and `vocab_projector`.
    fn load(root: &VarBuilder, family: Family, config: &Config, words: &Embedding) -> candle_core::Result<MlmHead> {
        let hidden = config.hidden_size;
        let (dense, activation, norm, eps, decoder, bias) = match family {
            Family::Bert => (
                root.pp("cls.predictions.transform.dense"),
                config.hidden_act,
                root.pp("cls.predictions.transform.LayerNorm"),
                config.layer_norm_eps,
                root.pp("cls.predictions.decoder"),
                root.pp("cls.predictions"),
            ),
            // RoBERTa's head is exact GELU whatever the encoder's activation.
            Family::Roberta => (
                root.pp("lm_head.dense"),
                Activation::Gelu,
                root.pp("lm_head.layer_norm"),
                config.layer_norm_eps,
                root.pp("lm_head.decoder"),
                root.pp("lm_head"),
            ),
            Family::Distil => (
                root.pp("vocab_transform"),
                config.hidden_act,
                root.pp("vocab_layer_norm"),
                1e-12,
                root.pp("vocab_projector"),
                root.pp("vocab_projector"),
            ),
        };
        let vocab = config.vocab_size;
        // The decoder's weight is the word embeddings' unless the checkpoint stores its own (untied).
        let weight = match decoder.contains_tensor("weight") {
            true => decoder.get((vocab, hidden), "weight")?,
            false => words.embeddings().clone(),
        };
        let bias = match bias.contains_tensor("bias") {
            true => bias.get(vocab, "bias")?,
            false => decoder.get(vocab, "bias")?,
        };
        Ok(MlmHead {
            dense: candle_nn::linear(hidden, hidden, dense)?,
            activation,
            norm: candle_nn::layer_norm(hidden, eps, norm)?,
            decoder_t: weight.t()?.contiguous()?,
            bias,
        })
    }

    /// SPLADE's weights `[rows, vocab]` (F32) of a last hidden state `[rows, seq, hidden]`: the logits through
    /// `log(1 + relu(x))`, the largest over each row's real tokens (`mask`, F32 `[rows, seq]`). Only real tokens go
    /// through the decoder (most of a ragged batch's positions may be padding, and the decoder is most of the
    /// work), a slice of rows at a time, so that a batch's logits never all exist at once.
    fn sparse(&self, hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, seq, width) = hidden.dims3()?;
        let vocab = self.bias.dim(0)?;
        // Each row's real tokens, as positions in the batch flattened to [rows × seq]; padding follows them.
        let lengths: Vec<usize> =
            mask.sum(1)?.to_dtype(DType::F32)?.to_vec1::<f32>()?.into_iter().map(|n| n.round() as usize).collect();
        let flat = hidden.reshape((rows * seq, width))?;
        let mut weights = Vec::with_capacity(rows);
        let mut first = 0;
        while first < rows {
            // Rows while their tokens' logits stay within the bound (always at least one row).
            let mut last = first + 1;
            let mut tokens = lengths[first];
            while last < rows && (tokens + lengths[last]) * vocab <= MAX_SPARSE_LOGITS {
                tokens += lengths[last];
                last += 1;
            }
            let positions: Vec<u32> =
                (first..last).flat_map(|r| (0..lengths[r]).map(move |t| (r * seq + t) as u32)).collect();
            let positions = Tensor::from_vec(positions, tokens, hidden.device())?;
            let x = self.dense.forward(&flat.index_select(&positions, 0)?)?;
            let x = self.activation.forward(&x)?;
            let x = self.norm.forward(&x)?;
            let logits = x.matmul(&self.decoder_t)?.broadcast_add(&self.bias)?;
            let logits = logits.to_dtype(DType::F32)?.relu()?;
            let mut start = 0;
            for &n in &lengths[first..last] {
                weights.push(logits.narrow(0, start, n)?.max(0)?);
                start += n;
            }
            first = last;
        }
        (Tensor::stack(&weights, 0)? + 1.0)?.log()
    }
}
