//! A batch of token sequences on the model's device, with what every architecture reads from its mask: where each
//! row's real tokens are, wherever the padding lies.

use candle_core::{DType, Device, Tensor};

/// Token ids, segment ids and the attention mask of `[rows, seq]` sequences.
pub(crate) struct Batch {
    /// `U32 [rows, seq]`.
    pub ids: Tensor,
    /// `U32 [rows, seq]`: all 0 where the model has one token type.
    pub types: Tensor,
    /// `F32 [rows, seq]`: 1 for a real token, 0 for padding.
    pub mask: Tensor,
    pub rows: usize,
    pub seq: usize,
    /// Each row's real positions, in order.
    real: Vec<Vec<usize>>,
}

impl Batch {
    /// A batch from row-major host values; `mask` non-zero marks a real token.
    pub(crate) fn new(
        ids: Vec<u32>,
        types: Vec<u32>,
        mask: &[i64],
        rows: usize,
        seq: usize,
        device: &Device,
    ) -> candle_core::Result<Batch> {
        let real = (0..rows).map(|r| (0..seq).filter(|&t| mask[r * seq + t] != 0).collect()).collect();
        let mask: Vec<f32> = mask.iter().map(|&m| if m != 0 { 1.0 } else { 0.0 }).collect();
        Ok(Batch {
            ids: Tensor::from_vec(ids, (rows, seq), device)?,
            types: Tensor::from_vec(types, (rows, seq), device)?,
            mask: Tensor::from_vec(mask, (rows, seq), device)?,
            rows,
            seq,
            real,
        })
    }

    /// Each token's position `[rows, seq]` (U32): a real token's place among its row's real tokens plus `first`, so
    /// that a text has the same positions alone as in a padded batch, padded on either side; padding takes `pad`.
    pub(crate) fn positions(&self, first: u32, pad: u32) -> candle_core::Result<Tensor> {
        let mut positions = vec![pad; self.rows * self.seq];
        for (r, real) in self.real.iter().enumerate() {
            for (i, &t) in real.iter().enumerate() {
                positions[r * self.seq + t] = first + i as u32;
            }
        }
        Tensor::from_vec(positions, (self.rows, self.seq), self.mask.device())
    }

    /// Whether every row's real tokens come first (padding, if any, at the end): then positions are `0..seq` in
    /// every row.
    pub(crate) fn padded_right(&self) -> bool {
        self.real.iter().all(|real| real.iter().enumerate().all(|(i, &t)| i == t))
    }

    /// The additive attention mask `[rows, 1, 1, seq]` in `dtype`: 0 for a real key, the dtype's lowest finite value
    /// for padding, made in F32 where it is exact and cast after (`f32::MIN` cast into FP16 would be −∞, and
    /// `0 × −∞` NaN).
    pub(crate) fn key_mask(&self, dtype: DType) -> candle_core::Result<Tensor> {
        let lowest = lowest(dtype);
        self.mask.affine(-lowest, lowest)?.unsqueeze(1)?.unsqueeze(1)?.to_dtype(dtype)
    }

