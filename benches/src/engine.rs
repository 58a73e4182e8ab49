//! Engine-only: a model run in this process by its engine at chosen batch sizes, with no HTTP, no queue and no
//! threads between: the physical limit the server is measured against.

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use inferd_core::ModelConfig;
use inferd_onnx::OnnxSettings;
use inferd_server::repository::{build_engine, EngineSettings};

use crate::report::{EngineReport, Percentiles};

pub struct EngineRun<'a> {
    pub model_dir: &'a Path,
    pub onnxruntime_lib: &'a Path,
    pub intra_op_threads: usize,
    pub batch_sizes: &'a [usize],
    pub warmup: Duration,
    pub duration: Duration,
}

pub fn run(run: &EngineRun<'_>) -> anyhow::Result<Vec<EngineReport>> {
    let config = ModelConfig::load(run.model_dir)?;
    let settings = EngineSettings {
        onnx: OnnxSettings {
            library: run.onnxruntime_lib.to_path_buf(),
            default_intra_op_threads: run.intra_op_threads,
        },
        default_precision: inferd_core::Precision::Fp32,
        builder: None,
    };
    let mut engine = build_engine(&config, &settings)?;
    let mut reports = Vec::new();
    for &batch in run.batch_sizes {
        let inputs = engine.metadata().warm_up_inputs(batch)?;
        let warm_until = Instant::now() + run.warmup;
        while Instant::now() < warm_until {
            engine.run(&inputs)?;
        }
        let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        let started = Instant::now();
        let mut calls = 0u64;
        while started.elapsed() < run.duration {
            let t = Instant::now();
            engine.run(&inputs)?;
            latency.record(t.elapsed().as_micros().clamp(1, 60_000_000) as u64)?;
            calls += 1;
        }
        let seconds = started.elapsed().as_secs_f64();
        reports.push(EngineReport {
            model: config.name.clone(),
            batch_size: batch,
            calls,
            rows_per_s: (calls * batch as u64) as f64 / seconds,
            latency_us: Percentiles::of(&latency),
        });
    }
    Ok(reports)
}
