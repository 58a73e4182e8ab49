//! inferd-codec, the wire formats: request bodies decoded straight into typed tensors, with the server's limits enforced as the
//! bytes stream by, and tensors encoded back. Knows nothing of HTTP, routes or the batcher: a decoder gets bytes
//! and a model's metadata, and gives tensors or a [`CodecError`].

mod elements;
pub mod grpc;
pub mod json;
mod plain;
pub mod predict;
pub mod shm;
pub mod v2;

use std::fmt;

use inferd_core::{ModelMetadata, Tensor, TensorSpec};

/// An output a request asks for: which, and where its bytes go.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Its index among the model's outputs.
    pub index: usize,
    /// In binary after the answer's JSON part (HTTP), where not in shared memory.
    pub binary: bool,
    /// Written to this span of a registered region, not the answer.
    pub memory: Option<shm::Span>,
    /// Refused if it holds a NaN or infinity, found as it is written to `memory`: where the server refuses them
    /// and nothing else scans this output (see [`inferd_core::Tensor::write_finite`]). The span then holds the
    /// blocks written before the one with the first such number, and the outputs written before this one.
    pub finite: bool,
}

impl Wanted {
    /// The output among the engine's `outputs`, and its spec.
    fn of<'a>(
        &self,
        outputs: &'a [Tensor],
        meta: &'a ModelMetadata,
    ) -> Result<(&'a Tensor, &'a TensorSpec), CodecError> {
        let i = self.index;
        outputs
            .get(i)
            .zip(meta.outputs.get(i))
            .ok_or_else(|| CodecError::Encode(format!("the engine returned no output {i}")))
    }
}

/// Why a body could not be decoded, or an answer encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The body is malformed, or does not fit the model: the client's fault.
    #[error("{0}")]
    Invalid(String),
    /// The body holds more than the server takes: rows or tensor elements past their limits.
    #[error("{0}")]
    OverLimit(String),
    /// An answer could not be encoded: ours.
    #[error("encoding the answer: {0}")]
    Encode(String),
    /// The engine's answer is one the server does not give (a NaN where it refuses them): ours, said as the
    /// scan after the engine says it.
    #[error("{0}")]
    Answer(String),
}

impl CodecError {
    /// The same error, its message prefixed with `context`.
    pub fn context(self, context: impl fmt::Display) -> Self {
        match self {
            CodecError::Invalid(m) => CodecError::Invalid(format!("{context}: {m}")),
            CodecError::OverLimit(m) => CodecError::OverLimit(format!("{context}: {m}")),
            CodecError::Encode(m) => CodecError::Encode(format!("{context}: {m}")),
            CodecError::Answer(m) => CodecError::Answer(format!("{context}: {m}")),
        }
    }
}

/// What one request may hold, beyond its body's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tensor elements, summed over the request's inputs.
    pub max_elements: usize,
    /// Rows (the batch dimension) in each input.
    pub max_rows: usize,
    /// Nesting of JSON arrays and objects.
    pub max_json_depth: usize,
}

impl Limits {
    /// No limit at all: for tests and tools that decode trusted bodies.
    pub const NONE: Limits = Limits { max_elements: usize::MAX, max_rows: usize::MAX, max_json_depth: usize::MAX };

    fn rows_error(&self, rows: impl fmt::Display) -> CodecError {
        CodecError::OverLimit(format!(
            "the request has {rows} rows; this server takes at most {} per request (--max-rows)",
            self.max_rows
        ))
    }

    fn elements_error(&self, elements: impl fmt::Display) -> CodecError {
        CodecError::OverLimit(format!(
            "the request has {elements} tensor elements; this server takes at most {} per request (--max-elements)",
            self.max_elements
        ))
    }

    /// Refuses, before anything is decoded for it, an input of `rows` rows and `count` elements that is over the
    /// limits, given the elements the request's earlier inputs hold. Returns the request's elements so far.
    fn check_input(&self, rows: usize, count: usize, elements_before: usize) -> Result<usize, CodecError> {
        if rows > self.max_rows {
            return Err(self.rows_error(rows));
        }
        count
            .checked_add(elements_before)
            .filter(|&n| n <= self.max_elements)
            .ok_or_else(|| self.elements_error(format_args!("more than {}", self.max_elements)))
    }
}

