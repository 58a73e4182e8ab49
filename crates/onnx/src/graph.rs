//! What an ONNX file's graph stores, read without ONNX Runtime: its initializers' and `Constant` nodes' bytes
//! (what a loaded model keeps resident), and whether it stores weights narrower than it computes with them (int8
//! or fp16 weights widened by a `Cast` at run time). Constant folding would widen such weights once at load and
//! keep the wide copy: MiniLM's int8 export (22 MB of int8 weights, a `Cast` and a `Mul` before each use) became
//! 90 MB of fp32 in memory. The file is decoded with only the fields read here declared; the rest, the weights' own
//! bytes among them, are skipped without a copy.

use std::collections::HashSet;
use std::path::Path;

use prost::Message;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
}

/// A `NodeProto`, its attributes kept as their stored bytes (so that [`crate::late`] can write one back as it was).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub(crate) input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub(crate) output: Vec<String>,
    #[prost(string, tag = "3")]
    pub(crate) name: String,
    #[prost(string, tag = "4")]
    pub(crate) op_type: String,
    #[prost(bytes = "vec", repeated, tag = "5")]
    pub(crate) attribute: Vec<Vec<u8>>,
    #[prost(string, tag = "7")]
    pub(crate) domain: String,
}

/// The fields of an `AttributeProto` read here: a `Constant` node's tensor (`value`).
#[derive(Clone, PartialEq, Message)]
struct AttributeProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "5")]
    t: Option<TensorProto>,
}

/// The fields of a `TensorProto` read here; its data is skipped.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub(crate) dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub(crate) data_type: i32,
    #[prost(string, tag = "8")]
    pub(crate) name: String,
    /// 1 (`EXTERNAL`): the data is in another file.
    #[prost(int32, tag = "14")]
    pub(crate) data_location: i32,
}

/// ONNX's `TensorProto.DataType` numbers of the narrow types a graph may store and widen when it runs.
const NARROW_TYPES: [i32; 6] =
    [2 /* UINT8 */, 3 /* INT8 */, 10 /* FLOAT16 */, 16 /* BFLOAT16 */, 21, 22 /* (U)INT4 */];

/// What a graph stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Stored {
    /// Bytes of its initializers and `Constant` nodes as stored (the file's weights, in or beside it).
    pub(crate) weight_bytes: u64,
    /// Bytes of narrow initializers that a `Cast` widens: what constant folding would widen once and keep.
    pub(crate) widened_bytes: u64,
    /// Whether some initializer's data is in another file.
    pub(crate) external: bool,
}

/// Reads what `file`'s graph stores; `None` where the file is not an ONNX model this can read (ONNX Runtime then
/// says why when it loads it).
pub(crate) fn stored(file: &Path) -> Option<Stored> {
    stored_in(&std::fs::read(file).ok()?)
}

/// What the model in `bytes` stores.
pub(crate) fn stored_in(bytes: &[u8]) -> Option<Stored> {
    Some(summarise(&ModelProto::decode(bytes).ok()?.graph?))
}

fn summarise(graph: &GraphProto) -> Stored {
    let cast: HashSet<&str> =
        graph.node.iter().filter(|n| n.op_type == "Cast").filter_map(|n| n.input.first()).map(String::as_str).collect();
    let mut stored = Stored::default();
    for tensor in &graph.initializer {
        let bytes = tensor_bytes(tensor);
        stored.weight_bytes = stored.weight_bytes.saturating_add(bytes);
        stored.external |= tensor.data_location == 1;
        if NARROW_TYPES.contains(&tensor.data_type) && cast.contains(tensor.name.as_str()) {
            stored.widened_bytes = stored.widened_bytes.saturating_add(bytes);
        }
    }
    // Some exporters store weights as `Constant` nodes rather than initializers: the same bytes once loaded. Not
    // counted as widened: a small narrow constant before a `Cast` is common in mixed-precision graphs, and turning
    // constant folding off for it would buy nothing ([`crate::late`] rewrites initializers only).
    let constants =
        graph.node.iter().filter(|n| n.op_type == "Constant" && matches!(n.domain.as_str(), "" | "ai.onnx"));
    for tensor in constants.filter_map(constant_value) {
        stored.weight_bytes = stored.weight_bytes.saturating_add(tensor_bytes(&tensor));
    }
    stored
}

