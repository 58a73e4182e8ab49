"""Float64 numpy references for the text models inferd serves, read from a Hugging Face hub folder (config.json and
model.safetensors), independent of the server's code.

Families: BERT (`model_type` "bert": positions from 0, token type embeddings), RoBERTa / XLM-R ("roberta",
"xlm-roberta": positions from pad_token_id + 1, as transformers' create_position_ids_from_input_ids numbers real
tokens, and token type 0 whatever the tokenizer says) and DistilBERT ("distilbert": its own config keys and tensor
names, positions from 0, no token types). Heads: mean-pooled, normalised embeddings (sentence-transformers),
BertForSequenceClassification (tanh pooler on [CLS], then a linear classifier), RobertaClassificationHead (dense +
tanh on the first token, then out_proj) and DistilBertForSequenceClassification (pre_classifier + ReLU on the first
token, then classifier); `*ForTokenClassification` (`classifier` on every token); and BertForMaskedLM's head (dense,
GELU, LayerNorm, the decoder tied to the word embeddings) through SPLADE's log(1 + relu(x)), the largest over the
tokens. Every sequence runs alone, unpadded, so the reference cannot share a padding bug with the server.
"""

import json
import math
import pathlib

import numpy as np
from safetensors.numpy import load_file

ROBERTA_FAMILY = ("roberta", "xlm-roberta")

# Exact GELU (transformers' "gelu"), not the tanh approximation.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


class Reference:
    """One model folder in float64. Tensor names may carry the task model's prefix (`bert.`, `roberta.`) or none
    (a bare encoder, as sentence-transformers saves it)."""

    def __init__(self, folder):
        folder = pathlib.Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        # TF-era checkpoints name LayerNorm's tensors `gamma` and `beta`.
        legacy = lambda k: k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")  # noqa: E731
        self.w = {legacy(k): v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
        self.roberta = self.config["model_type"] in ROBERTA_FAMILY
        self.distil = self.config["model_type"] == "distilbert"
        c = self.config
        if self.distil:  # DistilBERT's keys for BERT's
            c = {"hidden_act": c["activation"], "num_attention_heads": c["n_heads"], "num_hidden_layers": c["n_layers"],
                 "layer_norm_eps": 1e-12}
        self.act, self.heads, self.layers, self.eps = (c["hidden_act"], c["num_attention_heads"],
                                                        c["num_hidden_layers"], c["layer_norm_eps"])
        if self.act != "gelu":
            raise ValueError(f"unsupported activation {self.act!r}")
        words = next(k for k in self.w if k.endswith("embeddings.word_embeddings.weight"))
        self.prefix = words[: -len("embeddings.word_embeddings.weight")]

    def layer_norm(self, x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def linear(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def layer_name(self, i, part):
        """Layer i's tensor `part`, named as BERT names it (`attention.self.query`), in this model's names."""
        if not self.distil:
            return f"{self.prefix}encoder.layer.{i}.{part}"
        distil = {"attention.self.query": "attention.q_lin", "attention.self.key": "attention.k_lin",
                  "attention.self.value": "attention.v_lin", "attention.output.dense": "attention.out_lin",
                  "attention.output.LayerNorm": "sa_layer_norm", "intermediate.dense": "ffn.lin1",
                  "output.dense": "ffn.lin2", "output.LayerNorm": "output_layer_norm"}[part]
        return f"{self.prefix}transformer.layer.{i}.{distil}"

    def hidden_states(self, ids, type_ids):
        """The last layer's states, [len(ids), hidden], for one unpadded sequence."""
        ids = np.asarray(ids)
        n = len(ids)
        if self.roberta:
            positions = self.config["pad_token_id"] + 1 + np.arange(n)
            type_ids = np.zeros(n, dtype=np.int64)
        else:
            positions = np.arange(n)
        e = self.prefix + "embeddings."
        x = self.w[e + "word_embeddings.weight"][ids] + self.w[e + "position_embeddings.weight"][positions]
        if not self.distil:
            x = x + self.w[e + "token_type_embeddings.weight"][np.asarray(type_ids)]
        x = self.layer_norm(x, e + "LayerNorm")
        heads = self.heads
        d = x.shape[1] // heads
        for i in range(self.layers):
            name = lambda part: self.layer_name(i, part)  # noqa: E731
            q, k, v = (self.linear(x, name(f"attention.self.{m}")).reshape(n, heads, d).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            context = softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d)) @ v
            context = context.transpose(1, 0, 2).reshape(n, heads * d)
            x = self.layer_norm(self.linear(context, name("attention.output.dense")) + x,
                                name("attention.output.LayerNorm"))
            hidden = gelu(self.linear(x, name("intermediate.dense")))
            x = self.layer_norm(self.linear(hidden, name("output.dense")) + x, name("output.LayerNorm"))
        return x

    def embed(self, ids, type_ids):
        """Mean pooling over the tokens, then L2 normalisation (all-MiniLM-L6-v2's modules)."""
        pooled = self.hidden_states(ids, type_ids).mean(0)
        return pooled / np.linalg.norm(pooled)

    def head(self, first):
        """The sequence-classification head on the first token's state: [num_labels] logits."""
        if self.roberta:
            return self.linear(np.tanh(self.linear(first, "classifier.dense")), "classifier.out_proj")
        if self.distil:
            return self.linear(np.maximum(self.linear(first, "pre_classifier"), 0.0), "classifier")
        return self.linear(np.tanh(self.linear(first, self.prefix + "pooler.dense")), "classifier")

    def logits(self, ids_list, type_ids_list):
        """[len(ids_list), num_labels] logits, each sequence run alone."""
        return np.stack([self.head(self.hidden_states(ids, type_ids)[0])
                         for ids, type_ids in zip(ids_list, type_ids_list)])

    def token_logits(self, ids, type_ids):
        """A token classifier's [len(ids), num_labels] logits: `classifier` on every token's state."""
        return self.linear(self.hidden_states(ids, type_ids), "classifier")

    def sparse(self, ids, type_ids):
        """SPLADE's [vocab] weights: the masked-LM head's logits through log(1 + relu(x)), the largest over the
        tokens (special tokens included)."""
        h = self.hidden_states(ids, type_ids)
        h = self.layer_norm(gelu(self.linear(h, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
        decoder = self.w.get("cls.predictions.decoder.weight", self.w[self.prefix + "embeddings.word_embeddings.weight"])
        logits = h @ decoder.T + self.w["cls.predictions.bias"]
        return np.log1p(np.maximum(logits, 0.0)).max(0)