    /// The additive mask `[rows, 1, n, seq]` in `dtype`, for the queries `start..start + n`, of attention where a
    /// query at (real) position `i` reads only the real keys at `j` with `allowed(i, j)`: causal (`j <= i`) or a local
    /// window. Positions count real tokens, as [`Batch::positions`] does. A padded query reads every key: each row of
    /// scores keeps a finite term (a row of −∞ would make its state NaN, and a NaN key poisons every query, masked or
    /// not).
    pub(crate) fn pair_mask(
        &self,
        dtype: DType,
        allowed: impl Fn(usize, usize) -> bool,
        start: usize,
        n: usize,
    ) -> candle_core::Result<Tensor> {
        let lowest = lowest(dtype) as f32;
        let (rows, seq) = (self.rows, self.seq);
        let device = self.mask.device();
        if self.padded_right() {
            // Positions are indices in every row: one pattern for all, the rows' padding added on the device.
            let pattern: Vec<f32> = (start..start + n)
                .flat_map(|q| (0..seq).map(move |k| (q, k)))
                .map(|(q, k)| if allowed(q, k) { 0.0 } else { lowest })
                .collect();
            let pattern = Tensor::from_vec(pattern, (1, 1, n, seq), device)?;
            let keys = self.mask.affine(-f64::from(lowest), f64::from(lowest))?.reshape((rows, 1, 1, seq))?;
            let queries = self.mask.narrow(1, start, n)?.reshape((rows, 1, n, 1))?;
            return pattern.broadcast_add(&keys)?.maximum(lowest)?.broadcast_mul(&queries)?.to_dtype(dtype);
        }
        let mut mask = vec![0f32; rows * n * seq];
        for (r, real) in self.real.iter().enumerate() {
            let block = &mut mask[r * n * seq..(r + 1) * n * seq];
            for (i, &q) in real.iter().enumerate().filter(|(_, &q)| (start..start + n).contains(&q)) {
                let keys = &mut block[(q - start) * seq..(q - start + 1) * seq];
                keys.fill(lowest);
                for (j, &k) in real.iter().enumerate() {
                    if allowed(i, j) {
                        keys[k] = 0.0;
                    }
                }
            }
        }
        Tensor::from_vec(mask, (rows, 1, n, seq), device)?.to_dtype(dtype)
    }

    /// Each row's first and last real token, as indices into the batch flattened to `[rows × seq]`.
    pub(crate) fn ends(&self) -> (Vec<u32>, Vec<u32>) {
        let at = |r: usize, t: Option<&usize>| (r * self.seq + t.copied().unwrap_or(0)) as u32;
        self.real.iter().enumerate().map(|(r, real)| (at(r, real.first()), at(r, real.last()))).unzip()
    }
}

/// The lowest finite value of a float dtype.
pub(crate) fn lowest(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::MIN),
        DType::BF16 => f64::from(half::bf16::MIN),
        _ => f64::from(f32::MIN),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::Batch;

    #[test]
    fn a_pair_mask_made_in_pieces_is_the_whole_one_cut_and_padding_either_side_reads_the_same_keys() {
        let (rows, seq) = (2, 5);
        // Row 0: three tokens padded on the right; row 1: the same three padded on the left.
        let mask = [1, 1, 1, 0, 0, 0, 0, 1, 1, 1];
        let batch =
            Batch::new(vec![0; rows * seq], vec![0; rows * seq], &mask, rows, seq, &Device::Cpu).expect("batch");
        let causal = |q: usize, k: usize| k <= q;
        let whole = batch.pair_mask(DType::F32, causal, 0, seq).expect("whole");
        for (start, n) in [(0, 2), (2, 2), (4, 1)] {
            let piece = batch.pair_mask(DType::F32, causal, start, n).expect("piece");
            let cut = whole.narrow(2, start, n).expect("cut");
            let same = piece.eq(&cut).expect("eq").to_dtype(DType::F32).expect("f32").min_all().expect("min");
            assert_eq!(same.to_scalar::<f32>().expect("scalar"), 1.0, "queries {start}..{}", start + n);
        }
        // The third real token reads the three real keys, wherever they are; a padded query reads every key.
        let values = whole.to_dtype(DType::F32).expect("f32").flatten_all().expect("flat").to_vec1::<f32>().expect("v");
        let readable = |row: usize, query: usize| -> Vec<usize> {
            (0..seq).filter(|&k| values[(row * seq + query) * seq + k] == 0.0).collect()
        };
        assert_eq!(readable(0, 2), vec![0, 1, 2]);
        assert_eq!(readable(1, 4), vec![2, 3, 4]);
        assert_eq!(readable(1, 2), vec![2]);
        assert_eq!(readable(1, 0), (0..seq).collect::<Vec<_>>());
        assert_eq!(readable(0, 4), (0..seq).collect::<Vec<_>>());
    }
}
