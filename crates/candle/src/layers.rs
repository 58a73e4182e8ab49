//! What the transformer architectures share: attention over heads with an additive mask, rotary position
//! embeddings, linear layers with or without bias, and reading a tensor under the names checkpoints give it.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Embedding, Linear, VarBuilder};

use crate::batch::Batch;
use crate::transformer::Dims;

/// A linear layer of `inputs → outputs`, with its bias where `bias` says the checkpoint has one.
pub(crate) fn linear(inputs: usize, outputs: usize, bias: bool, vb: VarBuilder) -> candle_core::Result<Linear> {
    match bias {
        true => candle_nn::linear(inputs, outputs, vb),
        false => candle_nn::linear_no_bias(inputs, outputs, vb),
    }
}

/// `[rows, seq, heads × dim]` → `[rows, heads, seq, dim]`, contiguous.
pub(crate) fn split_heads(x: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, seq, width) = x.dims3()?;
    x.reshape((rows, seq, heads, width / heads))?.transpose(1, 2)?.contiguous()
}

/// `[rows, heads, seq, dim]` → `[rows, seq, heads × dim]`.
pub(crate) fn merge_heads(x: &Tensor) -> candle_core::Result<Tensor> {
    let (rows, heads, seq, dim) = x.dims4()?;
    x.transpose(1, 2)?.reshape((rows, seq, heads * dim))
}

/// The most attention scores (rows × heads × queries × keys) made at once: a long text's queries are taken a piece at
/// a time, so that an 8,192-token text's scores (12 heads: 800 million, 3 GB in F32) never exist whole, nor do its
/// masks (a pair mask of 32,768 tokens would be 4 GB).
const MAX_SCORES: usize = 1 << 26;

/// What attention adds to the scores of a piece of queries: `[rows or 1, heads or 1, 1 or n, keys]` for the queries
/// `start..start + n`. Made whole once where the whole is small, and every layer reads it; else made again for each
/// piece.
pub(crate) struct Bias<'a> {
    make: Box<dyn Fn(usize, usize) -> candle_core::Result<Tensor> + 'a>,
    whole: Option<Tensor>,
}

impl<'a> Bias<'a> {
    /// A bias that is the same for every query (a key mask): made once.
    pub(crate) fn keys(mask: Tensor) -> Bias<'a> {
        Bias { make: Box::new(move |_, _| candle_core::bail!("a key mask is made whole")), whole: Some(mask) }
    }

    /// A bias per query of `queries` (and each of `rows × keys`), made by `make(start, n)`.
    pub(crate) fn per_query(
        rows: usize,
        queries: usize,
        keys: usize,
        make: impl Fn(usize, usize) -> candle_core::Result<Tensor> + 'a,
    ) -> candle_core::Result<Bias<'a>> {
        let whole = match rows * queries * keys <= MAX_SCORES {
            true => Some(make(0, queries)?),
            false => None,
        };
        Ok(Bias { make: Box::new(make), whole })
    }

    /// The bias of queries `start..start + n` of `queries`.
    fn piece(&self, start: usize, n: usize, queries: usize) -> candle_core::Result<Tensor> {
        match &self.whole {
            Some(whole) if whole.dim(2)? == 1 || (start, n) == (0, queries) => Ok(whole.clone()),
            Some(whole) => whole.narrow(2, start, n),
            None => (self.make)(start, n),
        }
    }
}

/// Scaled dot-product attention of `[rows, heads, seq, dim]` queries, keys and values, with `bias` added to the
/// scores (an additive mask, or a position bias): `[rows, heads, seq, dim]`. Keys and values with fewer heads than
/// the queries (grouped-query attention) are shared by groups of them.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Bias<'_>,
    scale: f64,
) -> candle_core::Result<Tensor> {
    attention_within(q, k, v, bias, scale, MAX_SCORES)
}

/// [`attention`] making at most about `max_scores` scores at once.
fn attention_within(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Bias<'_>,
    scale: f64,
    max_scores: usize,
) -> candle_core::Result<Tensor> {
    let (rows, heads, queries, _) = q.dims4()?;
    let kv_heads = k.dim(1)?;
    let (k, v) = match heads / kv_heads {
        1 => (k.clone(), v.clone()),
        group => (repeat_heads(k, group)?, repeat_heads(v, group)?),
    };
    let piece = (max_scores / (rows * heads * k.dim(2)?).max(1)).max(1);
    if piece >= queries {
        return attend(q, &k, &v, &bias.piece(0, queries, queries)?, scale);
    }
    let mut pieces = Vec::with_capacity(queries.div_ceil(piece));
    for start in (0..queries).step_by(piece) {
        let n = piece.min(queries - start);
        let bias = bias.piece(start, n, queries)?;
        pieces.push(attend(&q.narrow(2, start, n)?.contiguous()?, &k, &v, &bias, scale)?);
    }
    Tensor::cat(&pieces, 2)
}

