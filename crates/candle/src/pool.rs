//! sentence-transformers' pooling modes on the device: a last hidden state `[rows, seq, hidden]` into one F32 vector
//! per row, reading only each row's real tokens (as `inferd_core::text::pool` does on the host).

use candle_core::{DType, Tensor, D};
use inferd_core::Pooling;

use crate::batch::Batch;

/// `hidden` (any float dtype) pooled into `[rows, hidden]` F32.
pub(crate) fn pooled(hidden: &Tensor, batch: &Batch, pooling: Pooling) -> candle_core::Result<Tensor> {
    let (rows, seq, width) = hidden.dims3()?;
    let token = |indices: Vec<u32>| {
        let indices = Tensor::from_vec(indices, rows, hidden.device())?;
        hidden.reshape((rows * seq, width))?.index_select(&indices, 0)?.to_dtype(DType::F32)
    };
    let mask = &batch.mask;
    let weights = mask.unsqueeze(D::Minus1)?;
    let counts = || mask.sum_keepdim(1)?.clamp(1f32, f32::MAX);
    let hidden = || hidden.to_dtype(DType::F32);
    match pooling {
        Pooling::Cls => token(batch.ends().0),
        Pooling::LastToken => token(batch.ends().1),
        Pooling::Mean => hidden()?.broadcast_mul(&weights)?.sum(1)?.broadcast_div(&counts()?),
        Pooling::MeanSqrtLen => hidden()?.broadcast_mul(&weights)?.sum(1)?.broadcast_div(&counts()?.sqrt()?),
        Pooling::WeightedMean => {
            // The i-th real token (from 1) weighs i: the mask's running sum, zeroed on padding.
            let place = (mask.cumsum(1)? * mask)?;
            let total = place.sum_keepdim(1)?.clamp(1f32, f32::MAX)?;
            hidden()?.broadcast_mul(&place.unsqueeze(D::Minus1)?)?.sum(1)?.broadcast_div(&total)
        }
        Pooling::Max => {
            // Padding moved far below any state before the maximum.
            let shift = (weights.affine(1e30, -1e30))?;
            hidden()?.broadcast_add(&shift)?.max(1)
        }
    }
}
