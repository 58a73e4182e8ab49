//! The KServe v2 inference wire format, with Triton's binary tensor extension: a JSON part, optionally followed
//! by binary tensors (their sizes in each input's `binary_data_size`, the JSON part's length in the
//! `Inference-Header-Content-Length` header); answers do the same for the outputs asked for in binary. The types
//! here are the ones served, and the OpenAPI document's schemas are derived from them.

use std::time::Duration;

use bytes::Bytes;
use inferd_core::{element_count, DataType, ModelMetadata, Tensor, TensorData, TensorSpec};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::json::{decode_flat, FlatJson};
use super::shm::{inputs_intact, Regions, Span, SpanParameters};
use super::{check_json_depth, given_inputs, names, quoted, shape_text, CodecError, Limits, Named, Wanted};

/// The header that gives the length of a body's JSON part when binary tensors follow it.
pub const JSON_LENGTH_HEADER: &str = "inference-header-content-length";

/// A v2 inference request (its JSON part, when binary tensors follow).
#[derive(Deserialize, utoipa::ToSchema)]
pub struct V2InferRequest<'a> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub parameters: V2RequestParameters,
    #[serde(borrow)]
    pub inputs: Vec<V2Input<'a>>,
    /// The outputs to answer with; all of them when absent.
    #[serde(default)]
    pub outputs: Option<Vec<V2RequestedOutput>>,
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2RequestParameters {
    /// Every output in binary, unless it says otherwise.
    #[serde(default)]
    pub binary_data_output: bool,
    /// Microseconds the request may wait in the queue.
    pub timeout: Option<u64>,
    /// Accepted and ignored: inferd has no request priorities yet.
    pub priority: Option<u64>,
    /// An embedding model's embeddings cut to their first `dimensions` (a Matryoshka model's shorter ones).
    pub dimensions: Option<u64>,
}

/// One input: `data` (flat or nested, row-major), or `parameters.binary_data_size` bytes after the JSON.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct V2Input<'a> {
    pub name: String,
    pub shape: Vec<i64>,
    pub datatype: String,
    #[serde(default)]
    pub parameters: V2InputParameters,
    #[serde(borrow, default)]
    #[schema(value_type = Option<Vec<Value>>)]
    pub data: Option<&'a RawValue>,
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2InputParameters {
    /// The input's bytes follow the JSON part (after those of the inputs before it).
    pub binary_data_size: Option<u64>,
    /// Triton's shared-memory extension: the input's bytes are in this registered region.
    pub shared_memory_region: Option<String>,
    /// Its bytes in the region.
    pub shared_memory_byte_size: Option<u64>,
    /// Where in the region they start; 0 when absent.
    pub shared_memory_offset: Option<u64>,
}

impl V2InputParameters {
    fn span(&self) -> SpanParameters<'_> {
        SpanParameters {
            region: self.shared_memory_region.as_deref(),
            byte_size: self.shared_memory_byte_size,
            offset: self.shared_memory_offset,
        }
    }
}

/// An output asked for by name.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct V2RequestedOutput {
    pub name: String,
    #[serde(default)]
    pub parameters: V2OutputParameters,
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2OutputParameters {
    /// This output in binary, after the JSON part.
    pub binary_data: Option<bool>,
    /// Triton's classification extension: this output as its best `classification` classes, each a
    /// `"score:index:label"` string (`BYTES`).
    pub classification: Option<u64>,
    /// Triton's shared-memory extension: the output's bytes go to this registered region, not the answer.
    pub shared_memory_region: Option<String>,
    /// The bytes the output may take in the region.
    pub shared_memory_byte_size: Option<u64>,
    /// Where in the region it starts; 0 when absent.
    pub shared_memory_offset: Option<u64>,
}

impl V2OutputParameters {
    fn span(&self) -> SpanParameters<'_> {
        SpanParameters {
            region: self.shared_memory_region.as_deref(),
            byte_size: self.shared_memory_byte_size,
            offset: self.shared_memory_offset,
        }
    }
}

