//! Admission checks: what the batcher itself needs of a request to queue, split and join it, and the split of a
//! request of rows into pieces of at most `max_batch_size` rows (a text request's sequences are its pieces).

use inferd_core::Tensor;

use crate::request::BatchError;
use crate::Model;

/// Checks a request of rows, and splits it into pieces of at most `max_batch_size` rows.
pub(crate) fn pieces(model: &Model, max: usize, inputs: Vec<Tensor>) -> Result<Vec<Vec<Tensor>>, BatchError> {
    let rows = check(model, &inputs)?;
    if rows <= max || model.unbatched {
        return Ok(vec![inputs]);
    }
    let counts = piece_rows(rows, max);
    let mut split: Vec<Vec<Tensor>> = counts.iter().map(|_| Vec::with_capacity(inputs.len())).collect();
    for input in &inputs {
        let parts = input.split_rows(&counts).map_err(|e| BatchError::InvalidInput(e.to_string()))?;
        for (piece, part) in split.iter_mut().zip(parts) {
            piece.push(part);
        }
    }
    Ok(split)
}

/// Checks a text request's sequences, each one piece; none may have more rows than a batch.
pub(crate) fn sequences(
    model: &Model,
    max: usize,
    sequences: Vec<Vec<Tensor>>,
) -> Result<Vec<Vec<Tensor>>, BatchError> {
    if sequences.is_empty() {
        return Err(BatchError::InvalidInput("the request has no sequences".into()));
    }
    for sequence in &sequences {
        let rows = check(model, sequence)?;
        if rows > max {
            return Err(BatchError::InvalidInput(format!(
                "a sequence entry of {rows} rows is more than max_batch_size ({max})"
            )));
        }
    }
    Ok(sequences)
}

/// Checks what the batcher itself needs of a request to queue, split and join it; returns its rows (1 for a
/// model that does not batch). Data types and shapes are not checked against the model's specs again: the
/// caller has (the server's codec, while decoding), and what still does not fit the engine refuses.
fn check(model: &Model, inputs: &[Tensor]) -> Result<usize, BatchError> {
    let specs = &model.metadata.inputs;
    // Joining a batch indexes each request's inputs by position: a missing one would panic a worker thread.
    if inputs.len() != specs.len() {
        return Err(BatchError::InvalidInput(format!(
            "model `{}` takes {} input(s), got {}",
            model.name,
            specs.len(),
            inputs.len()
        )));
    }
    if model.unbatched {
        // The tensors run as sent: nothing is split or joined.
        return Ok(1);
    }
    // Splitting and joining cut every input at the same rows.
    let rows = inputs.first().map_or(0, Tensor::rows);
    if let Some((spec, t)) = specs.iter().zip(inputs).find(|(_, t)| t.rows() != rows) {
        return Err(BatchError::InvalidInput(format!(
            "input `{}` has {} rows but the first input has {rows}: every input needs the same rows",
            spec.name,
            t.rows()
        )));
    }
    if rows == 0 {
        return Err(BatchError::InvalidInput("the request has no rows".into()));
    }
    if model.sequences {
        // Joining pads every token input along dim 1 to the batch's longest, and the policy weighs a sequence
        // by that length: one `[rows, seq]` form, with at least one token.
        let seq = inputs.first().and_then(|t| t.shape().get(1)).copied().unwrap_or(0);
        if seq == 0 || inputs.iter().any(|t| t.shape() != [rows, seq]) {
            return Err(BatchError::InvalidInput(
                "a sequence needs at least one token, and every token input the same [rows, seq] shape".into(),
            ));
        }
    }
    Ok(rows)
}

/// Splits `rows` into pieces of at most `max` rows.
pub(crate) fn piece_rows(rows: usize, max: usize) -> Vec<usize> {
    let mut counts = vec![max; rows / max];
    if !rows.is_multiple_of(max) {
        counts.push(rows % max);
    }
    counts
}