/// [`attention`] of queries whose scores are made at once.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(bias)?;
    // candle's CPU softmax sums in the scores' dtype: over hundreds of keys, BF16's 8 bits lose the weights (a
    // 512-token text's states fell to a cosine of 0.90 with FP32's). Its CUDA kernel sums in F32 already.
    let probabilities = match (scores.device().is_cpu(), scores.dtype()) {
        (true, dtype @ (DType::BF16 | DType::F16)) => {
            candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(dtype)?
        }
        _ => candle_nn::ops::softmax_last_dim(&scores)?,
    };
    probabilities.matmul(v)
}

/// Each of `[rows, kv_heads, seq, dim]`'s heads `group` times in a row: `[rows, kv_heads × group, seq, dim]`.
fn repeat_heads(x: &Tensor, group: usize) -> candle_core::Result<Tensor> {
    let (rows, kv_heads, seq, dim) = x.dims4()?;
    x.unsqueeze(2)?.expand((rows, kv_heads, group, seq, dim))?.reshape((rows, kv_heads * group, seq, dim))
}

/// Rotary position embeddings ("rotate half": a head's first half of dimensions paired with its second half).
pub(crate) struct Rotary {
    /// `F32 [dim / 2]`: each pair's angle per position.
    inv_freq: Tensor,
}

impl Rotary {
    /// For heads of `dim` dimensions with base `theta`.
    pub(crate) fn new(dim: usize, theta: f64, device: &Device) -> candle_core::Result<Rotary> {
        Rotary::scaled(dim, theta, 1.0, device)
    }

    /// For heads of `dim` dimensions with base `theta`, every frequency divided by `divisor`.
    pub(crate) fn scaled(dim: usize, theta: f64, divisor: f64, device: &Device) -> candle_core::Result<Rotary> {
        let inv_freq: Vec<f32> =
            (0..dim / 2).map(|i| (1.0 / theta.powf((2 * i) as f64 / dim as f64) / divisor) as f32).collect();
        Ok(Rotary { inv_freq: Tensor::from_vec(inv_freq, dim / 2, device)? })
    }

    /// The cosines and sines `[rows, seq, dim / 2]` in `dtype` of `positions` (`U32 [rows, seq]`).
    pub(crate) fn cos_sin(&self, positions: &Tensor, dtype: DType) -> candle_core::Result<(Tensor, Tensor)> {
        let angles = positions.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?.broadcast_mul(&self.inv_freq)?;
        Ok((angles.cos()?.to_dtype(dtype)?, angles.sin()?.to_dtype(dtype)?))
    }
}

/// `x` `[rows, heads, seq, dim]` rotated by `cos`/`sin` `[rows, seq, dim / 2]`.
pub(crate) fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)
}

/// `x` rotated as [`rotate`] does, but pairing neighbouring dimensions (`2i`, `2i + 1`) instead of halves.
pub(crate) fn rotate_interleaved(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::rotary_emb::rope_i(&x.contiguous()?, cos, sin)
}

/// `run` of `x`'s rows (`[rows, ...]`) in parts, one a core, all at once where `x` is on the CPU; their outputs
/// stacked again. candle's CPU ops outside the matrix products run on one thread, and the products' threads meet at a
/// barrier after each: a batch run whole leaves cores idle between products (CLIP at ViT-B/32's sizes kept 1.7 of 2
/// cores busy, and ran a batch of 16 pictures at 8–10 a second; in two parts at once, 11.8).
pub(crate) fn across_cores(
    x: &Tensor,
    run: impl Fn(&Tensor) -> candle_core::Result<Tensor> + Sync,
) -> candle_core::Result<Tensor> {
    use rayon::prelude::*;
    let rows = x.dim(0)?;
    let parts = rayon::current_num_threads().min(rows);
    if !x.device().is_cpu() || parts < 2 {
        return run(x);
    }
    let size = rows.div_ceil(parts);
    let starts: Vec<usize> = (0..rows).step_by(size).collect();
    let outputs = starts
        .into_par_iter()
        .map(|start| run(&x.narrow(0, start, size.min(rows - start))?))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&outputs, 0)
}

/// Linear layers of the same input as one: their outputs side by side, from one matrix product (wider products run
/// nearer the CPU's peak, and the bias is added in one pass).
pub(crate) fn stacked(parts: &[Linear]) -> candle_core::Result<Linear> {
    let weights: Vec<&Tensor> = parts.iter().map(Linear::weight).collect();
    let biases: Vec<&Tensor> = parts.iter().filter_map(Linear::bias).collect();
    let bias = match biases.len() {
        0 => None,
        n if n == parts.len() => Some(Tensor::cat(&biases, 0)?),
        _ => candle_core::bail!("linear layers stacked with and without a bias"),
    };
    Ok(Linear::new(Tensor::cat(&weights, 0)?, bias))
}

