//! Warm-up: the inputs a model runs once per instance before it is ready. They come from `[warmup]` where the
//! model's configuration gives shapes (and data), from the model's own shapes where those are all known, and
//! otherwise there is no warm-up, said plainly, rather than a guess at a shape the model may refuse.

use crate::config::{TensorSpec, WarmupConfig};
use crate::engine::ModelMetadata;
use crate::error::{Error, Result};
use crate::tensor::{element_count, Tensor};

/// What a model runs before it is ready.
#[derive(Debug)]
pub enum WarmUp {
    /// These inputs, once per instance.
    Run(Vec<Tensor>),
    /// Nothing, and why.
    Skip(String),
}

impl WarmUp {
    /// The warm-up of a model described by `metadata` and configured by `config`. A model with a batch dimension
    /// warms at `rows` rows unless `[warmup]` gives its shapes. An error is the configuration's: `[warmup]`
    /// names an input the model lacks, a shape the input cannot take, or a data file of the wrong size.
    pub fn plan(config: &WarmupConfig, metadata: &ModelMetadata, rows: usize) -> Result<WarmUp> {
        if config.skip {
            return Ok(WarmUp::Skip("[warmup] skip = true".into()));
        }
        if metadata.text.is_some() {
            return metadata.warm_up_inputs(rows).map(WarmUp::Run);
        }
        let bad = |message: String| Error::Unsupported(message);
        if let Some(unknown) = config.inputs.keys().find(|name| !metadata.inputs.iter().any(|s| &s.name == *name)) {
            let names: Vec<&str> = metadata.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(bad(format!("warmup.inputs.{unknown}: the model has no such input (it has {names:?})")));
        }
        let batched = metadata.has_batch_dim();
        // The batch of the shapes given, which the inputs left out share.
        let rows = match config.inputs.values().next() {
            Some(given) if batched => given.shape.first().copied().unwrap_or(rows),
            _ => rows,
        };
        let mut inputs = Vec::with_capacity(metadata.inputs.len());
        for spec in &metadata.inputs {
            let tensor = match config.inputs.get(&spec.name) {
                Some(given) => {
                    let fits = spec.accepts(&given.shape) && (!batched || given.shape.first() == Some(&rows));
                    if !fits {
                        return Err(bad(format!(
                            "warmup.inputs.{}.shape: {:?} does not fit the input's {:?}{}",
                            spec.name,
                            given.shape,
                            spec.shape,
                            if batched {
                                format!(" with the batch of {rows} the other warm-up inputs have")
                            } else {
                                String::new()
                            }
                        )));
                    }
                    match &given.file {
                        Some(file) => from_file(spec, &given.shape, file)?,
                        None => Tensor::zeros(spec.datatype, given.shape.clone())?,
                    }
                }
                None => match known_shape(spec, batched.then_some(rows)) {
                    Some(shape) => Tensor::zeros(spec.datatype, shape)?,
                    None if config.inputs.is_empty() => {
                        return Ok(WarmUp::Skip(format!(
                            "input `{}` has variable dimensions {:?}: give its warm-up shape in [warmup.inputs.{}]",
                            spec.name, spec.shape, spec.name
                        )))
                    }
                    None => {
                        return Err(bad(format!(
                            "warmup.inputs: input `{}` has variable dimensions {:?}: give its shape too",
                            spec.name, spec.shape
                        )))
                    }
                },
            };
            inputs.push(tensor);
        }
        Ok(WarmUp::Run(inputs))
    }
}

/// The input's whole shape when only the batch (`rows`, for a model that has one) is left to choose.
fn known_shape(spec: &TensorSpec, rows: Option<usize>) -> Option<Vec<usize>> {
    let fixed = match rows {
        Some(_) => spec.row_dims(),
        None => &spec.shape[..],
    };
    let dims: Option<Vec<usize>> = fixed.iter().map(|&d| usize::try_from(d).ok()).collect();
    Some(rows.into_iter().chain(dims?).collect())
}

