//! Request bodies for a model: random valid inputs generated from its v2 metadata (or one read from a file), in
//! each protocol inferd speaks.

use anyhow::{bail, Context};
use bytes::Bytes;
use inferd_core::half::{bf16, f16};
use inferd_core::DataType;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `POST /models/{model}/predict` with nested JSON arrays.
    Predict,
    /// `POST /v2/models/{model}/infer` with JSON `data`.
    V2Json,
    /// `POST /v2/models/{model}/infer` with Triton's binary tensor extension, both ways.
    V2Binary,
    /// `POST /models/{model}/embed` (TEI's API) with sentences from a fixed set of mixed lengths.
    Embed,
    /// `POST /models/{model}/rerank` (TEI's API): a short query and `--rows` passages from the same set.
    Rerank,
    /// `POST /models/{model}/predict` with a picture (`--body`) as the body, `Content-Type: image/*`.
    Image,
}

impl Protocol {
    pub fn path(self, model: &str) -> String {
        match self {
            Protocol::Predict | Protocol::Image => format!("/models/{model}/predict"),
            Protocol::V2Json | Protocol::V2Binary => format!("/v2/models/{model}/infer"),
            Protocol::Embed => format!("/models/{model}/embed"),
            Protocol::Rerank => format!("/models/{model}/rerank"),
        }
    }
}

/// One ready-to-send body. `Bytes`: sending it shares the buffer instead of copying it for every request.
#[derive(Debug, Clone)]
pub struct Body {
    pub bytes: Bytes,
    /// `Inference-Header-Content-Length`, for binary bodies.
    pub header_length: Option<usize>,
}

/// An input as `/v2/models/{model}` describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct InputSpec {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

#[derive(Debug, Deserialize)]
pub struct ModelMetadata {
    pub inputs: Vec<InputSpec>,
}

/// A small, fast, seeded generator: benchmark inputs need to vary, not to be cryptographic.
struct XorShift(u64);

impl XorShift {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One input's random values, as JSON numbers and as little-endian bytes.
struct Values {
    json: Vec<Value>,
    bytes: Vec<u8>,
}

fn values(datatype: DataType, count: usize, rng: &mut XorShift) -> anyhow::Result<Values> {
    let mut json = Vec::with_capacity(count);
    let mut bytes = Vec::with_capacity(count * datatype.size().unwrap_or(1));
    for _ in 0..count {
        let x = rng.next_f64() * 16.0;
        match datatype {
            DataType::Fp32 => {
                let v = x as f32;
                json.push(json!(v));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Fp64 => {
                json.push(json!(x));
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            DataType::Fp16 => {
                let v = f16::from_f64(x);
                json.push(json!(v.to_f32()));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Bf16 => {
                let v = bf16::from_f64(x);
                json.push(json!(v.to_f32()));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Int32 => {
                let v = x as i32;
                json.push(json!(v));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Int64 => {
                let v = x as i64;
                json.push(json!(v));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Bool => {
                let v = x >= 8.0;
                json.push(json!(v));
                bytes.push(u8::from(v));
            }
            other => bail!("inferd-bench generates FP32, FP64, FP16, BF16, INT32, INT64 and BOOL inputs, not {other}"),
        }
    }
    Ok(Values { json, bytes })
}

/// Nests `flat` row-major into `shape`.
fn nest(flat: &[Value], shape: &[usize]) -> Value {
    match shape {
        [] | [_] => Value::Array(flat.to_vec()),
        [n, rest @ ..] => {
            let width = flat.len() / n.max(&1);
            Value::Array(flat.chunks(width.max(1)).map(|c| nest(c, rest)).collect())
        }
    }
}

/// `count` bodies of `rows` rows each, with random values, for `protocol`.
pub fn generate(
    inputs: &[InputSpec],
    rows: usize,
    protocol: Protocol,
    count: usize,
    seed: u64,
) -> anyhow::Result<Vec<Body>> {
    let mut rng = XorShift(seed | 1);
    (0..count)
        .map(|_| {
            let mut tensors = Vec::with_capacity(inputs.len());
            for input in inputs {
                let datatype: DataType = input.datatype.parse().map_err(|e| anyhow::anyhow!("input `{}`: {e}", input.name))?;
                let mut shape = vec![rows];
                for &d in input.shape.iter().skip(1) {
                    shape.push(usize::try_from(d).ok().filter(|&d| d > 0).with_context(|| {
                        format!("input `{}` has a variable dimension beyond the first: pass --body", input.name)
                    })?);
                }
                let count: usize = shape.iter().product();
                tensors.push((input, datatype, shape, values(datatype, count, &mut rng)?));
            }
            Ok(match protocol {
                Protocol::Embed | Protocol::Rerank => bail!("text bodies come from texts::bodies"),
                Protocol::Image => bail!("a picture comes from --body"),
                Protocol::Predict => {
                    let body = if let [(_, _, shape, v)] = tensors.as_slice() {
                        json!({ "input": nest(&v.json, shape) })
                    } else {
                        let named: serde_json::Map<String, Value> =
                            tensors.iter().map(|(i, _, s, v)| (i.name.clone(), nest(&v.json, s))).collect();
                        json!({ "inputs": named })
                    };
                    Body { bytes: serde_json::to_vec(&body)?.into(), header_length: None }
                }
                Protocol::V2Json => {
                    let inputs: Vec<Value> = tensors
                        .iter()
                        .map(|(i, dt, s, v)| json!({"name": i.name, "shape": s, "datatype": dt.as_str(), "data": v.json}))
                        .collect();
                    Body { bytes: serde_json::to_vec(&json!({ "inputs": inputs }))?.into(), header_length: None }
                }
                Protocol::V2Binary => {
                    let inputs: Vec<Value> = tensors
                        .iter()
                        .map(|(i, dt, s, v)| {
                            json!({"name": i.name, "shape": s, "datatype": dt.as_str(),
                                   "parameters": {"binary_data_size": v.bytes.len()}})
                        })
                        .collect();
                    let header =
                        serde_json::to_vec(&json!({ "inputs": inputs, "parameters": {"binary_data_output": true} }))?;
                    let header_length = header.len();
                    let mut bytes = header;
                    for (_, _, _, v) in &tensors {
                        bytes.extend_from_slice(&v.bytes);
                    }
                    Body { bytes: bytes.into(), header_length: Some(header_length) }
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digits() -> Vec<InputSpec> {
        vec![InputSpec { name: "input".into(), datatype: "FP32".into(), shape: vec![-1, 4] }]
    }

    #[test]
    fn predict_bodies_nest_rows() {
        let bodies = generate(&digits(), 3, Protocol::Predict, 2, 7).expect("bodies");
        assert_eq!(bodies.len(), 2);
        let v: Value = serde_json::from_slice(&bodies[0].bytes).expect("JSON");
        let rows = v["input"].as_array().expect("rows");
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.as_array().is_some_and(|r| r.len() == 4)));
        assert_ne!(bodies[0].bytes, bodies[1].bytes, "bodies vary");
    }

    #[test]
    fn binary_bodies_carry_the_header_length_and_the_bytes() {
        let bodies = generate(&digits(), 2, Protocol::V2Binary, 1, 7).expect("bodies");
        let len = bodies[0].header_length.expect("a header length");
        let header: Value = serde_json::from_slice(&bodies[0].bytes[..len]).expect("JSON header");
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 32);
        assert_eq!(bodies[0].bytes.len() - len, 32);
    }
}
