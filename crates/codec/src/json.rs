//! JSON tensors: nested arrays (whose nesting is the shape) and KServe v2's flat `data` arrays decoded into
//! typed bytes as they stream by, and tensors written back in either form.

use std::fmt;

use inferd_core::{Tensor, TensorSpec};
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeSeq, Serializer};

use super::elements::{ElementJson, ElementSeed, Elements};
use super::{quoted, shape_text, CodecError, Limits};

/// A request's rows and tensor elements as its inputs decode, against the server's limits. Rows are checked as
/// each row closes; elements when the tensor closes, or at once past twice the limit. So the decoder stops
/// within one row of the row limit and twice the element limit, and a request over both is told of its rows.
pub(crate) struct Tally {
    pub limits: Limits,
    /// Elements of the inputs decoded before this one.
    pub used: usize,
    /// The limit the request went over: serde's errors carry only text, so the kind waits here.
    pub over: Option<CodecError>,
}

impl Tally {
    pub fn new(limits: Limits) -> Self {
        Tally { limits, used: 0, over: None }
    }

    /// Records going over a limit, and gives serde's error for it.
    fn refuse<E: de::Error>(&mut self, error: CodecError) -> E {
        let e = E::custom(&error);
        self.over = Some(error);
        e
    }
}

/// Decodes one nested array into a tensor of `spec`'s type, checking each dimension as it closes.
pub(crate) struct TensorSeed<'a, 'b> {
    pub spec: &'a TensorSpec,
    pub tally: &'b mut Tally,
}

/// What a tensor's nested arrays have filled in so far.
struct NestedTensor<'a, 'b> {
    spec: &'a TensorSpec,
    /// Each dimension's length, known once its first array closes.
    dims: Vec<Option<usize>>,
    elements: Elements<'a>,
    tally: &'b mut Tally,
    /// Elements this tensor may hold before the rest of the request has none left.
    allowed: usize,
}

impl<'de> DeserializeSeed<'de> for TensorSeed<'_, '_> {
    type Value = Tensor;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Tensor, D::Error> {
        let spec = self.spec;
        if spec.shape.is_empty() {
            // A scalar input (a model without a batch dimension may take one): one element, no array.
            let mut elements = Elements::new(spec, 1);
            ElementSeed { elements: &mut elements, nested: false }.deserialize(deserializer)?;
            self.tally.used += elements.count;
            return elements.into_tensor(Vec::new()).map_err(de::Error::custom);
        }
        let allowed = self.tally.limits.max_elements.saturating_sub(self.tally.used);
        let mut tensor = NestedTensor {
            spec,
            dims: vec![None; spec.shape.len()],
            elements: Elements::new(spec, usize::MAX),
            tally: self.tally,
            allowed,
        };
        LevelSeed { depth: 0, tensor: &mut tensor }.deserialize(deserializer)?;
        tensor.tally.used += tensor.elements.count;
        // Every level closed at least once (empty levels were refused), so every dimension is known.
        let shape: Vec<usize> = tensor.dims.iter().map(|d| d.unwrap_or(0)).collect();
        tensor.elements.into_tensor(shape).map_err(de::Error::custom)
    }
}

struct LevelSeed<'t, 'a, 'b> {
    depth: usize,
    tensor: &'t mut NestedTensor<'a, 'b>,
}

