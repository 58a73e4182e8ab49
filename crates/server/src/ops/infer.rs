//! The one inference path every protocol shares, read top to bottom: the protocol decodes its body ([`decode`]);
//! [`infer`] runs the model's task step before the batcher (tokenize, say), the batcher, and the task's step
//! after it (pool, normalise); the protocol encodes the [`Served`] answer ([`encode`]). CPU work that may be
//! large (decoding and encoding big bodies, tokenizing, scanning for non-finite numbers) leaves the async
//! runtime's threads; small requests stay on them, which is cheaper than a hop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use inferd_batcher::{Inputs, Pieces};
use inferd_core::{ModelMetadata, Tensor, TensorSpec};
use inferd_models::{Answer, Input, LoadedModel, Request, Service, TaskError, Texts};

use crate::budget::{Hold, Metered};
use crate::codec::shm::Span;
use crate::codec::{quoted, CodecError, Wanted};
use crate::error::{AppError, ErrorKind};
use crate::shm::SharedMemory;
use crate::state::AppState;
use crate::trace::Traced;

/// Bodies, tensors and answers above this size are decoded, checked and encoded on the blocking pool rather than
/// on the async runtime's threads.
pub const INLINE_WORK_BYTES: usize = 64 * 1024;

/// Response headers that say how a request was served. `HeaderName`s, checked once: a name given as a `&str` is
/// parsed again on every insert.
pub const BATCH_SIZE_HEADER: HeaderName = HeaderName::from_static("x-inferd-batch-size");
pub const QUEUE_TIME_HEADER: HeaderName = HeaderName::from_static("x-inferd-queue-us");
pub const COMPUTE_TIME_HEADER: HeaderName = HeaderName::from_static("x-inferd-compute-us");

/// Room in [`Served::headers`]'s map for what a plain answer leaves with besides them (its content type and length,
/// the request id, a route's own), so that the map does not grow on the way out.
const ANSWER_HEADERS: usize = 8;

/// A model's answer, and how it was served.
#[derive(Debug)]
pub struct Served {
    pub answer: Answer,
    pub batch_rows: usize,
    /// The task's step before the batcher (tokenizing, decoding pictures).
    pub prepare_time: Duration,
    pub queue_time: Duration,
    pub compute_time: Duration,
    /// From the request's decoded input to its answer.
    pub total_time: Duration,
    /// A text request's characters, all its texts together.
    pub characters: usize,
}

impl Served {
    /// The response headers that say how the request was served.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(ANSWER_HEADERS);
        for (name, value) in [
            (BATCH_SIZE_HEADER, self.batch_rows as u128),
            (QUEUE_TIME_HEADER, self.queue_time.as_micros()),
            (COMPUTE_TIME_HEADER, self.compute_time.as_micros()),
        ] {
            headers.insert(name, HeaderValue::from(u64::try_from(value).unwrap_or(u64::MAX)));
        }
        headers
    }
}

/// The answer `body`, of `content_type`, with `headers` (a [`Served::headers`] map and a route's own): the response
/// takes the map as it is, where an axum `(headers, body)` answer starts another map and copies each one into it.
pub fn respond(mut headers: HeaderMap, content_type: &'static str, body: impl Into<Body>) -> Response {
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let mut response = Response::new(body.into());
    *response.headers_mut() = headers;
    response
}

/// The work a decode of a `len`-byte body for `model` does, in bytes, for [`decode`]: `len`, or at least enough to
/// leave the runtime where the decode may copy an input out of shared memory. That is where `regions` has any, the
/// model takes an input that is not floating-point (see `Span::read_input`: floats are read in place) or a CUDA
/// region is registered (its inputs are copied from the GPU), and `names_a_region` says the request may name one.
pub fn decode_bytes(
    model: &LoadedModel,
    len: usize,
    regions: &SharedMemory,
    names_a_region: impl FnOnce() -> bool,
) -> usize {
    let copies = || regions.has_cuda() || model.metadata().inputs.iter().any(|s| Span::copies(s.datatype));
    if regions.in_use() && copies() && names_a_region() {
        len.max(INLINE_WORK_BYTES + 1)
    } else {
        len
    }
}

/// Whether an answer writes one of its outputs (`wanted`) to a GPU's memory, a copy that [`encode_shared`] makes
/// off the runtime.
pub fn answers_to_device(wanted: &[Wanted]) -> bool {
    wanted.iter().any(|w| w.memory.as_ref().is_some_and(Span::on_device))
}