/// A decoded v2 inference request.
#[derive(Debug)]
pub struct V2Call {
    pub id: Option<String>,
    /// In the model's input order; `None` for an optional input left out.
    pub inputs: Vec<Option<Tensor>>,
    /// The spans of shared memory that inputs are read from, in place: checked once the answer is made.
    pub input_memory: Vec<Span>,
    /// The outputs to answer with, in the order asked.
    pub outputs: Vec<Wanted>,
    /// Triton's classification extension: (output index, k) for each output asked as its top k classes.
    pub classification: Vec<(usize, usize)>,
    pub timeout: Option<Duration>,
    /// The `dimensions` parameter: an embedding's first dimensions only.
    pub dimensions: Option<usize>,
}

/// Decodes a v2 inference request body within `limits`; `json_length` is the `Inference-Header-Content-Length`
/// header, if any. Inputs and outputs in shared memory are in `regions`. A fixed-size binary input becomes its tensor
/// as a slice of `body`, without a copy.
pub fn decode_infer(
    body: &Bytes,
    json_length: Option<usize>,
    meta: &ModelMetadata,
    limits: &Limits,
    regions: &dyn Regions,
) -> Result<V2Call, CodecError> {
    let invalid = |m: String| CodecError::Invalid(m);
    let json_len = json_length.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(invalid(format!(
            "Inference-Header-Content-Length is {json_len}, but the body holds only {} bytes",
            body.len()
        )));
    }
    let json = &body[..json_len];
    let mut binary = body.slice(json_len..);
    check_json_depth(json, limits.max_json_depth)?;
    let request: V2InferRequest<'_> =
        serde_json::from_slice(json).map_err(|e| invalid(format!("invalid inference request JSON: {e}")))?;
    // Binary tensors follow the JSON in the order of the JSON's inputs.
    let mut decoded: Vec<Option<Tensor>> = vec![None; meta.inputs.len()];
    let mut elements = 0;
    let mut input_memory = Vec::new();
    for input in &request.inputs {
        let slot = meta.inputs.iter().position(|s| s.name == input.name).ok_or_else(|| {
            invalid(format!("unexpected input `{}`: the model takes {}", quoted(&input.name), names(&meta.inputs)))
        })?;
        if decoded[slot].is_some() {
            return Err(invalid(format!("input `{}` is given twice", input.name)));
        }
        let (tensor, count, span) = decode_input(input, &meta.inputs[slot], &mut binary, limits, elements, regions)?;
        input_memory.extend(span);
        decoded[slot] = Some(tensor);
        elements = count;
    }
    if !binary.is_empty() {
        return Err(invalid(format!("{} bytes of binary data follow the inputs that claim them", binary.len())));
    }
    let inputs = given_inputs(decoded, &meta.inputs)?;
    let default_binary = request.parameters.binary_data_output;
    let mut classification = Vec::new();
    let outputs = match &request.outputs {
        None => (0..meta.outputs.len())
            .map(|index| Wanted { index, binary: default_binary, memory: None, finite: false })
            .collect(),
        Some(asked) => {
            let mut chosen: Vec<Wanted> = Vec::with_capacity(asked.len().min(meta.outputs.len()));
            for o in asked {
                let name = quoted(&o.name);
                let i = meta.outputs.iter().position(|s| s.name == o.name).ok_or_else(|| {
                    invalid(format!("unexpected output `{name}`: the model gives {}", names(&meta.outputs)))
                })?;
                if chosen.iter().any(|w| w.index == i) {
                    return Err(invalid(format!("output `{name}` is asked for twice")));
                }
                match o.parameters.classification {
                    Some(0) => {
                        return Err(invalid(format!("output `{name}`: `classification` must be 1 or more classes")))
                    }
                    Some(k) => classification.push((i, usize::try_from(k).unwrap_or(usize::MAX))),
                    None => {}
                }
                let memory = Span::of(o.parameters.span(), regions, Named("output", &o.name))?;
                let binary = memory.is_none() && o.parameters.binary_data.unwrap_or(default_binary);
                chosen.push(Wanted { index: i, binary, memory, finite: false });
            }
            chosen
        }
    };
    let timeout = request.parameters.timeout.map(Duration::from_micros);
    let dimensions = request.parameters.dimensions.map(|d| usize::try_from(d).unwrap_or(usize::MAX));
    Ok(V2Call { id: request.id, inputs, input_memory, outputs, classification, timeout, dimensions })
}

