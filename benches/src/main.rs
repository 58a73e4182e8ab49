//! `inferd-bench`: load for a running inferd over HTTP (closed or open loop, `/predict`, v2 JSON or v2 binary), or a
//! model run by its engine in-process with no HTTP. Prints a table, writes JSON and SVG plots next to each other.
//!
//! ```text
//! inferd-bench http --url http://127.0.0.1:8080 --model digits --concurrency 64
//! inferd-bench http --url http://127.0.0.1:8080 --model wide --sweep 1,4,16,64 --protocol v2-binary
//! inferd-bench http --url http://127.0.0.1:8080 --model digits --rate 2000
//! inferd-bench http --url http://127.0.0.1:8080 --model minilm-int8 --protocol embed --rows 1 --sweep 1,16,64
//! inferd-bench engine --model-dir .cache/models/wide --batch-sizes 1,8,64
//! inferd-bench engine --model-dir models/minilm-int8 --batch-sizes 1,16,64
//! ```

mod bodies;
mod engine;
mod load;
mod report;
mod texts;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::bodies::{Body, Protocol};
use crate::report::{line_chart, HttpReport};

/// The server's allocator (crates/server/src/alloc.rs), so that an engine measured here allocates as it does inside
/// the server: with ONNX Runtime's CPU arena off, its allocations go to jemalloc there, and to glibc's malloc here
/// would make the engine-only figures the limit of another program.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "inferd-bench", about = "Load generator and engine benchmark for inferd")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Drive a running inferd over HTTP.
    Http(HttpArgs),
    /// Run a model's engine in this process at fixed batch sizes: the limit the server is measured against.
    Engine(EngineArgs),
}

#[derive(Args)]
struct Common {
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Folder for the JSON and SVG results.
    #[arg(long, default_value = "benches/results")]
    out: PathBuf,
    /// Base name of the result files [default: the model and mode].
    #[arg(long)]
    name: Option<String>,
}

#[derive(Args)]
struct HttpArgs {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The model to load.
    #[arg(long)]
    model: String,
    #[arg(long, value_enum, default_value_t = Protocol::Predict)]
    protocol: Protocol,
    /// Rows per request (sentences with `--protocol embed`, passages with `--protocol rerank`).
    #[arg(long, default_value_t = 1)]
    rows: usize,
    /// Closed loop: this many clients, each sending its next request when the last is answered.
    #[arg(long, default_value_t = 64, conflicts_with_all = ["rate", "sweep"])]
    concurrency: usize,
    /// Closed loop at each of these concurrencies in turn (comma-separated); also plots throughput and p99.
    #[arg(long, value_delimiter = ',', conflicts_with = "rate")]
    sweep: Vec<usize>,
    /// Open loop: this many requests per second, whatever the answers do.
    #[arg(long)]
    rate: Option<f64>,
    /// Send this file as every request's body instead of random inputs from the model's metadata.
    #[arg(long)]
    body: Option<PathBuf>,
    /// The route to post to [default: the protocol's route for --model]; with --body, any server with the seed's
    /// `/predict` API can be driven.
    #[arg(long)]
    path: Option<String>,
    /// Sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "INFERD_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Threads of the load generator. One is plenty for 64 clients and leaves the other cores to the server.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    client_threads: u16,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct EngineArgs {
    /// A model folder (with its model.toml).
    #[arg(long)]
    model_dir: PathBuf,
    /// Batch sizes to run (comma-separated). A text model runs the text benchmark's sentences (a reranker: the
    /// reranking benchmark's query and passage pairs), each batch padded to its longest, and reports the padding
    /// waste.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    batch_sizes: Vec<usize>,
    #[arg(long, default_value = ".cache/onnxruntime/libonnxruntime.so.1.31.1")]
    onnxruntime_lib: PathBuf,
    /// ONNX Runtime intra-op threads of a pool of the model's own, in place of its `onnx.intra_op_threads`
    /// [default: the model's own pool, else the shared pool of every core, as in the server].
    #[arg(long)]
    intra_op_threads: Option<usize>,
    /// A vision model: this picture, made into the model's tensor once by its task (as the server would), is every
    /// row of every batch.
    #[arg(long)]
    picture: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

fn seconds(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).context("durations are non-negative seconds")
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Http(args) => {
            let runtime = match args.client_threads {
                1 => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
                n => tokio::runtime::Builder::new_multi_thread().worker_threads(n.into()).enable_all().build()?,
            };
            runtime.block_on(http(args))
        }
        Command::Engine(args) => {
            // As the server sizes it (before any thread starts).
            inferd_models::budget::set_cublas_workspace(inferd_models::budget::DEFAULT_CUBLAS_WORKSPACE_MIB);
            inferd_candle::fix_cpu_threads();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let run = engine::EngineRun {
                model_dir: &args.model_dir,
                onnxruntime_lib: &args.onnxruntime_lib,
                shared_threads: cores,
                intra_op_threads: args.intra_op_threads,
                picture: args.picture.as_deref(),
                batch_sizes: &args.batch_sizes,
                warmup: seconds(args.common.warmup)?,
                duration: seconds(args.common.duration)?,
            };
            let reports = engine::run(&run)?;
            print!("{}", report::engine_table(&reports));
            let name = args.common.name.unwrap_or_else(|| format!("{}-engine", reports[0].model));
            let path = report::write_json(&args.common.out, &name, &reports)?;
            eprintln!("inferd-bench: wrote {}", path.display());
            Ok(())
        }
    }
}