/// Decodes a protocol's body of `len` bytes for `model` with `decode`, given the model as the protocols see it:
/// off the runtime when the body is large. Errors name the model.
pub async fn decode<T: Send + 'static>(
    model: &Arc<LoadedModel>,
    len: usize,
    decode: impl FnOnce(&ModelMetadata) -> Result<T, CodecError> + Send + 'static,
) -> Result<T, AppError> {
    let decoder = model.clone();
    let decoded = off_runtime_if(len > INLINE_WORK_BYTES, move || decode(decoder.metadata())).await?;
    decoded.map_err(|e| AppError::from(e).in_model(model.name()))
}

/// Decodes a body as it arrives ([`Payload::Unread`]) with `decode`, on a blocking thread of its own: one that waits
/// on the network as it reads, so it takes none of [`off_runtime_if`]'s turns, which are for work that keeps a core
/// busy. A refused body is answered once the rest of it is read and thrown away.
pub async fn decode_unread<T: Send + 'static>(
    model: &Arc<LoadedModel>,
    hold: &Arc<Hold>,
    body: Body,
    max_body_bytes: usize,
    decode: impl FnOnce(&mut Metered, &ModelMetadata) -> Result<T, CodecError> + Send + 'static,
) -> Result<T, AppError> {
    let mut metered = hold.meter(body, max_body_bytes);
    let decoder = model.clone();
    // Work on the blocking pool: no idle runtime thread polls meanwhile (see `idle`).
    let busy = crate::idle::busy();
    let (decoded, mut metered) =
        tokio::task::spawn_blocking(move || (decode(&mut metered, decoder.metadata()), metered))
            .await
            .map_err(|e| AppError::internal(format!("decoding the request body: {e}")))?;
    drop(busy);
    match decoded {
        Ok(t) => Ok(t),
        Err(e) => {
            let error = metered.refused.take().unwrap_or_else(|| AppError::from(e).in_model(model.name()));
            metered.discard().await;
            Err(error)
        }
    }
}

/// Encodes an answer with a protocol's `encode`: off the runtime when it is large.
pub async fn encode<T: Send + 'static>(
    served: Served,
    encode: impl FnOnce(Served) -> Result<T, CodecError> + Send + 'static,
) -> Result<T, AppError> {
    encode_shared(served, false, encode).await
}

/// [`encode`], for an answer that may write its outputs to shared memory: off the runtime also where `to_device`
/// says one of them goes to a CUDA region (a copy to a GPU).
pub async fn encode_shared<T: Send + 'static>(
    served: Served,
    to_device: bool,
    encode: impl FnOnce(Served) -> Result<T, CodecError> + Send + 'static,
) -> Result<T, AppError> {
    let off = to_device || encodes_large(&served.answer.tensors);
    Ok(off_runtime_answering(off, move || encode(served)).await??)
}

/// A request's option: its answer's encoder scans every output for NaN and infinity as it writes it to shared
/// memory, so [`infer`] does not scan them first (see [`scan_outputs_on_write`]).
pub struct OutputsScannedOnWrite;

/// `request`, for an answer whose encoder scans `model`'s outputs for NaN and infinity as it writes them to shared
/// memory, instead of [`infer`]'s scan after the engine, which would read each output once more. It can where the
/// server refuses them, the model's outputs are its engine's as they are (the tensors task), and every output is
/// asked in shared memory, none as classes: then `wanted` is marked to be scanned, and the request says so with
/// [`OutputsScannedOnWrite`]. Else both are as they were.
pub fn scan_outputs_on_write(
    state: &AppState,
    model: &LoadedModel,
    request: Request,
    wanted: &mut [Wanted],
    classification: &[(usize, usize)],
) -> Request {
    let in_memory = |i: usize| {
        // In the host's memory: to a GPU, one copy of the whole, not one for each block of a scan.
        let in_host = |w: &Wanted| w.memory.as_ref().is_some_and(|span| !span.on_device());
        wanted.iter().any(|w| w.index == i && in_host(w)) && classification.iter().all(|&(c, _)| c != i)
    };
    let can = !state.allow_non_finite()
        && model.task.service() == Service::Tensors
        && (0..model.metadata().outputs.len()).all(in_memory);
    if !can {
        return request;
    }
    wanted.iter_mut().for_each(|w| w.finite = true);
    request.with(OutputsScannedOnWrite)
}

