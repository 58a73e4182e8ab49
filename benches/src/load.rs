//! The HTTP load: closed loop (a fixed number of clients, each sending its next request when the last is answered)
//! or open loop (requests sent at a fixed rate whatever the answers do, latency counted from the intended send
//! time, so a slow server cannot hide its queue). Warm-up first, then a fixed measured duration.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::bodies::Body;

/// The header inferd answers with: rows in the batch that served the request.
const BATCH_SIZE_HEADER: &str = "x-inferd-batch-size";
const HEADER_LENGTH: &str = "inference-header-content-length";
/// Most requests an open-loop run keeps outstanding; beyond this the client, not the server, is the limit.
const MAX_OUTSTANDING: usize = 8192;

#[derive(Debug, Clone)]
pub struct Load {
    pub url: String,
    pub bodies: Arc<Vec<Body>>,
    pub content_type: &'static str,
    /// Closed loop: the number of clients.
    pub concurrency: usize,
    /// Open loop: requests per second (closed loop when `None`).
    pub rate: Option<f64>,
    pub warmup: Duration,
    pub duration: Duration,
    pub api_key: Option<String>,
    pub progress: bool,
}

/// What one run measured (warm-up excluded).
#[derive(Debug)]
pub struct Outcome {
    /// Latencies of the 2xx answers, in microseconds.
    pub latency_us: Histogram<u64>,
    /// Answers by status code; 0 counts connection errors, and in an open loop requests the client could not send.
    pub statuses: BTreeMap<u16, u64>,
    /// Sum and count of `x-inferd-batch-size` over the 2xx answers that carried it.
    pub batch_rows: (u64, u64),
    pub elapsed: Duration,
}

impl Outcome {
    fn new() -> Self {
        Outcome {
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds; this is a bug"),
            statuses: BTreeMap::new(),
            batch_rows: (0, 0),
            elapsed: Duration::ZERO,
        }
    }

    fn merge(&mut self, other: &Outcome) {
        let _ = self.latency_us.add(&other.latency_us);
        for (code, n) in &other.statuses {
            *self.statuses.entry(*code).or_default() += n;
        }
        self.batch_rows.0 += other.batch_rows.0;
        self.batch_rows.1 += other.batch_rows.1;
    }

    fn record(&mut self, status: u16, latency: Duration, batch: Option<u64>) {
        *self.statuses.entry(status).or_default() += 1;
        if (200..300).contains(&status) {
            let _ = self.latency_us.record(latency.as_micros().clamp(1, 60_000_000) as u64);
            if let Some(rows) = batch {
                self.batch_rows.0 += rows;
                self.batch_rows.1 += 1;
            }
        }
    }
}

/// Sends one request and reads the whole answer; returns the status (0: no answer) and the batch size header.
async fn send(client: &reqwest::Client, load: &Load, body: &Body) -> (u16, Option<u64>) {
    let mut request = client.post(&load.url).header("content-type", load.content_type).body(body.bytes.clone());
    if let Some(len) = body.header_length {
        request = request.header(HEADER_LENGTH, len);
    }
    if let Some(key) = &load.api_key {
        request = request.bearer_auth(key);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let batch =
                response.headers().get(BATCH_SIZE_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
            match response.bytes().await {
                Ok(_) => (status, batch),
                Err(_) => (0, None),
            }
        }
        Err(_) => (0, None),
    }
}

pub fn client(connections: usize) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()?)
}

/// Runs the load and returns what the measured part saw.
pub async fn run(load: Load) -> anyhow::Result<Outcome> {
    let client = client(load.concurrency.max(64))?;
    let load = Arc::new(load);
    let start = Instant::now();
    let measure_from = start + load.warmup;
    let end = measure_from + load.duration;
    let sent = Arc::new(AtomicU64::new(0));
    let progress = load.progress.then(|| tokio::spawn(progress_bar(start, load.warmup, load.duration, sent.clone())));
    let mut outcome = match load.rate {
        None => closed_loop(&client, &load, measure_from, end, &sent).await,
        Some(rate) => open_loop(&client, &load, rate, measure_from, end, &sent).await?,
    };
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    outcome.elapsed = load.duration;
    Ok(outcome)
}