/// Refuses JSON that nests arrays and objects deeper than `max`, stopping at the first bracket past it, before
/// anything parses the JSON. Brackets inside strings do not count.
pub fn check_json_depth(json: &[u8], max: usize) -> Result<(), CodecError> {
    DepthScan::new(max).feed(json)
}

/// JSON's nesting followed a piece at a time: [`check_json_depth`] over bytes that arrive in parts.
#[derive(Debug, Clone)]
pub struct DepthScan {
    max: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl DepthScan {
    pub fn new(max: usize) -> DepthScan {
        DepthScan { max, depth: 0, in_string: false, escaped: false }
    }

    /// Follows the JSON's next `bytes`: an error at the first bracket deeper than the maximum.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), CodecError> {
        for &b in bytes {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'[' | b'{' => {
                    self.depth += 1;
                    if self.depth > self.max {
                        return Err(CodecError::Invalid(format!(
                            "the JSON nests deeper than {} levels (--max-json-depth)",
                            self.max
                        )));
                    }
                }
                b']' | b'}' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        Ok(())
    }
}

/// A reader of JSON whose nesting is checked as its bytes pass ([`DepthScan`]): past the maximum, reading fails,
/// and the error is kept in `over`.
pub struct DepthChecked<R> {
    inner: R,
    scan: DepthScan,
    pub over: Option<CodecError>,
}

impl<R: std::io::Read> DepthChecked<R> {
    pub fn new(inner: R, max: usize) -> DepthChecked<R> {
        DepthChecked { inner, scan: DepthScan::new(max), over: None }
    }
}

impl<R: std::io::Read> std::io::Read for DepthChecked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Err(e) = self.scan.feed(&buf[..n]) {
            let message = e.to_string();
            self.over = Some(e);
            return Err(std::io::Error::other(message));
        }
        Ok(n)
    }
}

/// Longest name or shape a message quotes from a client; the rest is cut.
const QUOTE_CHARS: usize = 64;

/// What refusing a NaN or infinity says: `value` at element `index` of `what` (`input`, `output`) `name`.
pub fn non_finite(what: &str, name: &str, index: usize, value: f64) -> String {
    let value = if value.is_nan() { "NaN".to_owned() } else { format!("{value}") };
    format!(
        "{} holds {value} at element {index}: this server takes and gives finite numbers only (--allow-non-finite)",
        Named(what, name)
    )
}

/// A tensor as a message names it, ``input `x` ``: `Named("input", "x")`. Written out only where a message is.
#[derive(Clone, Copy)]
pub struct Named<'a>(pub &'a str, pub &'a str);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.0, quoted(self.1))
    }
}

/// A client's text, for a message: at most [`QUOTE_CHARS`] characters of it, then `…`.
pub fn quoted(text: &str) -> Quoted<'_> {
    Quoted(text)
}

pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(QUOTE_CHARS) {
            None => f.write_str(self.0),
            Some((cut, _)) => write!(f, "{}…", &self.0[..cut]),
        }
    }
}

/// A client's shape, for a message: its first dimensions, then `…` and how many there are.
pub fn shape_text<T: fmt::Debug>(shape: &[T]) -> String {
    const SHOWN: usize = 8;
    if shape.len() <= SHOWN {
        format!("{shape:?}")
    } else {
        let head: Vec<String> = shape[..SHOWN].iter().map(|d| format!("{d:?}")).collect();
        format!("[{}, … ({} dimensions)]", head.join(", "), shape.len())
    }
}

/// A request's inputs in the model's order, each where the client sent it: refused where it left out an input the
/// model requires; `None` where it left out an optional one.
pub fn given_inputs(decoded: Vec<Option<Tensor>>, specs: &[TensorSpec]) -> Result<Vec<Option<Tensor>>, CodecError> {
    match decoded.iter().zip(specs).find(|(t, spec)| t.is_none() && !spec.optional) {
        Some((_, spec)) => Err(CodecError::Invalid(format!("missing input `{}`", spec.name))),
        None => Ok(decoded),
    }
}

/// The names of `specs`, quoted, for messages.
pub fn names(specs: &[TensorSpec]) -> String {
    specs.iter().map(|s| format!("`{}`", s.name)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