/// Decodes one input, taking its binary data (if any) from the front of `binary`, or its shared memory from
/// `regions`. Returns the tensor, the request's elements so far (`elements_before` included), and the span of
/// shared memory it is read from.
fn decode_input(
    input: &V2Input<'_>,
    spec: &TensorSpec,
    binary: &mut Bytes,
    limits: &Limits,
    elements_before: usize,
    regions: &dyn Regions,
) -> Result<(Tensor, usize, Option<Span>), CodecError> {
    let name = quoted(&input.name);
    let invalid = |m: String| CodecError::Invalid(format!("input `{name}`: {m}"));
    let InputHead { datatype, shape, count, elements } =
        InputHead::check(&input.name, &input.datatype, &input.shape, spec, limits, elements_before)?;
    if let Some(span) = Span::of(input.parameters.span(), regions, Named("input", &input.name))? {
        if input.parameters.binary_data_size.is_some() || input.data.is_some() {
            return Err(invalid("it is in shared memory, and has `data` or binary_data_size too".into()));
        }
        if datatype != spec.datatype {
            return Err(invalid(format!("the model takes {}, got {datatype}", spec.datatype)));
        }
        let bytes = span.read_input(datatype).map_err(invalid)?;
        let tensor = decode_owned(datatype, shape, count, bytes, "its shared_memory_byte_size is").map_err(invalid)?;
        return Ok((tensor, elements, Some(span)));
    }
    let tensor = match (input.parameters.binary_data_size, input.data) {
        (Some(size), None) => {
            if datatype != spec.datatype {
                return Err(invalid(format!("the model takes {}, got {datatype}", spec.datatype)));
            }
            let size = usize::try_from(size).map_err(|_| invalid("binary_data_size is too large".into()))?;
            if size > binary.len() {
                return Err(invalid(format!(
                    "binary_data_size is {size}, but only {} bytes of binary data are left",
                    binary.len()
                )));
            }
            decode_owned(datatype, shape, count, binary.split_to(size), "binary_data_size is").map_err(invalid)?
        }
        (None, Some(data)) => {
            let convertible = datatype.is_float() && spec.datatype.is_float();
            if datatype != spec.datatype && !convertible {
                return Err(invalid(format!("the model takes {}, got {datatype}", spec.datatype)));
            }
            decode_flat(data.get(), spec, shape)?
        }
        (Some(_), Some(_)) => {
            return Err(CodecError::Invalid(format!("input `{name}` has both `data` and binary_data_size")))
        }
        (None, None) => {
            return Err(CodecError::Invalid(format!("input `{name}` has neither `data` nor binary_data_size")))
        }
    };
    Ok((tensor, elements, None))
}

/// What an input's header says, checked against the model's input and the request's limits before any of its data
/// is decoded: the gRPC codec's inputs say the same.
pub(crate) struct InputHead {
    pub datatype: DataType,
    pub shape: Vec<usize>,
    /// Its elements.
    pub count: usize,
    /// The request's elements so far, this input's included.
    pub elements: usize,
}