impl<'de> DeserializeSeed<'de> for LevelSeed<'_, '_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for LevelSeed<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = self.tensor.spec;
        write!(
            f,
            "input `{}` as a nested array of {} dimensions ({} {:?})",
            quoted(&spec.name),
            spec.shape.len(),
            spec.datatype,
            spec.shape
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Self { depth, tensor } = self;
        let spec = tensor.spec;
        let limits = tensor.tally.limits;
        let fixed = usize::try_from(spec.shape[depth]).ok();
        // A dimension's length is fixed by the spec, or by the first array seen at this depth.
        let limit = fixed.or(tensor.dims[depth]);
        let innermost = depth + 1 == spec.shape.len();
        let mut n = 0usize;
        loop {
            let more = if innermost {
                seq.next_element_seed(ElementSeed { elements: &mut tensor.elements, nested: false })?
            } else {
                seq.next_element_seed(LevelSeed { depth: depth + 1, tensor: &mut *tensor })?
            };
            if more.is_none() {
                break;
            }
            n += 1;
            if limit.is_some_and(|l| n > l) {
                return Err(de::Error::custom(dimension_error(spec, depth, limit, fixed)));
            }
            if innermost && tensor.elements.count > tensor.allowed.saturating_mul(2) {
                let error = limits.elements_error(format_args!("more than {}", limits.max_elements));
                return Err(tensor.tally.refuse(error));
            }
            if depth == 0 && n > limits.max_rows {
                return Err(tensor.tally.refuse(limits.rows_error(format_args!("more than {}", limits.max_rows))));
            }
        }
        if n == 0 {
            return Err(de::Error::custom(if depth == 0 {
                format!("input `{}` has no rows", quoted(&spec.name))
            } else {
                format!("input `{}`: dimension {depth} is empty", quoted(&spec.name))
            }));
        }
        if depth == 0 && tensor.elements.count > tensor.allowed {
            let error = limits.elements_error(tensor.tally.used.saturating_add(tensor.elements.count));
            return Err(tensor.tally.refuse(error));
        }
        match limit {
            Some(l) if l != n => Err(de::Error::custom(dimension_error(spec, depth, limit, fixed))),
            _ => {
                tensor.dims[depth] = Some(n);
                Ok(())
            }
        }
    }
}

fn dimension_error(spec: &TensorSpec, depth: usize, limit: Option<usize>, fixed: Option<usize>) -> String {
    let name = quoted(&spec.name);
    match (fixed, limit) {
        (Some(f), _) => format!("input `{name}`: dimension {depth} must have {f} elements (shape {:?})", spec.shape),
        _ => format!(
            "input `{name}`: arrays at dimension {depth} differ in length (ragged); every row needs {} elements",
            limit.unwrap_or(0)
        ),
    }
}

/// Decodes a KServe v2 `data` field, flat or nested (read in row-major order), into a tensor of `spec`'s type
/// and the request's `shape`. The elements must be exactly as many as the shape holds; more are refused as they
/// arrive, so nothing is allocated beyond what the body carries.
pub fn decode_flat(data: &str, spec: &TensorSpec, shape: Vec<usize>) -> Result<Tensor, CodecError> {
    let name = quoted(&spec.name);
    let expected =
        inferd_core::element_count(&shape).map_err(|e| CodecError::Invalid(format!("input `{name}`: {e}")))?;
    let mut elements = Elements::new(spec, expected);
    let mut de = serde_json::Deserializer::from_str(data);
    ElementSeed { elements: &mut elements, nested: true }
        .deserialize(&mut de)
        .map_err(|e| CodecError::Invalid(e.to_string()))?;
    if elements.count != expected {
        return Err(CodecError::Invalid(format!(
            "input `{name}`: `data` holds {} elements, but shape {} needs {expected}",
            elements.count,
            shape_text(&shape)
        )));
    }
    elements.into_tensor(shape)
}

/// Serializes a tensor as nested JSON arrays (FP16/BF16 as numbers, BYTES as strings).
pub struct NestedJson<'a>(pub &'a Tensor);

impl Serialize for NestedJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.shape().is_empty() {
            return ElementJson { tensor: self.0, index: 0 }.serialize(serializer);
        }
        Level { tensor: self.0, depth: 0, offset: 0 }.serialize(serializer)
    }
}

/// Serializes a tensor's elements as one flat JSON array, as KServe v2 answers.
pub struct FlatJson<'a>(pub &'a Tensor);

impl Serialize for FlatJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let n = self.0.element_count();
        let mut seq = serializer.serialize_seq(Some(n))?;
        for index in 0..n {
            seq.serialize_element(&ElementJson { tensor: self.0, index })?;
        }
        seq.end()
    }
}

/// One level of a nested array: the elements (or deeper levels) under one index of the levels above.
struct Level<'a> {
    tensor: &'a Tensor,
    depth: usize,
    /// The index of this level's first element.
    offset: usize,
}

impl Serialize for Level<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let shape = self.tensor.shape();
        let len = shape[self.depth];
        let stride: usize = shape[self.depth + 1..].iter().product();
        let mut seq = serializer.serialize_seq(Some(len))?;
        for i in 0..len {
            let offset = self.offset + i * stride;
            if self.depth + 1 == shape.len() {
                seq.serialize_element(&ElementJson { tensor: self.tensor, index: offset })?;
            } else {
                seq.serialize_element(&Level { tensor: self.tensor, depth: self.depth + 1, offset })?;
            }
        }
        seq.end()
    }
}
