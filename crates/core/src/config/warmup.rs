//! `[warmup]`: the inputs a model runs once per instance before it is ready, and how large they may be.

use std::path::PathBuf;

use serde::Deserialize;

/// `[warmup]`: what a model runs once per instance before it is ready, so that its first requests do not pay for
/// the engine's lazy set-up (memory, kernels, graph optimisation).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmupConfig {
    /// No warm-up: the model is ready as soon as it loads.
    pub skip: bool,
    /// Each input's warm-up shape (and data), by input name. Inputs left out must have fixed non-batch
    /// dimensions: they run with zeros of those, and the batch of the inputs given.
    pub inputs: std::collections::BTreeMap<String, WarmupInput>,
}

/// One input of a warm-up run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupInput {
    /// The concrete shape, the batch dimension first where the model has one: `[1, 3, 640, 640]`.
    pub shape: Vec<usize>,
    /// Raw little-endian elements of exactly that shape, in the input's data type, resolved against the model's
    /// folder; zeros when not given.
    pub file: Option<PathBuf>,
}

/// Largest warm-up input accepted, in elements: 256 Mi (1 GiB of FP32).
pub const MAX_WARMUP_ELEMENTS: usize = 1 << 28;