/// CLIP's activation, `x · sigmoid(1.702 x)`. On the CPU in F32: one pass on every core, where candle's ops make
/// three passes on one.
pub(crate) fn quick_gelu(x: &Tensor) -> candle_core::Result<Tensor> {
    match (x.device().is_cpu(), x.dtype()) {
        (true, DType::F32) => x.contiguous()?.apply_op1_no_bwd(&QuickGelu),
        _ => x * candle_nn::ops::sigmoid(&(x * 1.702)?)?,
    }
}

struct QuickGelu;

impl candle_core::CustomOp1 for QuickGelu {
    fn name(&self) -> &'static str {
        "quick-gelu"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use rayon::prelude::*;
        let (candle_core::CpuStorage::F32(values), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("quick-gelu: a contiguous F32 tensor");
        };
        let values = &values[start..end];
        let mut out = vec![0f32; values.len()];
        out.par_chunks_mut(1 << 14).zip(values.par_chunks(1 << 14)).for_each(|(out, values)| {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = v / (1.0 + (-1.702 * v).exp());
            }
        });
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// A gated MLP's two halves applied: `activation(gate) × value`.
pub(crate) fn gated(gate: &Tensor, value: &Tensor, activation: candle_nn::Activation) -> candle_core::Result<Tensor> {
    activation.forward(gate)? * value
}

/// Reads `config.json`'s `key` into `T`, naming the field in the error.
pub(crate) fn field<T: serde::de::DeserializeOwned>(json: &serde_json::Value, key: &str) -> Result<T, String> {
    let value = json.get(key).ok_or_else(|| format!("{key}: missing"))?;
    serde_json::from_value(value.clone()).map_err(|e| format!("{key}: {e}"))
}

/// Reads `config.json`'s `key` into `T`, or `default` where it is absent or null.
pub(crate) fn field_or<T: serde::de::DeserializeOwned>(
    json: &serde_json::Value,
    key: &str,
    default: T,
) -> Result<T, String> {
    match json.get(key) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(_) => field(json, key),
    }
}

/// `json` with each key of `defaults` it lacks (or holds as null) taken from there: transformers saves a config's keys
/// that differ from its class's defaults only, so a hub `config.json` may leave out the sizes of the common model.
pub(crate) fn with_defaults(json: &serde_json::Value, defaults: serde_json::Value) -> serde_json::Value {
    let mut merged = json.clone();
    if let (Some(into), serde_json::Value::Object(defaults)) = (merged.as_object_mut(), defaults) {
        for (key, value) in defaults {
            if into.get(&key).is_none_or(|v| v.is_null()) {
                into.insert(key, value);
            }
        }
    }
    merged
}

/// The root of a checkpoint's tensors: under `prefix` where the checkpoint stores a task model's
/// (`mpnet.embeddings…`), else at the top (a bare encoder, as sentence-transformers saves it).
pub(crate) fn under<'a>(root: &VarBuilder<'a>, prefix: &str, probe: &str) -> VarBuilder<'a> {
    match root.contains_tensor(&format!("{prefix}.{probe}")) {
        true => root.pp(prefix),
        false => root.clone(),
    }
}

/// A rotary embedding's settings from `config.json`: its base, from `rope_parameters` (transformers 5) or
/// `rope_theta`, and its scaling type (`rope_parameters.rope_type`, or `rope_scaling`'s `rope_type` or `type`).
pub(crate) struct RopeSettings {
    pub theta: f64,
    /// `None`: unscaled ("default").
    pub scaling: Option<(String, f64)>,
}

impl RopeSettings {
    /// Reads them from `json` (or `parameters`, a per-layer-type table in `rope_parameters`), with base `theta`
    /// where none is named.
    pub(crate) fn read(
        json: &serde_json::Value,
        parameters: Option<&serde_json::Value>,
        theta: f64,
    ) -> Result<RopeSettings, String> {
        let parameters = parameters.or_else(|| json.get("rope_parameters")).filter(|p| p.is_object());
        let scaling = json.get("rope_scaling").filter(|s| s.is_object());
        let theta = match parameters.and_then(|p| p.get("rope_theta")) {
            Some(t) => t.as_f64().ok_or("rope_parameters.rope_theta: not a number")?,
            None => field_or(json, "rope_theta", theta)?,
        };
        let kind = [parameters, scaling]
            .into_iter()
            .flatten()
            .find_map(|table| table.get("rope_type").or_else(|| table.get("type")).and_then(|t| t.as_str()))
            .unwrap_or("default");
        let factor = [parameters, scaling].into_iter().flatten().find_map(|t| t.get("factor").and_then(|f| f.as_f64()));
        Ok(RopeSettings {
            theta,
            scaling: match kind {
                "default" => None,
                other => Some((other.to_owned(), factor.unwrap_or(1.0))),
            },
        })
    }

