//! The KServe v2 inference messages over gRPC (`proto/inference.proto`, wire-compatible with Triton's): a
//! `ModelInferRequest` decoded into the model's input tensors within the server's limits, and the answer's tensors
//! encoded back, one `raw_output_contents` entry per output (what Triton's clients read). Inputs may come as
//! `raw_input_contents` (what Triton's clients send) or typed `contents`; FP16 and BF16 have no typed field, so
//! they come raw only.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use inferd_core::{DataType, ModelMetadata, Tensor, TensorSpec};

use super::shm::{
    inputs_intact, Regions, Span, SpanParameters, BYTE_SIZE_PARAMETER, OFFSET_PARAMETER, REGION_PARAMETER,
};
use super::v2::{binary_bytes, decode_owned, write_to, InputHead};
use super::{given_inputs, names, quoted, CodecError, Limits, Named, Wanted};

/// The messages and the service's types, generated from `proto/inference.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

use proto::infer_parameter::ParameterChoice;
use proto::model_infer_request::InferInputTensor;
use proto::model_infer_response::InferOutputTensor;
use proto::{InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse};

/// The request parameter that gives, in microseconds, how long the request may wait in the queue.
pub const TIMEOUT_PARAMETER: &str = "timeout";
/// The request parameter that cuts an embedding model's embeddings to their first dimensions.
pub const DIMENSIONS_PARAMETER: &str = "dimensions";

/// The output parameter of Triton's classification extension: answer the output as its best k classes.
pub const CLASSIFICATION_PARAMETER: &str = "classification";

/// A decoded gRPC inference request.
#[derive(Debug)]
pub struct GrpcCall {
    pub id: String,
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

/// Decodes `request` for the model `meta` describes, within `limits`, with inputs and outputs in shared memory in
/// `regions`. Takes the request by value so that raw input bytes become tensors without a copy. Parameters other
/// than the timeout and `dimensions` (Triton's `priority`, `binary_data_output`,
/// `triton_enable_empty_final_response`, ...) are accepted and ignored, as over HTTP.
pub fn decode_infer(
    request: ModelInferRequest,
    meta: &ModelMetadata,
    limits: &Limits,
    regions: &dyn Regions,
) -> Result<GrpcCall, CodecError> {
    let invalid = |m: String| CodecError::Invalid(m);
    let ModelInferRequest { id, parameters, inputs, outputs, raw_input_contents, .. } = request;
    // An input in shared memory has no raw contents: the others have one each, in order.
    let sent = inputs.iter().filter(|i| !i.parameters.contains_key(REGION_PARAMETER)).count();
    if !raw_input_contents.is_empty() && raw_input_contents.len() != sent {
        return Err(invalid(format!(
            "the request has {sent} inputs outside shared memory but {} raw_input_contents: give one per such input, \
             in the same order",
            raw_input_contents.len()
        )));
    }
    let mut raw_contents = raw_input_contents.into_iter();
    let mut decoded: Vec<Option<Tensor>> = vec![None; meta.inputs.len()];
    let mut elements = 0;
    let mut input_memory = Vec::new();
    for input in inputs {
        let slot = meta.inputs.iter().position(|s| s.name == input.name).ok_or_else(|| {
            invalid(format!("unexpected input `{}`: the model takes {}", quoted(&input.name), names(&meta.inputs)))
        })?;
        if decoded[slot].is_some() {
            return Err(invalid(format!("input `{}` is given twice", quoted(&input.name))));
        }
        let what = Named("input", &input.name);
        let span = Span::of(span_parameters(&input.parameters, what)?, regions, what)?;
        let raw = if span.is_some() { None } else { raw_contents.next() };
        let (tensor, count) = decode_input(input, raw, span.as_ref(), &meta.inputs[slot], limits, elements)?;
        input_memory.extend(span);
        decoded[slot] = Some(tensor);
        elements = count;
    }
    let inputs = given_inputs(decoded, &meta.inputs)?;
    let mut chosen: Vec<Wanted> = Vec::with_capacity(outputs.len().min(meta.outputs.len()));
    let mut classification = Vec::new();
    for o in &outputs {
        let name = quoted(&o.name);
        let i =
            meta.outputs.iter().position(|s| s.name == o.name).ok_or_else(|| {
                invalid(format!("unexpected output `{name}`: the model gives {}", names(&meta.outputs)))
            })?;
        if chosen.iter().any(|w| w.index == i) {
            return Err(invalid(format!("output `{name}` is asked for twice")));
        }
        if let Some(k) = o.parameters.get(CLASSIFICATION_PARAMETER) {
            let k = match k.parameter_choice {
                Some(ParameterChoice::Int64Param(k)) if k > 0 => k as usize,
                Some(ParameterChoice::Uint64Param(k)) if k > 0 => k as usize,
                _ => {
                    return Err(invalid(format!(
                        "output `{name}`: `classification` must be a count of classes, 1 or more"
                    )))
                }
            };
            classification.push((i, k));
        }
        let what = Named("output", &o.name);
        let memory = Span::of(span_parameters(&o.parameters, what)?, regions, what)?;
        chosen.push(Wanted { index: i, binary: true, memory, finite: false });
    }
    if outputs.is_empty() {
        chosen =
            (0..meta.outputs.len()).map(|index| Wanted { index, binary: true, memory: None, finite: false }).collect();
    }
    let timeout = parameters.get(TIMEOUT_PARAMETER).map(microseconds).transpose()?.map(Duration::from_micros);
    let dimensions = match parameters.get(DIMENSIONS_PARAMETER).map(|p| &p.parameter_choice) {
        None => None,
        Some(Some(ParameterChoice::Int64Param(v))) if *v >= 0 => Some(usize::try_from(*v).unwrap_or(usize::MAX)),
        Some(Some(ParameterChoice::Uint64Param(v))) => Some(usize::try_from(*v).unwrap_or(usize::MAX)),
        Some(_) => {
            return Err(CodecError::Invalid(format!(
                "parameter `{DIMENSIONS_PARAMETER}` must be a non-negative integer (the embedding's length)"
            )))
        }
    };
    Ok(GrpcCall { id, inputs, input_memory, outputs: chosen, classification, timeout, dimensions })
}

/// A tensor's shared-memory parameters, of the types Triton's clients send (a string, and integers).
fn span_parameters<'a>(
    parameters: &'a HashMap<String, InferParameter>,
    what: Named<'_>,
) -> Result<SpanParameters<'a>, CodecError> {
    let count = |key: &str| match parameters.get(key).map(|p| &p.parameter_choice) {
        None => Ok(None),
        Some(Some(ParameterChoice::Int64Param(v))) if *v >= 0 => Ok(Some(*v as u64)),
        Some(Some(ParameterChoice::Uint64Param(v))) => Ok(Some(*v)),
        Some(_) => {
            Err(CodecError::Invalid(format!("{what}: parameter `{key}` must be a non-negative integer (bytes)")))
        }
    };
    let region = match parameters.get(REGION_PARAMETER).map(|p| &p.parameter_choice) {
        None => None,
        Some(Some(ParameterChoice::StringParam(name))) => Some(name.as_str()),
        Some(_) => {
            return Err(CodecError::Invalid(format!(
                "{what}: parameter `{REGION_PARAMETER}` must be a string, the region's name"
            )))
        }
    };
    Ok(SpanParameters { region, byte_size: count(BYTE_SIZE_PARAMETER)?, offset: count(OFFSET_PARAMETER)? })
}

