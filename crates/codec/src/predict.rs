//! The `/predict` wire format: `{"input": [...]}` or `{"inputs": {"name": [...], ...}}` in, nested arrays out.
//! The types here are the ones served, and the OpenAPI document's schemas are derived from them.

use std::fmt;

use inferd_core::{Tensor, TensorSpec};
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::json::{NestedJson, Tally, TensorSeed};
use super::{check_json_depth, names, quoted, CodecError, DepthChecked, Limits};

/// A `/predict` body: one input as `input`, or several by name in `inputs`. Tensors are nested arrays, one
/// array per row. The body decodes into this in one pass, each tensor straight into typed bytes
/// ([`decode_predict`]).
#[derive(Debug, Default, utoipa::ToSchema)]
#[schema(example = json!({"input": [[0.0, 0.5, 1.0]]}))]
pub struct PredictRequest {
    /// The model's only input, as nested arrays (rows first).
    #[schema(value_type = Option<Vec<Value>>)]
    pub input: Option<Tensor>,
    /// Several inputs by name.
    #[schema(value_type = Option<std::collections::HashMap<String, Vec<Value>>>)]
    pub inputs: Option<NamedTensors>,
}

/// Inputs given by name, decoded: (the input's position among the model's inputs, its tensor).
#[derive(Debug, Default)]
pub struct NamedTensors(pub Vec<(usize, Tensor)>);

/// Decodes a `/predict` body into one tensor per spec, in the specs' order (`None` for an optional input left out),
/// within `limits`: rows and elements past the limits stop the decoding where they are met.
pub fn decode_predict(body: &[u8], specs: &[TensorSpec], limits: &Limits) -> Result<Vec<Option<Tensor>>, CodecError> {
    match super::plain::decode(body, specs, limits) {
        Some(only) => crate::given_inputs(vec![Some(only)], specs),
        None => decode_serde(body, specs, limits),
    }
}

/// [`decode_predict`] through serde, for every body: what the plain form's scanner does not read.
pub(crate) fn decode_serde(
    body: &[u8],
    specs: &[TensorSpec],
    limits: &Limits,
) -> Result<Vec<Option<Tensor>>, CodecError> {
    check_json_depth(body, limits.max_json_depth)?;
    decode_with(&mut serde_json::Deserializer::from_slice(body), specs, limits)
}

/// [`decode_predict`] of a body read as it arrives (a compressed one, inflating): the limits, the nesting depth's
/// among them, stop the reading where they are met, so that a body past them is never held whole.
pub fn decode_predict_from(
    body: impl std::io::Read,
    specs: &[TensorSpec],
    limits: &Limits,
) -> Result<Vec<Option<Tensor>>, CodecError> {
    // serde_json reads a reader a byte at a time: from a buffer, which the depth check fills a block at a time.
    let mut checked = std::io::BufReader::new(DepthChecked::new(body, limits.max_json_depth));
    let decoded = decode_with(&mut serde_json::Deserializer::from_reader(&mut checked), specs, limits);
    match checked.get_mut().over.take() {
        Some(too_deep) => Err(too_deep),
        None => decoded,
    }
}

fn decode_with<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
    specs: &[TensorSpec],
    limits: &Limits,
) -> Result<Vec<Option<Tensor>>, CodecError> {
    let mut tally = Tally::new(*limits);
    let decoded = PredictBody { specs, tally: &mut tally }.deserialize(&mut *de).and_then(|r| de.end().map(|()| r));
    let request = decoded.map_err(|e| tally.over.take().unwrap_or_else(|| CodecError::Invalid(e.to_string())))?;
    let mut slots: Vec<Option<Tensor>> = vec![None; specs.len()];
    if let Some(t) = request.input {
        slots[0] = Some(t);
    }
    for (i, t) in request.inputs.map(|n| n.0).unwrap_or_default() {
        if slots[i].replace(t).is_some() {
            return Err(CodecError::Invalid(format!("input `{}` is given twice", specs[i].name)));
        }
    }
    crate::given_inputs(slots, specs)
}

/// Decodes a body into a [`PredictRequest`] for a model of `specs`.
struct PredictBody<'a, 'b> {
    specs: &'a [TensorSpec],
    tally: &'b mut Tally,
}

impl<'de> DeserializeSeed<'de> for PredictBody<'_, '_> {
    type Value = PredictRequest;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PredictBody<'_, '_> {
    type Value = PredictRequest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with `input` (an array) or `inputs` (an object of named arrays)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let specs = self.specs;
        let mut request = PredictRequest::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "input" => {
                    if specs.len() != 1 {
                        return Err(de::Error::custom(format!(
                            "this model takes {} inputs ({}): send them by name in `inputs`",
                            specs.len(),
                            names(specs)
                        )));
                    }
                    if request.input.is_some() {
                        return Err(de::Error::custom(format!("input `{}` is given twice", specs[0].name)));
                    }
                    request.input = Some(map.next_value_seed(TensorSeed { spec: &specs[0], tally: self.tally })?);
                }
                "inputs" if request.inputs.is_some() => return Err(de::Error::custom("`inputs` is given twice")),
                "inputs" => {
                    let named = map.next_value_seed(NamedInputs { specs, tally: self.tally })?;
                    request.inputs = Some(named);
                }
                other => {
                    return Err(de::Error::custom(format!(
                        "unknown field `{}`: expected `input` or `inputs`",
                        quoted(other)
                    )))
                }
            }
        }
        Ok(request)
    }
}

/// `inputs`: each named input decoded with its spec as it comes.
struct NamedInputs<'a, 'b> {
    specs: &'a [TensorSpec],
    tally: &'b mut Tally,
}

impl<'de> DeserializeSeed<'de> for NamedInputs<'_, '_> {
    type Value = NamedTensors;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for NamedInputs<'_, '_> {
    type Value = NamedTensors;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an object of named inputs ({})", names(self.specs))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut named: Vec<(usize, Tensor)> = Vec::with_capacity(self.specs.len());
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let Some(i) = self.specs.iter().position(|s| s.name == name) else {
                return Err(de::Error::custom(format!(
                    "this model has no input `{}` (it takes {})",
                    quoted(&name),
                    names(self.specs)
                )));
            };
            if named.iter().any(|&(j, _)| j == i) {
                return Err(de::Error::custom(format!("input `{name}` is given twice")));
            }
            let spec = &self.specs[i];
            named.push((i, map.next_value_seed(TensorSeed { spec, tally: &mut *self.tally })?));
        }
        Ok(NamedTensors(named))
    }
}

/// A `/predict` answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PredictResponse<'a> {
    /// The model's only output as nested arrays, or an object of outputs by name.
    #[schema(value_type = Value)]
    pub prediction: Prediction<'a>,
    pub model: &'a str,
    /// Where the model ran: `cpu` or `cuda:N`.
    pub device: &'a str,
}

/// One output: its nested array. Several: an object of them by name.
pub struct Prediction<'a> {
    pub outputs: &'a [Tensor],
    pub specs: &'a [TensorSpec],
}

impl Serialize for Prediction<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if let [only] = self.outputs {
            return NestedJson(only).serialize(serializer);
        }
        let mut map = serializer.serialize_map(Some(self.outputs.len()))?;
        for (spec, t) in self.specs.iter().zip(self.outputs) {
            map.serialize_entry(&spec.name, &NestedJson(t))?;
        }
        map.end()
    }
}