async fn http(args: HttpArgs) -> anyhow::Result<()> {
    let base = args.url.trim_end_matches('/').to_owned();
    let bodies: Vec<Body> = match &args.body {
        Some(path) => vec![Body {
            bytes: std::fs::read(path).with_context(|| format!("{}", path.display()))?.into(),
            header_length: None,
        }],
        None if args.protocol == Protocol::Embed => texts::bodies(args.rows, texts::SENTENCES.len())?,
        None if args.protocol == Protocol::Rerank => texts::rerank_bodies(args.rows, texts::SENTENCES.len())?,
        None => {
            let client = load::client(1)?;
            let mut request = client.get(format!("{base}/v2/models/{}", args.model));
            if let Some(key) = &args.api_key {
                request = request.bearer_auth(key);
            }
            let response = request.send().await.with_context(|| format!("cannot reach {base}"))?;
            anyhow::ensure!(response.status().is_success(), "model metadata: {}", response.text().await?);
            let meta: bodies::ModelMetadata = response.json().await?;
            bodies::generate(&meta.inputs, args.rows, args.protocol, 64, 0x5eed)?
        }
    };
    let content_type = match (args.protocol, &args.body) {
        (Protocol::V2Binary, _) => "application/octet-stream",
        (Protocol::Image, Some(path)) if path.extension().is_some_and(|e| e == "png") => "image/png",
        (Protocol::Image, Some(_)) => "image/jpeg",
        (Protocol::Image, None) => anyhow::bail!("--protocol image sends the picture given with --body"),
        _ => "application/json",
    };
    let template = load::Load {
        url: format!("{base}{}", args.path.clone().unwrap_or_else(|| args.protocol.path(&args.model))),
        bodies: Arc::new(bodies),
        content_type,
        concurrency: args.concurrency,
        rate: args.rate,
        warmup: seconds(args.common.warmup)?,
        duration: seconds(args.common.duration)?,
        api_key: args.api_key.clone(),
        progress: !args.quiet,
    };
    let runs: Vec<(Option<usize>, Option<f64>)> = match (args.rate, args.sweep.is_empty()) {
        (Some(rate), _) => vec![(None, Some(rate))],
        (None, true) => vec![(Some(args.concurrency), None)],
        (None, false) => args.sweep.iter().map(|&c| (Some(c), None)).collect(),
    };
    let mut reports = Vec::new();
    for (concurrency, rate) in runs {
        let load = load::Load { concurrency: concurrency.unwrap_or(1), rate, ..template.clone() };
        let outcome = load::run(load).await?;
        reports.push(HttpReport::new(&args.model, args.protocol, args.rows, concurrency, rate, &outcome));
    }
    print!("{}", report::http_table(&reports));
    let protocol = serde_json::to_value(args.protocol)?.as_str().unwrap_or("http").to_owned();
    let name = args.common.name.unwrap_or_else(|| format!("{}-{protocol}", args.model));
    let out = &args.common.out;
    let path = report::write_json(out, &name, &reports)?;
    let label = |r: &HttpReport| match (r.concurrency, r.rate) {
        (Some(c), _) => format!("{c} clients"),
        (_, Some(rate)) => format!("{rate:.0} req/s"),
        _ => String::new(),
    };
    // (file suffix, what is plotted, x axis, y axis, series)
    let mut plots = vec![(
        "cdf",
        "latency CDF",
        "latency (ms, log)",
        "fraction of requests",
        reports.iter().map(|r| (label(r), r.cdf.iter().map(|(us, q)| (us / 1e3, *q)).collect())).collect::<Vec<_>>(),
    )];
    if reports.len() > 1 {
        let series = |f: fn(&HttpReport) -> f64| {
            vec![(name.clone(), reports.iter().map(|r| (r.concurrency.unwrap_or(0) as f64, f(r))).collect())]
        };
        plots.push(("throughput", "throughput", "clients (log)", "requests/s", series(|r| r.throughput_rps)));
        plots.push(("p99", "p99 latency", "clients (log)", "p99 (ms)", series(|r| r.latency_us.p99 as f64 / 1e3)));
    }
    for (suffix, what, x, y, series) in plots {
        let title = format!("{} {protocol}: {what}", args.model);
        std::fs::write(out.join(format!("{name}-{suffix}.svg")), line_chart(&title, x, y, true, &series))?;
    }
    eprintln!("inferd-bench: wrote {} and its plots", path.display());
    Ok(())
}
