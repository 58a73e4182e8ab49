//! Engine-only: a model run in this process by its engine at chosen batch sizes, with no HTTP, no queue and no
//! threads between: the physical limit the server is measured against.

use std::path::Path;

use anyhow::Context;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use inferd_core::{ModelConfig, ModelMetadata, Tensor};
use inferd_models::{build_engine, EngineSettings, Input, OnnxSettings, Request, TextInput, Texts};

use crate::report::{EngineReport, Percentiles};

pub struct EngineRun<'a> {
    pub model_dir: &'a Path,
    pub onnxruntime_lib: &'a Path,
    /// The shared pool's threads, which a model that names none of its own uses (as in the server).
    pub shared_threads: usize,
    /// In place of the model's own.
    pub intra_op_threads: Option<usize>,
    /// A vision model's picture, made into its tensor once.
    pub picture: Option<&'a Path>,
    pub batch_sizes: &'a [usize],
    pub warmup: Duration,
    pub duration: Duration,
}

pub fn run(run: &EngineRun<'_>) -> anyhow::Result<Vec<EngineReport>> {
    let mut config = ModelConfig::load(run.model_dir)?;
    if let Some(threads) = run.intra_op_threads {
        config.onnx.intra_op_threads = Some(threads);
    }
    let settings = EngineSettings {
        onnx: OnnxSettings { library: run.onnxruntime_lib.to_path_buf(), shared_threads: run.shared_threads },
        default_precision: inferd_core::Precision::Fp32,
        builder: None,
        gpu_memory: None,
    };
    let mut engine = build_engine(&config, &settings)?;
    // A model of two towers (CLIP): its task needs the text tower's metadata; its pictures run on `engine`.
    let text_tower = engine.text_tower();
    let mut reports = Vec::new();
    let mut prepare_ms = None;
    let sequences = match engine.metadata().text {
        Some(_) => Some(tokenize(&config, engine.metadata())?),
        None => None,
    };
    for &batch in run.batch_sizes {
        let (batches, padding_waste) = match &sequences {
            Some(sequences) => {
                let (batches, waste) = text_batches(sequences, batch)?;
                (batches, Some(waste))
            }
            None => match run.picture {
                Some(path) => {
                    let texts = text_tower.as_ref().map(|e| e.metadata());
                    let (inputs, ms) = picture_batch(&config, engine.metadata(), texts, path, batch)?;
                    prepare_ms = Some(ms);
                    (vec![inputs], None)
                }
                None => (vec![engine.metadata().warm_up_inputs(batch)?], None),
            },
        };
        let warm_until = Instant::now() + run.warmup;
        for inputs in batches.iter().cycle() {
            if Instant::now() >= warm_until {
                break;
            }
            engine.run(inputs)?;
        }
        let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        let started = Instant::now();
        let mut calls = 0u64;
        for inputs in batches.iter().cycle() {
            if started.elapsed() >= run.duration {
                break;
            }
            let t = Instant::now();
            engine.run(inputs)?;
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
            padding_waste,
            prepare_ms,
        });
    }
    Ok(reports)
}

/// A batch of `batch` rows of the picture at `path`, made into the model's input by its task as the server does,
/// and the milliseconds that takes (the mean of 20 runs, after one).
fn picture_batch(
    config: &ModelConfig,
    metadata: &ModelMetadata,
    texts: Option<&ModelMetadata>,
    path: &Path,
    batch: usize,
) -> anyhow::Result<(Vec<Tensor>, f64)> {
    const RUNS: u32 = 20;
    let task = inferd_models::task::for_model(config, metadata, texts)?;
    let file: bytes::Bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?.into();
    let prepare = || {
        let request = Request::new(Input::Images(vec![file.clone()]));
        task.prepare(request, usize::MAX).map_err(|e| anyhow::anyhow!("{e}"))
    };
    let prepared = prepare()?;
    let started = Instant::now();
    for _ in 0..RUNS {
        prepare()?;
    }
    let ms = started.elapsed().as_secs_f64() * 1e3 / f64::from(RUNS);
    let inferd_batcher::Inputs::Rows(rows) = prepared.request.inputs else {
        anyhow::bail!("a vision model's request holds rows");
    };
    let inputs = rows
        .iter()
        .map(|t| Tensor::concat_rows(&vec![t; batch]).map_err(anyhow::Error::from))
        .collect::<anyhow::Result<_>>()?;
    Ok((inputs, ms))
}

/// Passages per query of the reranking benchmark's pairs, as the HTTP run sends them.
const RERANK_PASSAGES: usize = 20;

/// The text benchmark's sentences (a reranker: the reranking benchmark's query and passage pairs), tokenized as the
/// server does (the model's task): for each, its token inputs `[1, len]`.
fn tokenize(config: &ModelConfig, metadata: &ModelMetadata) -> anyhow::Result<Vec<Vec<Tensor>>> {
    use crate::texts::{rerank_request, SENTENCES};
    let task = inferd_models::task::for_model(config, metadata, None)?;
    let texts = match inferd_models::registration(config).service {
        inferd_models::Service::Rerank => {
            let pairs = (0..SENTENCES.len())
                .flat_map(|b| {
                    let (query, passages) = rerank_request(b, RERANK_PASSAGES);
                    passages.into_iter().map(move |p| (query.to_owned(), p.to_owned()))
                })
                .collect();
            Texts::Pairs(pairs)
        }
        _ => Texts::Strings(SENTENCES.iter().map(|s| (*s).to_owned()).collect()),
    };
    let request = Request::new(Input::Texts(TextInput::new(texts)));
    let prepared = task.prepare(request, usize::MAX).map_err(|e| anyhow::anyhow!("{e}"))?;
    prepared.into_sequences().ok_or_else(|| anyhow::anyhow!("a text model's request holds sequences"))
}

/// Batches of `batch` sentences, each padded to its longest, and their padding waste. The sentences go round the
/// set (so every one runs as often) in order of length, so that each batch holds lengths as close as they can be:
/// the least padding any batcher could reach, which makes this the limit the server is measured against.
fn text_batches(sequences: &[Vec<Tensor>], batch: usize) -> anyhow::Result<(Vec<Vec<Tensor>>, f64)> {
    let mut sequences: Vec<&Vec<Tensor>> = sequences.iter().collect();
    sequences.sort_by_key(|s| s[0].shape()[1]);
    let n = sequences.len();
    let count = n / gcd(n, batch);
    let (mut real, mut padded) = (0usize, 0usize);
    let mut batches = Vec::with_capacity(count);
    for b in 0..count {
        let members: Vec<&Vec<Tensor>> = (0..batch).map(|i| sequences[(b * batch + i) % n]).collect();
        let lengths: Vec<usize> = members.iter().map(|s| s[0].shape()[1]).collect();
        real += lengths.iter().sum::<usize>();
        padded += lengths.iter().max().copied().unwrap_or(0) * batch;
        let inputs = (0..members[0].len())
            .map(|k| Tensor::concat_rows_padded(&members.iter().map(|s| &s[k]).collect::<Vec<_>>()))
            .collect::<inferd_core::Result<Vec<_>>>()?;
        batches.push(inputs);
    }
    Ok((batches, padded as f64 / real.max(1) as f64))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