/// A parameter that holds a count of microseconds.
fn microseconds(parameter: &InferParameter) -> Result<u64, CodecError> {
    match parameter.parameter_choice {
        Some(ParameterChoice::Int64Param(v)) if v >= 0 => Ok(v as u64),
        Some(ParameterChoice::Uint64Param(v)) => Ok(v),
        _ => Err(CodecError::Invalid(format!(
            "parameter `{TIMEOUT_PARAMETER}` must be a non-negative integer (microseconds)"
        ))),
    }
}

/// Decodes one input from its span of shared memory, its raw bytes, or else its typed contents. Returns the tensor
/// and the request's elements so far, `elements_before` included.
fn decode_input(
    input: InferInputTensor,
    raw: Option<Bytes>,
    span: Option<&Span>,
    spec: &TensorSpec,
    limits: &Limits,
    elements_before: usize,
) -> Result<(Tensor, usize), CodecError> {
    let name = quoted(&input.name);
    let invalid = |m: String| CodecError::Invalid(format!("input `{name}`: {m}"));
    let InputHead { datatype, shape, count, elements } =
        InputHead::check(&input.name, &input.datatype, &input.shape, spec, limits, elements_before)?;
    if datatype != spec.datatype {
        return Err(invalid(format!("the model takes {}, got {datatype}", spec.datatype)));
    }
    if let Some(span) = span {
        if input.contents.is_some() {
            return Err(invalid("it is in shared memory, and has typed contents too".into()));
        }
        let bytes = span.read_input(datatype).map_err(invalid)?;
        let tensor = decode_owned(datatype, shape, count, bytes, "its shared_memory_byte_size is").map_err(invalid)?;
        return Ok((tensor, elements));
    }
    let tensor = match (raw, input.contents) {
        (Some(bytes), None) => decode_owned(datatype, shape, count, bytes, "its raw contents are"),
        (None, Some(contents)) => decode_contents(datatype, shape, count, contents),
        (Some(_), Some(_)) => Err("it has typed contents, and the request raw_input_contents too".to_owned()),
        (None, None) => Err("it has no contents, and the request no raw_input_contents".to_owned()),
    }
    .map_err(invalid)?;
    Ok((tensor, elements))
}

