//! The `/predict` wire format: `{"input": [...]}` or `{"inputs": {"name": [...], ...}}` in, nested arrays out.
//! The types here are the ones served, and the OpenAPI document's schemas are derived from them.

use std::fmt;

use inferd_core::{Tensor, TensorSpec};
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use super::json::{Budget, NestedJson, TensorSeed};
use super::{check_json_depth, names, quoted, CodecError, Limits};

/// A `/predict` body: one input as `input`, or several by name in `inputs`. Tensors are nested arrays, one
/// array per row. Parsed first with each tensor's text left as it is; [`decode_predict`] then decodes those.
#[derive(Debug, utoipa::ToSchema)]
#[schema(example = json!({"input": [[0.0, 0.5, 1.0]]}))]
pub struct PredictRequest<'a> {
    /// The model's only input, as nested arrays (rows first).
    #[schema(value_type = Option<Vec<Value>>)]
    pub input: Option<&'a RawValue>,
    /// Several inputs by name.
    #[schema(value_type = Option<std::collections::HashMap<String, Vec<Value>>>)]
    pub inputs: Option<Vec<(String, &'a RawValue)>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for PredictRequest<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PredictRequestVisitor)
    }
}

struct PredictRequestVisitor;

impl<'de> Visitor<'de> for PredictRequestVisitor {
    type Value = PredictRequest<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with `input` (an array) or `inputs` (an object of named arrays)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut request = PredictRequest { input: None, inputs: None };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "input" if request.input.is_some() => return Err(de::Error::custom("input `input` is given twice")),
                "input" => request.input = Some(map.next_value()?),
                "inputs" if request.inputs.is_some() => return Err(de::Error::custom("`inputs` is given twice")),
                "inputs" => request.inputs = Some(map.next_value_seed(NamedInputs)?),
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

/// `inputs`: name → tensor text, in the body's order, repeats kept so that they can be refused.
struct NamedInputs;

impl<'de> DeserializeSeed<'de> for NamedInputs {
    type Value = Vec<(String, &'de RawValue)>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for NamedInputs {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of named inputs")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut inputs = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            inputs.push((name, map.next_value()?));
        }
        Ok(inputs)
    }
}

/// Decodes a `/predict` body into one tensor per spec, in the specs' order, within `limits`: rows and elements
/// past the limits stop the decoding where they are met.
pub fn decode_predict(body: &[u8], specs: &[TensorSpec], limits: &Limits) -> Result<Vec<Tensor>, CodecError> {
    check_json_depth(body, limits.max_json_depth)?;
    let invalid = |e: serde_json::Error| CodecError::Invalid(e.to_string());
    let request: PredictRequest<'_> = serde_json::from_slice(body).map_err(invalid)?;
    let mut texts: Vec<Option<&RawValue>> = vec![None; specs.len()];
    if let Some(text) = request.input {
        if specs.len() != 1 {
            return Err(CodecError::Invalid(format!(
                "this model takes {} inputs ({}): send them by name in `inputs`",
                specs.len(),
                names(specs)
            )));
        }
        texts[0] = Some(text);
    }
    for (name, text) in request.inputs.unwrap_or_default() {
        let Some(i) = specs.iter().position(|s| s.name == name) else {
            return Err(CodecError::Invalid(format!(
                "this model has no input `{}` (it takes {})",
                quoted(&name),
                names(specs)
            )));
        };
        if texts[i].replace(text).is_some() {
            return Err(CodecError::Invalid(format!("input `{}` is given twice", specs[i].name)));
        }
    }
    let mut budget = Budget::new(*limits);
    specs
        .iter()
        .zip(texts)
        .map(|(spec, text)| {
            let text = text.ok_or_else(|| CodecError::Invalid(format!("missing input `{}`", spec.name)))?;
            let mut de = serde_json::Deserializer::from_str(text.get());
            let decoded = TensorSeed { spec, budget: &mut budget }.deserialize(&mut de);
            decoded.map_err(|e| budget.over.take().unwrap_or_else(|| invalid(e)))
        })
        .collect()
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