/// An input's warm-up data from a file of raw little-endian elements.
fn from_file(spec: &TensorSpec, shape: &[usize], file: &std::path::Path) -> Result<Tensor> {
    let bad = |message: String| Error::Unsupported(format!("warmup.inputs.{}.file: {message}", spec.name));
    let size = spec.datatype.size().ok_or_else(|| bad(format!("{} data cannot come from a file", spec.datatype)))?;
    let want = element_count(shape)?.saturating_mul(size);
    let bytes = std::fs::read(file).map_err(|e| bad(format!("cannot read {}: {e}", file.display())))?;
    if bytes.len() != want {
        return Err(bad(format!(
            "{} holds {} bytes; {} {shape:?} takes {want}",
            file.display(),
            bytes.len(),
            spec.datatype
        )));
    }
    Tensor::new(spec.datatype, shape.to_vec(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WarmupInput;
    use crate::{DataType, Precision};

    fn meta(inputs: &[(&str, DataType, &[i64])]) -> ModelMetadata {
        ModelMetadata {
            inputs: inputs
                .iter()
                .map(|(name, datatype, shape)| TensorSpec {
                    name: (*name).into(),
                    datatype: *datatype,
                    shape: shape.to_vec(),
                    optional: false,
                })
                .collect(),
            outputs: Vec::new(),
            device: "cpu".into(),
            precision: Precision::Fp32,
            platform: "test",
            text: None,
        }
    }

    fn given(entries: &[(&str, &[usize], Option<&std::path::Path>)]) -> WarmupConfig {
        WarmupConfig {
            skip: false,
            inputs: entries
                .iter()
                .map(|(name, shape, file)| {
                    ((*name).to_owned(), WarmupInput { shape: shape.to_vec(), file: file.map(Into::into) })
                })
                .collect(),
        }
    }

    fn shapes(plan: WarmUp) -> Vec<Vec<usize>> {
        match plan {
            WarmUp::Run(inputs) => inputs.iter().map(|t| t.shape().to_vec()).collect(),
            WarmUp::Skip(why) => panic!("skipped: {why}"),
        }
    }

    #[test]
    fn known_shapes_warm_at_the_batch_asked() {
        let m = meta(&[("x", DataType::Fp32, &[-1, 64]), ("ids", DataType::Int64, &[-1, 2])]);
        assert_eq!(shapes(WarmUp::plan(&WarmupConfig::default(), &m, 8).expect("plan")), vec![vec![8, 64], vec![8, 2]]);
    }

    #[test]
    fn variable_dimensions_skip_warm_up_unless_configured() {
        let m = meta(&[("images", DataType::Fp32, &[-1, 3, -1, -1]), ("scale", DataType::Fp32, &[-1, 2])]);
        match WarmUp::plan(&WarmupConfig::default(), &m, 64).expect("plan") {
            WarmUp::Skip(why) => {
                assert!(why.contains("input `images` has variable dimensions [-1, 3, -1, -1]"), "{why}")
            }
            WarmUp::Run(_) => panic!("no guess at H and W"),
        }
        // Configured: its batch applies to the inputs left out.
        let config = given(&[("images", &[2, 3, 32, 48], None)]);
        assert_eq!(shapes(WarmUp::plan(&config, &m, 64).expect("plan")), vec![vec![2, 3, 32, 48], vec![2, 2]]);
    }

    #[test]
    fn a_model_without_a_batch_dimension_warms_with_its_whole_shapes() {
        let m = meta(&[("x", DataType::Fp32, &[1, 3, 8, 8])]);
        assert_eq!(shapes(WarmUp::plan(&WarmupConfig::default(), &m, 64).expect("plan")), vec![vec![1, 3, 8, 8]]);
        let m = meta(&[("x", DataType::Fp32, &[1, 3, -1, -1])]);
        assert!(matches!(WarmUp::plan(&WarmupConfig::default(), &m, 64), Ok(WarmUp::Skip(_))));
        let config = given(&[("x", &[1, 3, 16, 24], None)]);
        assert_eq!(shapes(WarmUp::plan(&config, &m, 64).expect("plan")), vec![vec![1, 3, 16, 24]]);
    }

    #[test]
    fn data_comes_from_a_file_of_exactly_the_shape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("x.bin");
        let values: Vec<u8> = [1.5f32, -2.0, 3.25, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&file, &values).expect("write");
        let m = meta(&[("x", DataType::Fp32, &[-1, 2])]);
        let config = given(&[("x", &[2, 2], Some(&file))]);
        let WarmUp::Run(inputs) = WarmUp::plan(&config, &m, 64).expect("plan") else { panic!("runs") };
        assert_eq!(inputs[0].to_vec::<f32>().expect("fp32"), vec![1.5, -2.0, 3.25, 4.0]);
        let config = given(&[("x", &[3, 2], Some(&file))]);
        let err = WarmUp::plan(&config, &m, 64).expect_err("wrong size").to_string();
        assert!(err.contains("holds 16 bytes; FP32 [3, 2] takes 24"), "{err}");
    }

    #[test]
    fn a_configuration_that_does_not_fit_the_model_is_an_error() {
        let m = meta(&[("images", DataType::Fp32, &[-1, 3, -1, -1]), ("scale", DataType::Fp32, &[-1, -1])]);
        let cases = [
            (given(&[("image", &[1, 3, 8, 8], None)]), "warmup.inputs.image: the model has no such input"),
            (given(&[("images", &[1, 4, 8, 8], None)]), "warmup.inputs.images.shape: [1, 4, 8, 8]"),
            (given(&[("images", &[1, 3, 8, 8], None)]), "input `scale` has variable dimensions [-1, -1]: give"),
            (given(&[("images", &[1, 3, 8, 8], None), ("scale", &[2, 2], None)]), "with the batch of 1"),
            (given(&[("images", &[1, 3, 8, 8], Some(std::path::Path::new("/no/such/file")))]), "cannot read"),
        ];
        for (config, expected) in cases {
            let err = WarmUp::plan(&config, &m, 64).expect_err("refused").to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
    }

    #[test]
    fn skip_turns_warm_up_off() {
        let config = WarmupConfig { skip: true, ..WarmupConfig::default() };
        let m = meta(&[("x", DataType::Fp32, &[-1, 64])]);
        assert!(matches!(WarmUp::plan(&config, &m, 8), Ok(WarmUp::Skip(why)) if why.contains("skip = true")));
    }
}