/// A tensor from the typed field of its data type.
fn decode_contents(
    datatype: DataType,
    shape: Vec<usize>,
    count: usize,
    contents: InferTensorContents,
) -> Result<Tensor, String> {
    let c = contents;
    let bytes = match datatype {
        DataType::Bytes => {
            check_count("bytes_contents", c.bytes_contents.len(), count)?;
            return Tensor::from_byte_strings(shape, c.bytes_contents).map_err(|e| e.to_string());
        }
        DataType::Bool => little_endian("bool_contents", &c.bool_contents, count, |&b| Some([u8::from(b)]))?,
        DataType::Int8 => {
            little_endian("int_contents", &c.int_contents, count, |&v| i8::try_from(v).ok().map(i8::to_le_bytes))?
        }
        DataType::Int16 => {
            little_endian("int_contents", &c.int_contents, count, |&v| i16::try_from(v).ok().map(i16::to_le_bytes))?
        }
        DataType::Int32 => little_endian("int_contents", &c.int_contents, count, |v| Some(v.to_le_bytes()))?,
        DataType::Int64 => little_endian("int64_contents", &c.int64_contents, count, |v| Some(v.to_le_bytes()))?,
        DataType::Uint8 => {
            little_endian("uint_contents", &c.uint_contents, count, |&v| u8::try_from(v).ok().map(u8::to_le_bytes))?
        }
        DataType::Uint16 => {
            little_endian("uint_contents", &c.uint_contents, count, |&v| u16::try_from(v).ok().map(u16::to_le_bytes))?
        }
        DataType::Uint32 => little_endian("uint_contents", &c.uint_contents, count, |v| Some(v.to_le_bytes()))?,
        DataType::Uint64 => little_endian("uint64_contents", &c.uint64_contents, count, |v| Some(v.to_le_bytes()))?,
        DataType::Fp32 => little_endian("fp32_contents", &c.fp32_contents, count, |v| Some(v.to_le_bytes()))?,
        DataType::Fp64 => little_endian("fp64_contents", &c.fp64_contents, count, |v| Some(v.to_le_bytes()))?,
        DataType::Fp16 | DataType::Bf16 => {
            return Err(format!("{datatype} has no typed contents field: send it in raw_input_contents"))
        }
    };
    Tensor::new(datatype, shape, bytes).map_err(|e| e.to_string())
}

fn check_count(field: &str, given: usize, count: usize) -> Result<(), String> {
    if given == count {
        Ok(())
    } else {
        Err(format!("{field} holds {given} elements, but its shape needs {count}"))
    }
}

/// The little-endian bytes of `values`, each converted by `convert` (`None`: out of the data type's range).
fn little_endian<T, const N: usize>(
    field: &str,
    values: &[T],
    count: usize,
    convert: impl Fn(&T) -> Option<[u8; N]>,
) -> Result<Vec<u8>, String> {
    check_count(field, values.len(), count)?;
    let mut bytes = Vec::with_capacity(count * N);
    for (i, v) in values.iter().enumerate() {
        let le = convert(v).ok_or_else(|| format!("{field} element {i} is out of its data type's range"))?;
        bytes.extend_from_slice(&le);
    }
    Ok(bytes)
}

/// Encodes an answer: each selected output's name, data type and shape, and its bytes in `raw_output_contents`,
/// or, asked in shared memory, written there (its `raw_output_contents` entry empty, so that the others keep
/// their places; no parameters, as over HTTP).
pub fn encode_infer(
    model: &str,
    version: u64,
    id: String,
    meta: &ModelMetadata,
    outputs: &[Tensor],
    selection: &[Wanted],
    input_memory: &[Span],
) -> Result<ModelInferResponse, CodecError> {
    let mut response = ModelInferResponse {
        model_name: model.to_owned(),
        model_version: version.to_string(),
        id,
        outputs: Vec::with_capacity(selection.len()),
        raw_output_contents: Vec::with_capacity(selection.len()),
        ..ModelInferResponse::default()
    };
    for wanted in selection {
        let (t, spec) = wanted.of(outputs, meta)?;
        // A fixed-size output's entry shares the tensor's bytes: encoding the message is their one copy.
        let bytes = match &wanted.memory {
            Some(span) => {
                write_to(span, t, &spec.name, wanted.finite)?;
                Bytes::new()
            }
            None => binary_bytes(t),
        };
        response.outputs.push(InferOutputTensor {
            name: spec.name.clone(),
            datatype: t.dtype().as_str().to_owned(),
            shape: t.shape().iter().map(|&d| d as i64).collect(),
            ..InferOutputTensor::default()
        });
        response.raw_output_contents.push(bytes);
    }
    inputs_intact(input_memory)?;
    Ok(response)
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;
