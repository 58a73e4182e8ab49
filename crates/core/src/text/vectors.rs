//! The host's own arithmetic on a text engine's outputs, where a graph leaves it undone: pooling a last hidden state,
//! SPLADE's sparse weights from masked-LM logits, and normalising a vector.

use crate::config::Pooling;
use crate::error::{Error, Result};

/// Pools a last hidden state `[rows, seq, dim]` (row-major) into `[rows, dim]` as sentence-transformers does,
/// counting only the tokens whose `mask` is non-zero (wherever the padding lies: the first and last tokens are the
/// first and last real ones, a token's weight its place among them).
pub fn pool(hidden: &[f32], mask: &[i64], rows: usize, seq: usize, dim: usize, pooling: Pooling) -> Result<Vec<f32>> {
    if hidden.len() != rows * seq * dim || mask.len() != rows * seq {
        return Err(Error::Engine(format!(
            "cannot pool a hidden state of {} values with a mask of {} as [{rows}, {seq}, {dim}]",
            hidden.len(),
            mask.len()
        )));
    }
    let mut out = vec![0f32; rows * dim];
    for (r, pooled) in out.chunks_exact_mut(dim).enumerate() {
        let states = hidden[r * seq * dim..(r + 1) * seq * dim].chunks_exact(dim);
        let real: Vec<&[f32]> =
            states.zip(&mask[r * seq..(r + 1) * seq]).filter(|(_, &m)| m != 0).map(|(s, _)| s).collect();
        let (Some(first), Some(last)) = (real.first(), real.last()) else { continue };
        let weighted_sum = |weight: &dyn Fn(usize) -> f64| {
            let mut sums = vec![0f64; dim];
            for (i, state) in real.iter().enumerate() {
                sums.iter_mut().zip(*state).for_each(|(p, &s)| *p += weight(i) * f64::from(s));
            }
            sums
        };
        let n = real.len() as f64;
        let (sums, divisor) = match pooling {
            Pooling::Cls => (first.iter().map(|&v| f64::from(v)).collect(), 1.0),
            Pooling::LastToken => (last.iter().map(|&v| f64::from(v)).collect(), 1.0),
            Pooling::Max => {
                let mut maxima = vec![f64::NEG_INFINITY; dim];
                for state in &real {
                    maxima.iter_mut().zip(*state).for_each(|(m, &s)| *m = m.max(f64::from(s)));
                }
                (maxima, 1.0)
            }
            Pooling::Mean => (weighted_sum(&|_| 1.0), n),
            Pooling::MeanSqrtLen => (weighted_sum(&|_| 1.0), n.sqrt()),
            Pooling::WeightedMean => (weighted_sum(&|i| (i + 1) as f64), n * (n + 1.0) / 2.0),
        };
        pooled.iter_mut().zip(sums).for_each(|(p, s)| *p = (s / divisor) as f32);
    }
    Ok(out)
}

/// SPLADE's vocabulary weights from masked-LM logits `[rows, seq, vocab]` (row-major): for each row and entry, the
/// largest `log(1 + relu(x))` over the tokens whose `mask` is non-zero; `[rows, vocab]`.
pub fn splade(logits: &[f32], mask: &[i64], rows: usize, seq: usize, vocab: usize) -> Result<Vec<f32>> {
    if logits.len() != rows * seq * vocab || mask.len() != rows * seq {
        return Err(Error::Engine(format!(
            "cannot take sparse weights of {} logits with a mask of {} as [{rows}, {seq}, {vocab}]",
            logits.len(),
            mask.len()
        )));
    }
    let mut out = vec![0f32; rows * vocab];
    for (r, weights) in out.chunks_exact_mut(vocab).enumerate() {
        let row_mask = &mask[r * seq..(r + 1) * seq];
        let tokens = logits[r * seq * vocab..(r + 1) * seq * vocab].chunks_exact(vocab);
        for (token, _) in tokens.zip(row_mask).filter(|(_, &m)| m != 0) {
            // log(1 + relu(x)) grows with x: the largest logit gives the largest weight, and 0 stays 0.
            for (w, &x) in weights.iter_mut().zip(token) {
                *w = w.max(x);
            }
        }
        weights.iter_mut().for_each(|w| *w = w.max(0.0).ln_1p());
    }
    Ok(out)
}

/// Scales `vector` to unit length (a zero vector stays zero).
pub fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|v| *v = (f64::from(*v) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pooling_skips_padding_and_cls_takes_the_first_token() {
        // Two rows of three tokens, dim 2; row 1 has one padding token carrying garbage.
        let hidden = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 20.0, 30.0, 40.0, 1e6, -1e6];
        let mask = [1, 1, 1, 1, 1, 0];
        let mean = pool(&hidden, &mask, 2, 3, 2, Pooling::Mean).expect("pool");
        assert_eq!(mean, vec![3.0, 4.0, 20.0, 30.0]);
        let cls = pool(&hidden, &mask, 2, 3, 2, Pooling::Cls).expect("pool");
        assert_eq!(cls, vec![1.0, 2.0, 10.0, 20.0]);
        assert!(pool(&hidden, &mask, 2, 2, 2, Pooling::Mean).is_err());
    }

    #[test]
    fn every_pooling_mode_reads_the_real_tokens_wherever_the_padding_lies() {
        // One text of three tokens (dim 2), padded on the right in row 0 and on the left in row 1.
        let tokens = [[1.0f32, -4.0], [3.0, 2.0], [5.0, 8.0]];
        let pad = [1e6f32, -1e6];
        let rows: Vec<f32> = [tokens[0], tokens[1], tokens[2], pad, pad, tokens[0], tokens[1], tokens[2]].concat();
        let mask = [1, 1, 1, 0, 0, 1, 1, 1];
        let cases: [(Pooling, [f32; 2]); 6] = [
            (Pooling::Cls, [1.0, -4.0]),
            (Pooling::LastToken, [5.0, 8.0]),
            (Pooling::Max, [5.0, 8.0]),
            (Pooling::Mean, [3.0, 2.0]),
            (Pooling::MeanSqrtLen, [9.0 / 3f32.sqrt(), 6.0 / 3f32.sqrt()]),
            // Weights 1, 2, 3: (1 + 6 + 15) / 6 and (-4 + 4 + 24) / 6.
            (Pooling::WeightedMean, [22.0 / 6.0, 24.0 / 6.0]),
        ];
        for (pooling, want) in cases {
            let got = pool(&rows, &mask, 2, 4, 2, pooling).expect("pool");
            for row in got.chunks_exact(2) {
                assert!(row.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5), "{pooling:?}: {got:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn sparse_weights_are_the_largest_log1p_relu_over_real_tokens() {
        // One row of three tokens over a vocabulary of 3; the last token is padding with large logits.
        let logits = [1.0, -2.0, 0.0, 3.0, -1.0, 0.0, 100.0, 100.0, 100.0];
        let weights = splade(&logits, &[1, 1, 0], 1, 3, 3).expect("splade");
        let want = [4f32.ln(), 0.0, 0.0];
        assert!(weights.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6), "{weights:?}");
        assert!(splade(&logits, &[1, 1], 1, 3, 3).is_err());
    }

    #[test]
    fn normalize_gives_unit_length() {
        let mut v = [3.0f32, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0f32; 3];
        normalize(&mut zero);
        assert_eq!(zero, [0.0; 3]);
    }
}