/// Runs `request` on `model`: the task's step before the batcher, the batcher, the task's step after it. The
/// request's decoded tensors (and a vision model's decoded pictures) count against `hold`, its share of the
/// in-flight budget, until it is answered.
pub async fn infer(
    state: &AppState,
    model: &Arc<LoadedModel>,
    mut request: Request,
    hold: &Arc<Hold>,
) -> Result<Served, AppError> {
    if request.reserve.is_none() {
        let hold = hold.clone();
        request.reserve = Some(Arc::new(move |bytes| hold.take(bytes).map_err(AppError::into_task_error)));
    }
    let started = Instant::now();
    let max_rows = state.limits().max_rows;
    let allow_non_finite = state.allow_non_finite();
    let outputs_scanned_later = request.options.get::<OutputsScannedOnWrite>().is_some();
    let large = matches!(&request.input, Input::Tensors(t) if tensor_bytes(t.iter().flatten()) > INLINE_WORK_BYTES);
    let task = model.task.clone();
    let deadline = request.deadline;
    let prepared = off_runtime_if(large || task.prepare_is_heavy(), move || {
        // Under load, heavy work waits for a turn: a request whose deadline passed meanwhile is answered as the
        // queue would answer it, without the work (tokenizing, decoding pictures) that nobody would use.
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(AppError::new(
                ErrorKind::DeadlineExceeded,
                "the request waited for a core to prepare it past its deadline",
            ));
        }
        if let (false, Input::Tensors(inputs)) = (allow_non_finite, &request.input) {
            let given = inputs.iter().zip(&task.metadata().inputs).filter_map(|(t, spec)| Some((t.as_ref()?, spec)));
            refuse_non_finite(given, "input").map_err(TaskError::Invalid)?;
        }
        // Counted here, where a large request's texts are read off the runtime anyway.
        let characters = characters(&request.input);
        Ok((task.prepare(request, max_rows)?, characters))
    })
    .await?
    .map_err(|e| e.in_model(model.name()))?;
    let (prepared, characters) = prepared;
    let prepare_time = started.elapsed();
    for &(stage, took) in &prepared.stages {
        state.metrics().prepare_stage(model.name(), stage, took);
    }
    let mut request = prepared.request;
    if !prepared.counted {
        hold.take(match &request.inputs {
            Inputs::Rows(tensors) => tensor_bytes(tensors.iter()),
            Inputs::Sequences(sequences) => tensor_bytes(sequences.iter().flatten()),
        })?;
    }
    // Preparing may have run on the blocking pool: the request's span is this task's.
    request.span = tracing::Span::current();
    let per_token = request.pieces == Pieces::Apart;
    let tower = prepared.tower;
    // While it is in the batcher, no idle runtime thread polls (see `idle`).
    let busy = crate::idle::busy();
    let out = model.batcher_for(tower).infer(request).await?;
    drop(busy);
    let finish = prepared.finish;
    let engine = model.clone();
    let answer = off_runtime_answering(encodes_large(&out.outputs), move || {
        // The engine's own outputs are checked, before the task's step makes an answer of them; per-token states
        // after it, once cut to the tokens the client sees (padded positions may hold anything).
        if !allow_non_finite && !per_token && !outputs_scanned_later {
            let specs = &engine.batcher_for(tower).metadata().outputs;
            refuse_non_finite(out.outputs.iter().zip(specs), "output").map_err(TaskError::Internal)?;
        }
        let answer = finish(out.outputs)?;
        if let Some((text, (i, value))) = answer
            .tensors
            .iter()
            .enumerate()
            .filter(|_| per_token && !allow_non_finite)
            .find_map(|(text, t)| t.first_non_finite().map(|found| (text, found)))
        {
            return Err(TaskError::Internal(format!("text {text}'s per-token states: element {i} is {value}")));
        }
        Ok(answer)
    })
    .await??;
    let served = Served {
        answer,
        batch_rows: out.batch_rows,
        prepare_time,
        queue_time: out.queue_time,
        compute_time: out.compute_time,
        total_time: started.elapsed(),
        characters,
    };
    if let Some(traced) = state.traces().sample(model.name()) {
        trace(model, &served, traced);
    }
    Ok(served)
}

/// A traced request's line in the structured log (the trace extension's settings chose it), inside its span.
fn trace(model: &LoadedModel, served: &Served, traced: Traced) {
    let tensors = traced.tensors.then(|| {
        let shown: Vec<String> =
            served.answer.tensors.iter().map(|t| format!("{}{:?}", t.dtype(), t.shape())).collect();
        shown.join(" ")
    });
    tracing::info!(
        target: "inferd::trace",
        model = model.name(),
        version = model.version,
        batch_rows = served.batch_rows,
        prepare_us = served.prepare_time.as_micros() as u64,
        queue_us = served.queue_time.as_micros() as u64,
        compute_us = served.compute_time.as_micros() as u64,
        total_us = served.total_time.as_micros() as u64,
        outputs = tensors,
        "trace"
    );
}