impl InputHead {
    pub(crate) fn check(
        name: &str,
        datatype: &str,
        shape: &[i64],
        spec: &TensorSpec,
        limits: &Limits,
        elements_before: usize,
    ) -> Result<InputHead, CodecError> {
        let name = quoted(name);
        let invalid = |m: String| CodecError::Invalid(format!("input `{name}`: {m}"));
        let datatype: DataType = datatype.parse().map_err(|e| invalid(format!("{e}")))?;
        let negative = || invalid(format!("shape {} has a negative dimension", shape_text(shape)));
        let shape = shape.iter().map(|&d| usize::try_from(d).map_err(|_| negative())).collect::<Result<Vec<_>, _>>()?;
        if !spec.accepts(&shape) {
            return Err(invalid(format!("shape {} does not fit the model's {:?}", shape_text(&shape), spec.shape)));
        }
        let count = element_count(&shape).map_err(|e| invalid(format!("{e}")))?;
        let elements = limits
            .check_input(shape.first().copied().unwrap_or(1), count, elements_before)
            .map_err(|e| e.context(format_args!("input `{name}`")))?;
        Ok(InputHead { datatype, shape, count, elements })
    }
}

/// A tensor from its binary form (little-endian elements, or for BYTES a 4-byte length before each element), owned:
/// fixed-size elements become the tensor without a copy where they are
/// aligned for their type. Elements at an odd offset of a body or message are copied here, once, into memory that
/// is, as the decode's own work: an engine would otherwise copy them on its thread, in every run (ONNX Runtime
/// reads only aligned elements in place). `given` says where the bytes came from, for a message
/// (`binary_data_size is`).
pub(crate) fn decode_owned(
    datatype: DataType,
    shape: Vec<usize>,
    count: usize,
    bytes: Bytes,
    given: &str,
) -> Result<Tensor, String> {
    let Some(size) = datatype.size() else { return decode_binary_strings(shape, count, &bytes) };
    // The shape is written out only for an error: on every request it cost more than the checks.
    let expected = count.checked_mul(size).ok_or_else(|| format!("shape {} is too large", shape_text(&shape)))?;
    if bytes.len() != expected {
        let shown = shape_text(&shape);
        return Err(format!("{given} {} bytes, but {datatype} {shown} needs {expected} bytes", bytes.len()));
    }
    let bytes = if bytes.as_ptr().align_offset(size) == 0 { bytes } else { Bytes::copy_from_slice(&bytes) };
    Tensor::new(datatype, shape, bytes).map_err(|e| e.to_string())
}

/// A BYTES tensor from its binary form.
pub(crate) fn decode_binary_strings(shape: Vec<usize>, count: usize, bytes: &[u8]) -> Result<Tensor, String> {
    let mut elements = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 4 {
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        if len > rest.len() {
            return Err(format!("a BYTES element of {len} bytes runs past its binary data"));
        }
        elements.push(rest[..len].to_vec());
        rest = &rest[len..];
        if elements.len() > count {
            break;
        }
    }
    if !rest.is_empty() || elements.len() != count {
        return Err(format!(
            "the binary data holds {} BYTES elements{}, but shape {} needs {count}",
            elements.len(),
            if rest.is_empty() { "" } else { " and a partial one" },
            shape_text(&shape)
        ));
    }
    Tensor::from_byte_strings(shape, elements).map_err(|e| e.to_string())
}

/// A v2 inference answer (its JSON part, when binary outputs follow).
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2InferResponse<'a> {
    pub model_name: &'a str,
    pub model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    pub outputs: Vec<V2Output<'a>>,
}

/// One output: `data`, or `parameters.binary_data_size` bytes after the JSON part.
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2Output<'a> {
    pub name: &'a str,
    #[schema(value_type = String)]
    pub datatype: DataType,
    pub shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Value>>)]
    pub data: Option<FlatJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<V2BinaryOutput>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct V2BinaryOutput {
    /// Bytes of this output after the JSON part (after those of the outputs before it).
    pub binary_data_size: usize,
}

