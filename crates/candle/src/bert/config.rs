//! A BERT-family `config.json` in BERT's terms: BERT's, RoBERTa's and XLM-RoBERTa's keys as transformers writes them
//! (with its defaults where a key is absent), and DistilBERT's own names for the same sizes.

use candle_nn::Activation;
use inferd_core::text::is_roberta;
use serde_json::json;

use crate::layers::{field, field_or, hidden_and_heads, with_defaults};

pub(crate) const DISTILBERT: &str = "distilbert";

/// The sizes and settings an encoder of BERT's family is built from.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub pad_token_id: usize,
    pub model_type: Option<String>,
}

impl Config {
    /// Reads `config.json`; DistilBERT's is read into BERT's terms. A key that contradicts the others, or a setting
    /// this encoder does not run, is an error naming it.
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let model_type: Option<String> = field_or(json, "model_type", None)?;
        if model_type.as_deref() == Some(DISTILBERT) {
            return Config::read_distil(json);
        }
        // transformers' defaults, for the keys a saved config leaves out: BertConfig's, with RoBERTa's family padding
        // with id 1 (its positions start past it).
        let roberta = model_type.as_deref().is_some_and(is_roberta);
        let json = &with_defaults(
            json,
            json!({"vocab_size": if roberta { 50265 } else { 30522 }, "hidden_size": 768, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "intermediate_size": 3072, "pad_token_id": if roberta { 1 } else { 0 }}),
        );
        let (hidden, heads) = hidden_and_heads(json, ["hidden_size", "num_attention_heads"], false)?;
        let positions: String = field_or(json, "position_embedding_type", "absolute".to_owned())?;
        if positions != "absolute" {
            return Err(format!(
                "position_embedding_type: `{positions}`; inferd runs BERT's family with absolute positions only"
            ));
        }
        Ok(Config {
            vocab_size: field(json, "vocab_size")?,
            hidden_size: hidden,
            num_hidden_layers: field(json, "num_hidden_layers")?,
            num_attention_heads: heads,
            intermediate_size: field(json, "intermediate_size")?,
            hidden_act: activation(json, "hidden_act")?,
            max_position_embeddings: field_or(json, "max_position_embeddings", 512)?,
            type_vocab_size: field_or(json, "type_vocab_size", 2)?,
            layer_norm_eps: field_or(json, "layer_norm_eps", 1e-12)?,
            pad_token_id: field(json, "pad_token_id")?,
            model_type,
        })
    }

    /// DistilBERT's `dim`, `n_layers`, `n_heads`, `hidden_dim` and `activation`.
    fn read_distil(json: &serde_json::Value) -> Result<Config, String> {
        let json = &with_defaults(
            json,
            json!({"vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072}),
        );
        if field_or(json, "sinusoidal_pos_embds", false)? {
            return Err("sinusoidal_pos_embds: only learned position embeddings are supported".into());
        }
        let (hidden, heads) = hidden_and_heads(json, ["dim", "n_heads"], false)?;
        Ok(Config {
            vocab_size: field(json, "vocab_size")?,
            hidden_size: hidden,
            num_hidden_layers: field(json, "n_layers")?,
            num_attention_heads: heads,
            intermediate_size: field(json, "hidden_dim")?,
            hidden_act: activation(json, "activation")?,
            max_position_embeddings: field_or(json, "max_position_embeddings", 512)?,
            // No token type embeddings: one type, never looked up.
            type_vocab_size: 1,
            // transformers' DistilBERT fixes its LayerNorms' epsilon.
            layer_norm_eps: 1e-12,
            pad_token_id: field_or(json, "pad_token_id", 0)?,
            model_type: Some(DISTILBERT.to_owned()),
        })
    }
}

/// The activation `key` names, as transformers reads it: `gelu` (exact), `gelu_new` or `gelu_pytorch_tanh` (the tanh
/// approximation), `relu`; absent, `gelu`.
fn activation(json: &serde_json::Value, key: &str) -> Result<Activation, String> {
    let name: String = field_or(json, key, "gelu".to_owned())?;
    match name.as_str() {
        "gelu" => Ok(Activation::Gelu),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_approximate" => Ok(Activation::NewGelu),
        "relu" => Ok(Activation::Relu),
        other => Err(format!("{key}: `{other}` is not one of gelu, gelu_new, gelu_pytorch_tanh or relu")),
    }
}

/// BERT's name of a layer tensor → DistilBERT's: `encoder.layer.N.attention.self.query.weight` →
/// `transformer.layer.N.attention.q_lin.weight`, and so on. Names outside the layers are the same.
pub(crate) fn distil_name(name: &str) -> String {
    const PARTS: [(&str, &str); 8] = [
        (".attention.self.query.", ".attention.q_lin."),
        (".attention.self.key.", ".attention.k_lin."),
        (".attention.self.value.", ".attention.v_lin."),
        (".attention.output.dense.", ".attention.out_lin."),
        (".attention.output.LayerNorm.", ".sa_layer_norm."),
        (".intermediate.dense.", ".ffn.lin1."),
        (".output.dense.", ".ffn.lin2."),
        (".output.LayerNorm.", ".output_layer_norm."),
    ];
    if !name.contains("encoder.layer.") {
        return name.to_owned();
    }
    let name = name.replacen("encoder.layer.", "transformer.layer.", 1);
    match PARTS.iter().find(|(bert, _)| name.contains(bert)) {
        Some((bert, distil)) => name.replacen(bert, distil, 1),
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use candle_nn::Activation;
    use serde_json::json;

    use super::Config;

    #[test]
    fn reads_bert_and_distilbert_and_names_a_bad_field() {
        let bert = json!({"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 16, "hidden_act": "gelu_new"});
        let c = Config::read(&bert).expect("bert");
        assert_eq!((c.hidden_size, c.type_vocab_size, c.max_position_embeddings), (8, 2, 512));
        assert_eq!(c.hidden_act, Activation::NewGelu);
        let distil = json!({"model_type": "distilbert", "vocab_size": 30, "dim": 8, "n_layers": 2, "n_heads": 2,
            "hidden_dim": 16, "activation": "relu", "max_position_embeddings": 64});
        let c = Config::read(&distil).expect("distilbert");
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.intermediate_size), (8, 2, 16));
        assert_eq!((c.type_vocab_size, c.hidden_act), (1, Activation::Relu));
        for (key, value, says) in [
            ("num_attention_heads", json!(3), "num_attention_heads: 3 heads do not divide hidden_size 8"),
            ("position_embedding_type", json!("relative_key"), "position_embedding_type: `relative_key`"),
            ("hidden_act", json!("swish"), "hidden_act: `swish`"),
            ("vocab_size", json!("many"), "vocab_size: invalid type"),
            ("num_hidden_layers", json!(-1), "num_hidden_layers: invalid value"),
        ] {
            let mut bad = bert.clone();
            bad[key] = value;
            let message = Config::read(&bad).expect_err(key);
            assert!(message.starts_with(says), "{message}");
        }
        // A saved config leaves out what equals its class's defaults; RoBERTa's family pads with id 1.
        let roberta = Config::read(&json!({"model_type": "xlm-roberta", "vocab_size": 30})).expect("defaults");
        assert_eq!((roberta.hidden_size, roberta.num_hidden_layers, roberta.pad_token_id), (768, 12, 1));
        assert_eq!(Config::read(&json!({"model_type": "bert"})).expect("bert").pad_token_id, 0);
        let mut sinusoidal = distil;
        sinusoidal["sinusoidal_pos_embds"] = json!(true);
        assert!(Config::read(&sinusoidal).expect_err("sinusoidal").starts_with("sinusoidal_pos_embds"));
    }
}