    /// Refuses a scaling the architecture does not have.
    pub(crate) fn unscaled(self) -> Result<f64, String> {
        match self.scaling {
            None => Ok(self.theta),
            Some((kind, _)) => Err(format!(
                "rope_scaling: rope type `{kind}` is not supported for this architecture (inferd runs the default rotary \
                 embedding)"
            )),
        }
    }
}

/// `hidden_size` and `num_attention_heads` (or the architecture's own keys), checked: the heads divide the hidden size,
/// into heads of an even size where a rotary embedding pairs their dimensions.
pub(crate) fn hidden_and_heads(
    json: &serde_json::Value,
    [hidden_key, heads_key]: [&str; 2],
    rotary: bool,
) -> Result<(usize, usize), String> {
    let hidden: usize = field(json, hidden_key)?;
    let heads: usize = field(json, heads_key)?;
    if heads == 0 || !hidden.is_multiple_of(heads) || (rotary && !(hidden / heads).is_multiple_of(2)) {
        let even = if rotary { " of an even size" } else { "" };
        return Err(format!("{heads_key}: {heads} heads do not divide {hidden_key} {hidden} into heads{even}"));
    }
    Ok((hidden, heads))
}

/// A token's embedding: its word's, plus its segment's where the model has token types.
pub(crate) struct TokenEmbeddings {
    words: Embedding,
    types: Option<Embedding>,
}

impl TokenEmbeddings {
    /// `word_embeddings` and, with token types, `token_type_embeddings` under `vb`.
    pub(crate) fn load(dims: Dims, vb: VarBuilder) -> candle_core::Result<TokenEmbeddings> {
        Ok(TokenEmbeddings {
            words: candle_nn::embedding(dims.vocab, dims.hidden, vb.pp("word_embeddings"))?,
            types: match dims.token_types {
                0 => None,
                n => Some(candle_nn::embedding(n, dims.hidden, vb.pp("token_type_embeddings"))?),
            },
        })
    }

    /// `[rows, seq, hidden]` in the model's dtype.
    pub(crate) fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let words = self.words.forward(&batch.ids)?;
        match &self.types {
            Some(types) => words + types.forward(&batch.types)?,
            None => Ok(words),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::{attention_within, Bias, MAX_SCORES};

    #[test]
    fn attention_in_pieces_of_queries_is_attention_whole() {
        let device = Device::Cpu;
        let values = |n: usize, seed: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect() };
        let (rows, heads, seq, dim) = (2, 4, 9, 8);
        let tensor =
            |seed: f32| Tensor::from_vec(values(rows * heads * seq * dim, seed), (rows, heads, seq, dim), &device);
        let (q, k, v) = (tensor(0.0).expect("q"), tensor(1.0).expect("k"), tensor(2.0).expect("v"));
        // Two keys of the second row masked, and a bias per query and key made a piece at a time.
        let mut mask = vec![0f32; rows * seq];
        mask[seq + 7..2 * seq].fill(-1e30);
        let mask = Tensor::from_vec(mask, (rows, 1, 1, seq), &device).expect("mask");
        let pair = Tensor::from_vec(values(seq * seq, 3.0), (1, 1, seq, seq), &device).expect("pair");
        let per_query = |start: usize, n: usize| pair.narrow(2, start, n)?.broadcast_add(&mask);
        let whole = attention_within(&q, &k, &v, &Bias::keys(mask.clone()), 0.35, MAX_SCORES).expect("whole");
        let pieces = attention_within(&q, &k, &v, &Bias::keys(mask.clone()), 0.35, rows * heads * seq * 2);
        assert_close(&whole, &pieces.expect("pieces"));
        // Pieces of 2 queries (the last of 1), each bias made for its piece, or cut from the whole.
        let made = Bias { make: Box::new(per_query), whole: None };
        let whole = attention_within(&q, &k, &v, &made, 0.35, MAX_SCORES).expect("whole");
        let pieces = attention_within(&q, &k, &v, &made, 0.35, rows * heads * seq * 2).expect("pieces");
        assert_close(&whole, &pieces);
        let kept = Bias::per_query(rows, seq, seq, per_query).expect("bias");
        assert_close(&whole, &attention_within(&q, &k, &v, &kept, 0.35, rows * heads * seq * 2).expect("pieces"));
    }

    fn assert_close(a: &Tensor, b: &Tensor) {
        let difference = (a - b).expect("sub").abs().expect("abs").max_all().expect("max");
        assert!(difference.to_scalar::<f32>().expect("scalar") < 1e-6);
    }
}