async fn closed_loop(
    client: &reqwest::Client,
    load: &Arc<Load>,
    from: Instant,
    end: Instant,
    sent: &Arc<AtomicU64>,
) -> Outcome {
    let tasks: Vec<_> = (0..load.concurrency)
        .map(|worker| {
            let (client, load, sent) = (client.clone(), load.clone(), sent.clone());
            tokio::spawn(async move {
                let mut outcome = Outcome::new();
                let mut i = worker;
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let body = &load.bodies[i % load.bodies.len()];
                    i += load.concurrency;
                    let (status, batch) = send(&client, &load, body).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                    let done = Instant::now();
                    // Only requests sent and answered inside the measured window count.
                    if began >= from && done <= end {
                        outcome.record(status, done - began, batch);
                    }
                }
                outcome
            })
        })
        .collect();
    let mut total = Outcome::new();
    for task in tasks {
        if let Ok(outcome) = task.await {
            total.merge(&outcome);
        }
    }
    total
}

async fn open_loop(
    client: &reqwest::Client,
    load: &Arc<Load>,
    rate: f64,
    from: Instant,
    end: Instant,
    sent: &Arc<AtomicU64>,
) -> anyhow::Result<Outcome> {
    anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be a positive number of requests per second");
    let interval = Duration::from_secs_f64(1.0 / rate);
    let outstanding = Arc::new(tokio::sync::Semaphore::new(MAX_OUTSTANDING));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u16, Duration, Option<u64>, bool)>();
    let start = Instant::now();
    let mut k: u64 = 0;
    let mut dropped = 0u64;
    loop {
        let due = start + interval.mul_f64(k as f64);
        if due >= end {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let measured = due >= from;
        k += 1;
        let Ok(permit) = outstanding.clone().try_acquire_owned() else {
            dropped += u64::from(measured);
            continue;
        };
        let (client, load, tx, sent) = (client.clone(), load.clone(), tx.clone(), sent.clone());
        let body_index = k as usize % load.bodies.len();
        tokio::spawn(async move {
            let (status, batch) = send(&client, &load, &load.bodies[body_index]).await;
            sent.fetch_add(1, Ordering::Relaxed);
            // Latency from the intended send time: a backed-up client or server shows in it.
            let _ = tx.send((status, due.elapsed(), batch, measured && Instant::now() <= end));
            drop(permit);
        });
    }
    drop(tx);
    let mut outcome = Outcome::new();
    while let Some((status, latency, batch, measured)) = rx.recv().await {
        if measured {
            outcome.record(status, latency, batch);
        }
    }
    if dropped > 0 {
        *outcome.statuses.entry(0).or_default() += dropped;
    }
    Ok(outcome)
}

/// A one-line progress bar on stderr, redrawn every half second.
async fn progress_bar(start: Instant, warmup: Duration, duration: Duration, sent: Arc<AtomicU64>) {
    let total = warmup + duration;
    let mut last = (start, 0u64);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = Instant::now();
        let done = now.duration_since(start).min(total);
        let width = 30;
        let filled = (done.as_secs_f64() / total.as_secs_f64() * width as f64) as usize;
        let count = sent.load(Ordering::Relaxed);
        let rate = (count - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, count);
        let phase = if done < warmup { "warm-up" } else { "measuring" };
        eprint!(
            "\r[{}{}] {:>5.1}/{:.0} s  {phase:<9} {rate:>9.0} req/s",
            "=".repeat(filled),
            " ".repeat(width - filled.min(width)),
            done.as_secs_f64(),
            total.as_secs_f64()
        );
    }
}
