//! Late widening of narrow lookup tables: where a graph widens a whole int8 (or fp16) table with a `Cast` (and
//! scales it with a `Mul`) only to `Gather` a few rows of it, the rows are gathered first and only they are widened.
//! With constant folding off (see [`crate::graph`]), MiniLM's int8 export otherwise widened its 30,522 × 384
//! word-embedding table, half of its weights, on every run to read a batch's few hundred tokens. The answer is the
//! same to the bit: the same elements are cast and multiplied by the same scales, only fewer of them.
//!
//! The file's bytes are rewritten at the protobuf level: every field is copied as it is stored, except the graph's
//! `Cast`, `Mul` and `Gather` nodes of each such chain, which become `Gather`s of the narrow table (and of a
//! per-row scale), a `Cast` and a `Mul`. Nothing is rewritten in a graph with subgraphs (a branch or a loop may
//! read a table by name from outside) or with weights stored outside the file.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use prost::encoding::{decode_varint, encode_key, encode_varint, WireType};
use prost::Message;

use crate::graph::{NodeProto, TensorProto};

/// The fields of an `AttributeProto` read here: what it holds, to tell subgraphs and tensors stored elsewhere.
#[derive(Clone, PartialEq, Message)]
struct Attribute {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, tag = "3")]
    i: i64,
    #[prost(message, optional, tag = "5")]
    t: Option<TensorProto>,
    #[prost(bytes = "vec", optional, tag = "6")]
    g: Option<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    tensors: Vec<TensorProto>,
    #[prost(bytes = "vec", repeated, tag = "11")]
    graphs: Vec<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "22")]
    sparse_tensor: Option<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "23")]
    sparse_tensors: Vec<Vec<u8>>,
}

impl Attribute {
    /// Whether ONNX Runtime would need more than the model's bytes to read this attribute, or a subgraph in it
    /// could read a table by name.
    fn outside_the_rewrite(&self) -> bool {
        let external = self.t.iter().chain(&self.tensors).any(|t| t.data_location == EXTERNAL);
        external
            || self.g.is_some()
            || !self.graphs.is_empty()
            || self.sparse_tensor.is_some()
            || !self.sparse_tensors.is_empty()
    }
}

/// A `ValueInfoProto`'s name (graph inputs and outputs).
#[derive(Clone, PartialEq, Message)]
struct Value {
    #[prost(string, tag = "1")]
    name: String,
}

const MODEL_GRAPH: u32 = 7;
const GRAPH_NODE: u32 = 1;
const GRAPH_INITIALIZER: u32 = 5;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const GRAPH_SPARSE_INITIALIZER: u32 = 15;
/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;
/// ONNX data types a table may be stored in and widened from: UINT8, INT8, FLOAT16, BFLOAT16.
const NARROW: [i32; 4] = [2, 3, 10, 16];

/// One field of a message as stored: its number, and the byte ranges of the whole field and of its value (a
/// length-delimited field's contents; otherwise the same as the whole).
struct Field {
    tag: u32,
    whole: Range<usize>,
    value: Range<usize>,
}

/// The fields of `message`, in order; `None` where it is not a message this can split (groups, bad lengths).
fn fields(message: &[u8]) -> Option<Vec<Field>> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let start = at;
        let mut rest = &message[at..];
        let key = decode_varint(&mut rest).ok()?;
        let tag = u32::try_from(key >> 3).ok()?;
        let value = match WireType::try_from(key & 7).ok()? {
            WireType::Varint => {
                let before = rest.len();
                decode_varint(&mut rest).ok()?;
                let from = message.len() - before;
                from..message.len() - rest.len()
            }
            WireType::SixtyFourBit => (message.len() - rest.len())..(message.len() - rest.len() + 8),
            WireType::ThirtyTwoBit => (message.len() - rest.len())..(message.len() - rest.len() + 4),
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
                let from = message.len() - rest.len();
                from..from.checked_add(len)?
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        if value.end > message.len() {
            return None;
        }
        at = value.end;
        fields.push(Field { tag, whole: start..at, value });
    }
    Some(fields)
}

/// One table read through a widening chain: `Cast` (and `Mul` by a scale) of a narrow initializer, then `Gather`.
struct Chain {
    cast: usize,
    mul: Option<usize>,
    gather: usize,
    /// The scale is per row (`[rows, 1, …]`): it is gathered too.
    row_scale: bool,
}

