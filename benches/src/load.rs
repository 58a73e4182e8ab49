//! The HTTP load: closed loop (a fixed number of clients, each sending its next request when the last is answered)
//! or open loop (requests sent at a fixed rate whatever the answers do, latency counted from the intended send
//! time, so a slow server cannot hide its queue). Warm-up first, then a fixed measured duration.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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

/// Sends one request over the shared pool and reads the whole answer; returns the status (0: no answer) and the
/// batch size header. The open loop's path: its requests overlap without bound, so they need a pool.
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
            let batch = batch_rows(response.headers());
            match response.bytes().await {
                Ok(_) => (status, batch),
                Err(_) => (0, None),
            }
        }
        Err(_) => (0, None),
    }
}

fn batch_rows(headers: &HeaderMap) -> Option<u64> {
    headers.get(BATCH_SIZE_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

pub fn client(connections: usize) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()?)
}

/// What every request of a run shares: where it goes and the headers it carries.
struct Target {
    /// `host:port`, to connect to.
    authority: String,
    /// The path and query, sent in origin form.
    path: Uri,
    headers: HeaderMap,
}

impl Target {
    fn new(load: &Load) -> anyhow::Result<Target> {
        let uri: Uri = load.url.parse().with_context(|| format!("not a URL: {}", load.url))?;
        anyhow::ensure!(uri.scheme_str() == Some("http"), "only http:// URLs can be driven: {}", load.url);
        let authority = uri.authority().context("the URL has no host")?;
        let port = authority.port_u16().unwrap_or(80);
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_str(authority.as_str())?);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(load.content_type));
        if let Some(key) = &load.api_key {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {key}"))?);
        }
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
        Ok(Target { authority: format!("{}:{port}", authority.host()), path, headers })
    }

    fn request(&self, body: &Body) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body.bytes.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.path.clone();
        *request.headers_mut() = self.headers.clone();
        if let Some(len) = body.header_length {
            request.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(len));
        }
        request
    }
}

/// One closed-loop client: a keep-alive HTTP/1.1 connection of its own, made again after an error. No pool, no URL
/// parsing per request: the load generator shares the cores with the server, so each request should cost it little.
struct Connection {
    target: Arc<Target>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    fn new(target: Arc<Target>) -> Connection {
        Connection { target, sender: None }
    }

    async fn connect(&self) -> Option<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(&self.target.authority).await.ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(connection);
        Some(sender)
    }

    /// Sends one request and reads the whole answer; returns the status (0: no answer) and the batch size header.
    async fn send(&mut self, body: &Body) -> (u16, Option<u64>) {
        let mut sender = match self.sender.take() {
            Some(sender) => sender,
            None => match self.connect().await {
                Some(sender) => sender,
                None => {
                    // Nothing answers: do not spin on the cores the server needs.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    return (0, None);
                }
            },
        };
        if sender.ready().await.is_err() {
            return (0, None);
        }
        let answer = tokio::time::timeout(Duration::from_secs(60), async {
            let response = sender.send_request(self.target.request(body)).await.ok()?;
            let status = response.status().as_u16();
            let batch = batch_rows(response.headers());
            response.into_body().collect().await.ok()?;
            Some((status, batch))
        })
        .await;
        match answer {
            Ok(Some(answer)) => {
                self.sender = Some(sender);
                answer
            }
            _ => (0, None),
        }
    }
}

/// Runs the load and returns what the measured part saw.
pub async fn run(load: Load) -> anyhow::Result<Outcome> {
    let load = Arc::new(load);
    let start = Instant::now();
    let measure_from = start + load.warmup;
    let end = measure_from + load.duration;
    let sent = Arc::new(AtomicU64::new(0));
    let progress = load.progress.then(|| tokio::spawn(progress_bar(start, load.warmup, load.duration, sent.clone())));
    let mut outcome = match load.rate {
        None => closed_loop(Arc::new(Target::new(&load)?), &load, measure_from, end, &sent).await,
        Some(rate) => open_loop(&client(1024)?, &load, rate, measure_from, end, &sent).await?,
    };
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    outcome.elapsed = load.duration;
    Ok(outcome)
}

async fn closed_loop(
    target: Arc<Target>,
    load: &Arc<Load>,
    from: Instant,
    end: Instant,
    sent: &Arc<AtomicU64>,
) -> Outcome {
    let tasks: Vec<_> = (0..load.concurrency)
        .map(|worker| {
            let (mut connection, load, sent) = (Connection::new(target.clone()), load.clone(), sent.clone());
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
                    let (status, batch) = connection.send(body).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                    let done = Instant::now();
                    // Every answer that arrives inside the measured window counts, whenever it was sent: counting
                    // only those also sent inside it would drop about latency / window of the work when requests
                    // take seconds.
                    if done >= from && done <= end {
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