/// The characters of a text request's texts, all together; 0 for other input.
fn characters(input: &Input) -> usize {
    match input {
        Input::Texts(input) => match &input.texts {
            Texts::Strings(texts) => texts.iter().map(|t| t.chars().count()).sum(),
            Texts::Pairs(pairs) => pairs.iter().map(|(a, b)| a.chars().count() + b.chars().count()).sum(),
            Texts::Ids(_) => 0,
        },
        _ => 0,
    }
}

/// Triton's classification extension: each output `(index, k)` of `asked` in `tensors` (the model's outputs, in
/// order) replaced by its best `k` classes, `"score:index:label"` strings, labelled by the model's labels if it has
/// them.
pub fn classify_outputs(
    model: &LoadedModel,
    tensors: &mut [Tensor],
    asked: &[(usize, usize)],
) -> Result<(), CodecError> {
    for &(i, k) in asked {
        let output = tensors.get(i).ok_or_else(|| CodecError::Encode(format!("the engine returned no output {i}")))?;
        let name = model.metadata().outputs.get(i).map_or("", |s| s.name.as_str());
        let batched = model.batching.max_batch_size > 0;
        tensors[i] = inferd_models::triton_classification(output, k, model.task.labels(i), batched)
            .map_err(|e| CodecError::Invalid(format!("output `{}`: {e}", quoted(name))))?;
    }
    Ok(())
}

/// Whether answering with `tensors` is work for the blocking pool: their JSON text, at about 12 bytes a number,
/// would be over [`INLINE_WORK_BYTES`].
fn encodes_large(tensors: &[Tensor]) -> bool {
    tensors.iter().map(|t| t.element_count() * 12).sum::<usize>() > INLINE_WORK_BYTES
}

/// The bytes `tensors` hold.
fn tensor_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> usize {
    let bytes = |t: &Tensor| {
        t.raw_bytes().map_or_else(|| t.byte_strings().unwrap_or_default().iter().map(Vec::len).sum(), <[u8]>::len)
    };
    tensors.map(bytes).sum()
}

/// The non-finite policy (`--allow-non-finite` off): the first NaN or infinity in `tensors` is an error that
/// names the tensor and the element.
fn refuse_non_finite<'a>(
    tensors: impl IntoIterator<Item = (&'a Tensor, &'a TensorSpec)>,
    what: &str,
) -> Result<(), String> {
    for (t, spec) in tensors {
        if let Some((index, value)) = t.first_non_finite() {
            return Err(inferd_codec::non_finite(what, &spec.name, index, value));
        }
    }
    Ok(())
}

/// Runs `work` on the blocking pool when `large`, inline when not. At most as many such pieces of work run at once
/// as there are cores, the rest waiting for a turn without a thread of their own: tokenizing, decoding pictures and
/// large bodies are CPU work, which more threads than cores would only interleave (tokio's blocking pool grows to
/// hundreds of threads under load). A turn is held until the work ends, even when its request is dropped.
pub async fn off_runtime_if<T: Send + 'static>(
    large: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    off_runtime(large, Some(cpu_turns()), work).await
}

/// [`off_runtime_if`] for the steps after the batcher (making and encoding an answer): they take no turn, so that
/// answers already computed, whose requests hold their share of the in-flight budget, never wait behind the
/// preparation of new requests.
pub async fn off_runtime_answering<T: Send + 'static>(
    large: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    off_runtime(large, None, work).await
}

async fn off_runtime<T: Send + 'static>(
    large: bool,
    turns: Option<&Arc<tokio::sync::Semaphore>>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    if !large {
        return Ok(work());
    }
    let turn = match turns {
        Some(turns) => Some(
            turns
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| AppError::internal("the CPU work turns closed: this is a bug"))?,
        ),
        None => None,
    };
    // No idle runtime thread polls while the work runs (see `idle`).
    let _busy = crate::idle::busy();
    tokio::task::spawn_blocking(move || {
        let done = work();
        drop(turn);
        done
    })
    .await
    .map_err(|e| AppError::internal(format!("blocking task failed: {e}")))
}

/// The turns of [`off_runtime_if`]'s work: one per core, for the process.
fn cpu_turns() -> &'static Arc<tokio::sync::Semaphore> {
    static TURNS: std::sync::OnceLock<Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    TURNS.get_or_init(|| {
        Arc::new(tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())))
    })
}

/// A deadline `after` from now, or none where that is past the end of time.
pub fn deadline_in(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}

#[cfg(test)]
#[path = "infer_tests.rs"]
mod tests;