/// The model in `bytes`, rewritten so that each narrow table is gathered before it is widened; `None` where
/// there is no such table, or the file is not a model this can rewrite (ONNX Runtime then reads it as it is).
pub(crate) fn gather_before_widening(bytes: &[u8]) -> Option<(Vec<u8>, usize)> {
    let model = fields(bytes)?;
    // Two `graph` fields would be merged by a reader; this rewrites one only.
    let mut graphs = model.iter().filter(|f| f.tag == MODEL_GRAPH);
    let (Some(graph_field), None) = (graphs.next(), graphs.next()) else { return None };
    let graph = &bytes[graph_field.value.clone()];
    let graph_fields = fields(graph)?;

    let mut nodes = Vec::new();
    let mut initializers = HashMap::new();
    let mut boundary = HashSet::new();
    for field in &graph_fields {
        let value = &graph[field.value.clone()];
        match field.tag {
            GRAPH_NODE => nodes.push(NodeProto::decode(value).ok()?),
            GRAPH_INITIALIZER => {
                let tensor = TensorProto::decode(value).ok()?;
                if tensor.data_location == EXTERNAL {
                    return None;
                }
                initializers.insert(tensor.name.clone(), tensor);
            }
            GRAPH_INPUT | GRAPH_OUTPUT => {
                boundary.insert(Value::decode(value).ok()?.name);
            }
            GRAPH_SPARSE_INITIALIZER => return None,
            _ => {}
        }
    }
    let mut attributes = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let decoded: Vec<Attribute> =
            node.attribute.iter().map(|a| Attribute::decode(a.as_slice())).collect::<Result<_, _>>().ok()?;
        if decoded.iter().any(Attribute::outside_the_rewrite) {
            return None;
        }
        attributes.push(decoded);
    }

    let chains = find_chains(&nodes, &attributes, &initializers, &boundary);
    if chains.is_empty() {
        return None;
    }
    let mut names: HashSet<&str> =
        nodes.iter().flat_map(|n| n.output.iter().chain(&n.input)).map(String::as_str).collect();
    names.extend(initializers.keys().map(String::as_str));
    names.extend(boundary.iter().map(String::as_str));

    let mut replaced: HashMap<usize, Vec<NodeProto>> = HashMap::new();
    let mut removed = HashSet::new();
    for chain in &chains {
        let (cast, gather) = (&nodes[chain.cast], &nodes[chain.gather]);
        let out = &gather.output[0];
        let fresh = |suffix: &str| format!("{out}/inferd_{suffix}");
        if ["narrow", "scale", "wide"].iter().any(|s| names.contains(fresh(s).as_str())) {
            continue;
        }
        let named = |suffix: &str| {
            if gather.name.is_empty() {
                String::new()
            } else {
                format!("{}/inferd_{suffix}", gather.name)
            }
        };
        let node = |op: &str, input: Vec<String>, output: String, attribute: &[Vec<u8>], suffix: &str| NodeProto {
            input,
            output: vec![output],
            name: named(suffix),
            op_type: op.into(),
            attribute: attribute.to_vec(),
            domain: String::new(),
        };
        let ids = gather.input[1].clone();
        let mut new = vec![node(
            "Gather",
            vec![cast.input[0].clone(), ids.clone()],
            fresh("narrow"),
            &gather.attribute,
            "gather",
        )];
        match chain.mul {
            None => new.push(node("Cast", vec![fresh("narrow")], out.clone(), &cast.attribute, "cast")),
            Some(mul) => {
                let mul = &nodes[mul];
                let scale = mul.input.iter().find(|i| **i != cast.output[0]).cloned().unwrap_or_default();
                let scale = if chain.row_scale {
                    new.push(node("Gather", vec![scale, ids], fresh("scale"), &gather.attribute, "gather_scale"));
                    fresh("scale")
                } else {
                    scale
                };
                new.push(node("Cast", vec![fresh("narrow")], fresh("wide"), &cast.attribute, "cast"));
                new.push(node("Mul", vec![fresh("wide"), scale], out.clone(), &[], "mul"));
            }
        }
        replaced.insert(chain.gather, new);
        removed.insert(chain.cast);
        removed.extend(chain.mul);
    }
    if replaced.is_empty() {
        return None;
    }

    let mut new_graph = Vec::with_capacity(graph.len());
    let mut index = 0;
    for field in &graph_fields {
        if field.tag != GRAPH_NODE {
            new_graph.extend_from_slice(&graph[field.whole.clone()]);
            continue;
        }
        let i = index;
        index += 1;
        if let Some(new) = replaced.get(&i) {
            for node in new {
                put_message(GRAPH_NODE, &node.encode_to_vec(), &mut new_graph);
            }
        } else if !removed.contains(&i) {
            new_graph.extend_from_slice(&graph[field.whole.clone()]);
        }
    }
    let mut out = Vec::with_capacity(bytes.len());
    for field in &model {
        if field.tag == MODEL_GRAPH && field.whole == graph_field.whole {
            put_message(MODEL_GRAPH, &new_graph, &mut out);
        } else {
            out.extend_from_slice(&bytes[field.whole.clone()]);
        }
    }
    Some((out, replaced.len()))
}

