//! `[[input]]` and `[[output]]`: the tensors a model declares, and whether a concrete shape fits one.

use serde::{Deserialize, Serialize};

use crate::dtype::DataType;

/// One input or output: name, data type and shape (`-1` for a variable dimension; a leading `-1` is the batch
/// dimension).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    /// An input a request may leave out (Triton's `optional`): a model of two towers takes its `text` or its
    /// `image`. Never set on an output, nor read from `model.toml`: an engine's inputs are all required.
    #[serde(default, skip)]
    pub optional: bool,
}

impl TensorSpec {
    /// The dimensions after the batch dimension.
    pub fn row_dims(&self) -> &[i64] {
        self.shape.get(1..).unwrap_or(&[])
    }

    /// Whether `dims` (a concrete shape, batch dimension included) fits this spec.
    pub fn accepts(&self, dims: &[usize]) -> bool {
        dims.len() == self.shape.len()
            && self.shape.iter().zip(dims).all(|(&want, &got)| want < 0 || usize::try_from(want) == Ok(got))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_spec_accepts_matching_shapes() {
        let spec = TensorSpec { name: "x".into(), datatype: DataType::Fp32, shape: vec![-1, 64], optional: false };
        assert!(spec.accepts(&[3, 64]));
        assert!(!spec.accepts(&[3, 63]));
        assert!(!spec.accepts(&[3, 64, 1]));
        assert_eq!(spec.row_dims(), &[64]);
    }
}