/// Writes the output `t`, named `name`, in its binary form to `span`; scanning it for NaN and infinity as it goes
/// where `finite` (see [`Wanted::finite`]).
pub(crate) fn write_to(span: &Span, t: &Tensor, name: &str, finite: bool) -> Result<(), CodecError> {
    let written = match t.raw_bytes() {
        Some(bytes) if finite => {
            match span.fits(bytes.len()).and_then(|()| t.write_finite(|offset, block| span.write_at(offset, block))) {
                // The engine's output: the server's fault, as when it is scanned after the engine.
                Ok(Some((index, value))) => {
                    return Err(CodecError::Answer(crate::non_finite("output", name, index, value)))
                }
                written => written.and_then(|_| span.intact()),
            }
        }
        Some(bytes) => span.write(bytes),
        None => span.write(&binary_bytes(t)),
    };
    // The client asked for a span too small: its error, found once the answer's size is known.
    written.map_err(|m| CodecError::Invalid(format!("output `{}`: {m}", quoted(name))))
}

/// The binary form of a tensor (see [`decode_owned`]).
pub(crate) fn binary_form(t: &Tensor, out: &mut Vec<u8>) {
    match (t.raw_bytes(), t.byte_strings()) {
        (Some(bytes), _) => out.extend_from_slice(bytes),
        (None, Some(strings)) => {
            for s in strings {
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s);
            }
        }
        (None, None) => {}
    }
}

/// [`binary_form`] as shared bytes: a fixed-size tensor's own, without a copy; a `BYTES` tensor's written out.
pub(crate) fn binary_bytes(t: &Tensor) -> Bytes {
    match t.data() {
        TensorData::Fixed(bytes) => bytes.clone(),
        TensorData::Bytes(_) => {
            let mut out = Vec::with_capacity(binary_size(t));
            binary_form(t, &mut out);
            out.into()
        }
    }
}

/// The length of [`binary_form`]'s bytes.
pub(crate) fn binary_size(t: &Tensor) -> usize {
    match (t.raw_bytes(), t.byte_strings()) {
        (Some(bytes), _) => bytes.len(),
        (None, Some(strings)) => strings.iter().map(|s| 4 + s.len()).sum(),
        (None, None) => 0,
    }
}

/// Encodes an answer: the JSON part, then the binary outputs in the JSON's order; outputs asked in shared memory
/// are written there. Returns the body and, when binary outputs follow, the JSON part's length.
pub fn encode_infer(
    model: &str,
    version: u64,
    id: Option<&str>,
    meta: &ModelMetadata,
    outputs: &[Tensor],
    selection: &[Wanted],
    input_memory: &[Span],
) -> Result<(Vec<u8>, Option<usize>), CodecError> {
    // The binary parts are sized first and copied once, straight after the JSON part.
    let mut binary = Vec::new();
    let mut json_outputs = Vec::with_capacity(selection.len());
    for wanted in selection {
        let (t, spec) = wanted.of(outputs, meta)?;
        // An output in shared memory is named, typed and shaped, with no `parameters`, as Triton answers it:
        // Triton's C++ client reads `binary_data_size` from any output that has them.
        let parameters = if let Some(span) = &wanted.memory {
            write_to(span, t, &spec.name, wanted.finite)?;
            None
        } else {
            wanted.binary.then(|| {
                binary.push(t);
                V2BinaryOutput { binary_data_size: binary_size(t) }
            })
        };
        let in_data = !wanted.binary && wanted.memory.is_none();
        json_outputs.push(V2Output {
            name: &spec.name,
            datatype: t.dtype(),
            shape: t.shape(),
            data: in_data.then_some(FlatJson(t)),
            parameters,
        });
    }
    inputs_intact(input_memory)?;
    let response = V2InferResponse { model_name: model, model_version: version.to_string(), id, outputs: json_outputs };
    let mut body = serde_json::to_vec(&response).map_err(|e| CodecError::Encode(e.to_string()))?;
    let json_len = body.len();
    let has_binary = selection.iter().any(|w| w.binary);
    body.reserve_exact(binary.iter().map(|t| binary_size(t)).sum());
    binary.into_iter().for_each(|t| binary_form(t, &mut body));
    Ok((body, has_binary.then_some(json_len)))
}

pub mod models;

#[cfg(test)]
pub(crate) mod tests;