fn put_message(tag: u32, message: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(message.len() as u64, out);
    out.extend_from_slice(message);
}

/// The chains whose rewrite keeps every answer: a `Cast` of a narrow 2-D-or-more initializer read only by a `Mul`
/// with a scalar, per-column or per-row initializer scale (or read directly), read only by one `Gather` along
/// axis 0; none of the names in between a graph input or output.
fn find_chains(
    nodes: &[NodeProto],
    attributes: &[Vec<Attribute>],
    initializers: &HashMap<String, TensorProto>,
    boundary: &HashSet<String>,
) -> Vec<Chain> {
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut produced = HashSet::new();
    for (i, node) in nodes.iter().enumerate() {
        for input in &node.input {
            readers.entry(input.as_str()).or_default().push(i);
        }
        produced.extend(node.output.iter().map(String::as_str));
    }
    // The one node that reads `name`, once, where `name` is internal to the graph.
    let only_reader = |name: &str| match readers.get(name).map(Vec::as_slice) {
        Some(&[i]) if !boundary.contains(name) => Some(i),
        _ => None,
    };
    let standard = |node: &NodeProto| node.domain.is_empty() || node.domain == "ai.onnx";
    let int = |i: usize, name: &str| attributes[i].iter().find(|a| a.name == name).map(|a| a.i);
    let constant = |name: &str| initializers.get(name).filter(|_| !produced.contains(name) && !boundary.contains(name));

    let mut chains = Vec::new();
    for (cast, node) in nodes.iter().enumerate() {
        if node.op_type != "Cast" || !standard(node) || node.input.len() != 1 || node.output.len() != 1 {
            continue;
        }
        let Some(table) = constant(&node.input[0]) else { continue };
        let Some(to) = int(cast, "to") else { continue };
        if !NARROW.contains(&table.data_type) || table.dims.len() < 2 || table.dims.iter().any(|&d| d < 1) {
            continue;
        }
        let Some(next) = only_reader(&node.output[0]) else { continue };
        let (mul, row_scale, gather) = match nodes[next].op_type.as_str() {
            "Gather" => (None, false, next),
            "Mul" => {
                let mul = &nodes[next];
                // Before opset 7 a `Mul` broadcast as its `broadcast` and `axis` attributes said: not read here.
                let plain = mul.attribute.is_empty() && mul.input.len() == 2 && mul.output.len() == 1;
                if !standard(mul) || !plain || mul.input[0] == mul.input[1] {
                    continue;
                }
                let Some(scale) = mul.input.iter().find(|i| **i != node.output[0]).and_then(|s| constant(s)) else {
                    continue;
                };
                let Some(row_scale) = scale_kind(&scale.dims, &table.dims) else { continue };
                if i64::from(scale.data_type) != to {
                    continue;
                }
                let Some(gather) = only_reader(&mul.output[0]) else { continue };
                (Some(next), row_scale, gather)
            }
            _ => continue,
        };
        let g = &nodes[gather];
        let reads_table = g.input.first() == Some(mul.map_or(&node.output[0], |m| &nodes[m].output[0]));
        if g.op_type != "Gather" || !standard(g) || g.input.len() != 2 || g.output.len() != 1 || !reads_table {
            continue;
        }
        if int(gather, "axis").unwrap_or(0) != 0 {
            continue;
        }
        chains.push(Chain { cast, mul, gather, row_scale });
    }
    chains
}

/// How a scale of shape `scale` multiplies a table of shape `table` so that gathering rows first keeps each
/// element's product: `Some(false)` for one that applies the same to every row (a scalar, or a vector along the
/// last axis, whose broadcast cannot add an axis to the gathered rows), `Some(true)` for one scale per row (the
/// table's rank, its rows, ones after: gathered with the rows); `None` for anything else.
fn scale_kind(scale: &[i64], table: &[i64]) -> Option<bool> {
    let last = *table.last()?;
    match scale {
        [] => Some(false),
        [n] if *n == 1 || *n == last => Some(false),
        [rows, rest @ ..] if scale.len() == table.len() && *rows == table[0] && rest.iter().all(|&d| d == 1) => {
            Some(true)
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "late_tests.rs"]
mod tests;