/// Bytes of a tensor's data as its shape and type say (nothing for a negative or overflowing shape).
fn tensor_bytes(tensor: &TensorProto) -> u64 {
    let elements = tensor.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?));
    elements.unwrap_or(0).saturating_mul(element_bits(tensor.data_type)) / 8
}

/// A `Constant` node's tensor: its `value` attribute (the other forms hold a few scalars or lists, not weights).
fn constant_value(node: &NodeProto) -> Option<TensorProto> {
    node.attribute
        .iter()
        .filter_map(|bytes| AttributeProto::decode(bytes.as_slice()).ok())
        .find(|a| a.name == "value")
        .and_then(|a| a.t)
}

/// Bits per element of an ONNX data type (strings and unknown types: none counted).
fn element_bits(data_type: i32) -> u64 {
    match data_type {
        21 | 22 => 4,
        2 | 3 | 9 => 8,
        4 | 5 | 10 | 16 => 16,
        1 | 6 | 12 => 32,
        7 | 11 | 13 | 14 => 64,
        15 => 128,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, data_type: i32, dims: &[i64]) -> TensorProto {
        TensorProto { dims: dims.to_vec(), data_type, name: name.into(), data_location: 0 }
    }

    fn node(op: &str, inputs: &[&str]) -> NodeProto {
        NodeProto { input: inputs.iter().map(|s| s.to_string()).collect(), op_type: op.into(), ..NodeProto::default() }
    }

    #[test]
    fn narrow_weights_a_cast_widens_are_counted_apart() {
        let graph = GraphProto {
            node: vec![node("Cast", &["w8"]), node("MatMul", &["x", "w32"]), node("MatMul", &["x", "q8"])],
            initializer: vec![tensor("w8", 3, &[1000, 10]), tensor("w32", 1, &[10, 10]), tensor("q8", 3, &[7])],
        };
        let stored = Stored { weight_bytes: 10_000 + 400 + 7, widened_bytes: 10_000, external: false };
        assert_eq!(summarise(&graph), stored);
        // One initializer's data in another file marks the graph.
        let mut graph = graph;
        graph.initializer[1].data_location = 1;
        assert_eq!(summarise(&graph), Stored { external: true, ..stored });
    }

    #[test]
    fn weights_in_constant_nodes_count_as_initializers_do() {
        let constant = |output: &str, tensor: TensorProto| NodeProto {
            output: vec![output.into()],
            op_type: "Constant".into(),
            attribute: vec![AttributeProto { name: "value".into(), t: Some(tensor) }.encode_to_vec()],
            ..NodeProto::default()
        };
        let graph = GraphProto {
            node: vec![
                constant("w8", tensor("", 3, &[1000, 10])),
                node("Cast", &["w8"]),
                constant("w32", tensor("", 1, &[10, 10])),
                NodeProto { attribute: vec![vec![0xff, 0xff]], ..constant("junk", tensor("", 1, &[10])) },
            ],
            initializer: vec![tensor("b", 1, &[10])],
        };
        // The node whose attributes are not an AttributeProto counts as nothing; a Constant is never counted as
        // widened, whatever reads it.
        assert_eq!(summarise(&graph), Stored { weight_bytes: 10_000 + 400 + 40, widened_bytes: 0, external: false });
    }

    #[test]
    fn a_file_round_trips_through_the_decoder_and_junk_is_no_graph() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("m.onnx");
        let graph = GraphProto { node: vec![node("Cast", &["h"])], initializer: vec![tensor("h", 10, &[3, 5])] };
        std::fs::write(&path, ModelProto { graph: Some(graph) }.encode_to_vec()).expect("write");
        assert_eq!(stored(&path), Some(Stored { weight_bytes: 30, widened_bytes: 30, external: false }));
        std::fs::write(&path, [0xff, 0xff, 0xff]).expect("write");
        assert_eq!(stored(&path), None);
        assert_eq!(stored(&dir.path().join("absent.onnx")), None);
    }

    #[test]
    fn negative_or_huge_dimensions_count_nothing_and_never_overflow() {
        let graph = GraphProto {
            node: vec![],
            initializer: vec![tensor("a", 1, &[-1, 4]), tensor("b", 1, &[i64::MAX, i64::MAX]), tensor("s", 8, &[9])],
        };
        assert_eq!(summarise(&graph).weight_bytes, 0);
    }
}
