use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inferd_core::{Engine, ModelConfig, Precision, Tensor};
use ort::session::{Session, SessionInputValue};
use prost::Message;

use super::gather_before_widening;
use crate::graph::NodeProto;
use crate::{OnnxEngine, OnnxSettings};

/// The parts of ONNX's messages these tests write: enough for ONNX Runtime to load and run the graph.
#[derive(Clone, PartialEq, Message)]
struct TestModel {
    #[prost(int64, tag = "1")]
    ir_version: i64,
    #[prost(message, optional, tag = "7")]
    graph: Option<TestGraph>,
    #[prost(message, repeated, tag = "8")]
    opset_import: Vec<Opset>,
}

#[derive(Clone, PartialEq, Message)]
struct Opset {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

#[derive(Clone, PartialEq, Message)]
struct TestGraph {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TestTensor>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfo>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfo>,
}

#[derive(Clone, PartialEq, Message)]
struct TestTensor {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(string, tag = "8")]
    name: String,
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
    #[prost(int32, tag = "14")]
    data_location: i32,
}

#[derive(Clone, PartialEq, Message)]
struct ValueInfo {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorType>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorType {
    #[prost(int32, tag = "1")]
    elem_type: i32,
    #[prost(message, optional, tag = "2")]
    shape: Option<Shape>,
}

#[derive(Clone, PartialEq, Message)]
struct Shape {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<Dim>,
}

#[derive(Clone, PartialEq, Message)]
struct Dim {
    #[prost(int64, optional, tag = "1")]
    dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    dim_param: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TestAttribute {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, tag = "3")]
    i: i64,
    #[prost(message, optional, tag = "5")]
    t: Option<TestTensor>,
    #[prost(bytes = "vec", optional, tag = "6")]
    g: Option<Vec<u8>>,
    #[prost(int32, tag = "20")]
    r#type: i32,
}

const FLOAT: i32 = 1;
const INT8: i32 = 3;
const INT64: i32 = 7;

fn int_attribute(name: &str, i: i64) -> Vec<u8> {
    TestAttribute { name: name.into(), i, r#type: 2, ..TestAttribute::default() }.encode_to_vec()
}

fn node(op: &str, inputs: &[&str], output: &str, attribute: Vec<Vec<u8>>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: format!("{op}_{output}"),
        op_type: op.into(),
        attribute,
        domain: String::new(),
    }
}

fn value(name: &str, elem_type: i32, dims: &[Option<i64>]) -> ValueInfo {
    let dim = dims
        .iter()
        .map(|d| match d {
            Some(n) => Dim { dim_value: Some(*n), dim_param: None },
            None => Dim { dim_value: None, dim_param: Some("n".into()) },
        })
        .collect();
    ValueInfo {
        name: name.into(),
        r#type: Some(TypeProto { tensor_type: Some(TensorType { elem_type, shape: Some(Shape { dim }) }) }),
    }
}

/// The table every test reads: 5 rows of 3 int8 values.
const TABLE: [i8; 15] = [1, -2, 3, 127, -128, 0, 5, 6, -7, 64, -32, 16, -1, 2, -3];
const ROW_SCALES: [f32; 5] = [0.5, 0.0078125, 1.25, -3.0, 0.1];
const COLUMN_SCALES: [f32; 3] = [0.25, 2.0, 0.3];

/// `rows = Gather(Mul(Cast(table), scale), ids)`, the pattern of a quantized embedding, with `scale` of `dims`.
fn lookup_model(scale: &[f32], scale_dims: &[i64]) -> TestModel {
    let initializer = vec![
        TestTensor {
            dims: vec![5, 3],
            data_type: INT8,
            name: "table_q".into(),
            raw_data: TABLE.iter().map(|&v| v as u8).collect(),
            data_location: 0,
        },
        TestTensor {
            dims: scale_dims.to_vec(),
            data_type: FLOAT,
            name: "table_scale".into(),
            raw_data: scale.iter().flat_map(|v| v.to_le_bytes()).collect(),
            data_location: 0,
        },
    ];
    TestModel {
        ir_version: 8,
        opset_import: vec![Opset { domain: String::new(), version: 17 }],
        graph: Some(TestGraph {
            name: "lookup".into(),
            node: vec![
                node("Cast", &["table_q"], "table_f", vec![int_attribute("to", FLOAT.into())]),
                node("Mul", &["table_f", "table_scale"], "table", vec![]),
                node("Gather", &["table", "ids"], "rows", vec![int_attribute("axis", 0)]),
            ],
            initializer,
            input: vec![value("ids", INT64, &[None])],
            output: vec![value("rows", FLOAT, &[None, Some(3)])],
        }),
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn settings() -> OnnxSettings {
    OnnxSettings { library: workspace().join(".cache/onnxruntime/libonnxruntime.so.1.31.1"), shared_threads: 1 }
}

#[test]
fn a_lookup_chain_becomes_gathers_then_a_cast_and_the_rest_is_kept_byte_for_byte() {
    let model = lookup_model(&ROW_SCALES, &[5, 1]);
    let bytes = model.encode_to_vec();
    let (rewritten, tables) = gather_before_widening(&bytes).expect("a chain to rewrite");
    assert_eq!(tables, 1);
    let decoded = TestModel::decode(rewritten.as_slice()).expect("a model");
    assert_eq!((decoded.ir_version, &decoded.opset_import), (model.ir_version, &model.opset_import));
    let (graph, before) = (decoded.graph.expect("a graph"), model.graph.expect("a graph"));
    assert_eq!((&graph.initializer, &graph.input, &graph.output), (&before.initializer, &before.input, &before.output));
    let ops: Vec<(&str, Vec<&str>, &str)> = graph
        .node
        .iter()
        .map(|n| (n.op_type.as_str(), n.input.iter().map(String::as_str).collect(), n.output[0].as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("Gather", vec!["table_q", "ids"], "rows/inferd_narrow"),
            ("Gather", vec!["table_scale", "ids"], "rows/inferd_scale"),
            ("Cast", vec!["rows/inferd_narrow"], "rows/inferd_wide"),
            ("Mul", vec!["rows/inferd_wide", "rows/inferd_scale"], "rows"),
        ]
    );
    // The second pass finds nothing left to rewrite.
    assert!(gather_before_widening(&rewritten).is_none());
}

fn graph(model: &mut TestModel) -> &mut TestGraph {
    model.graph.as_mut().expect("graph")
}

#[test]
fn chains_it_cannot_keep_exact_are_left_alone() {
    let rewrites = |edit: &dyn Fn(&mut TestModel)| {
        let mut model = lookup_model(&ROW_SCALES, &[5, 1]);
        edit(&mut model);
        gather_before_widening(&model.encode_to_vec()).map(|(_, n)| n)
    };
    assert_eq!(rewrites(&|_| ()), Some(1));
    // A scale that varies along the last axis of a 2-D shape ([1, 3]) could add an axis to scalar ids' row.
    assert_eq!(rewrites(&|m| graph(m).initializer[1].dims = vec![1, 3]), None);
    // The widened table read by a second node, or named as a graph output.
    assert_eq!(rewrites(&|m| graph(m).node.push(node("Neg", &["table"], "neg", vec![]))), None);
    assert_eq!(rewrites(&|m| graph(m).output.push(value("table_f", FLOAT, &[Some(5), Some(3)]))), None);
    // Along another axis.
    assert_eq!(rewrites(&|m| graph(m).node[2].attribute = vec![int_attribute("axis", 1)]), None);
    // A table the graph takes as an input (a caller may feed another).
    assert_eq!(rewrites(&|m| graph(m).input.push(value("table_q", INT8, &[Some(5), Some(3)]))), None);
    // Weights stored outside the file, or a subgraph that might read the table by name.
    assert_eq!(rewrites(&|m| graph(m).initializer[0].data_location = 1), None);
    let subgraph = TestAttribute { name: "then_branch".into(), g: Some(vec![]), r#type: 5, ..TestAttribute::default() };
    assert_eq!(rewrites(&|m| graph(m).node.push(node("If", &["c"], "branch", vec![subgraph.encode_to_vec()]))), None);
    let stored_elsewhere = TestTensor { dims: vec![2], data_type: FLOAT, data_location: 1, ..TestTensor::default() };
    let constant =
        TestAttribute { name: "value".into(), t: Some(stored_elsewhere), r#type: 4, ..TestAttribute::default() };
    assert_eq!(rewrites(&|m| graph(m).node.push(node("Constant", &[], "k", vec![constant.encode_to_vec()]))), None);
    // A `Mul` of opset 6 and before, which broadcast as its attributes said.
    assert_eq!(rewrites(&|m| graph(m).node[1].attribute = vec![int_attribute("broadcast", 1)]), None);
    // Two `graph` fields, which a reader merges.
    let model = lookup_model(&ROW_SCALES, &[5, 1]);
    let mut twice = model.encode_to_vec();
    twice.extend(TestModel { graph: model.graph.clone(), ..TestModel::default() }.encode_to_vec());
    assert!(gather_before_widening(&twice).is_none());
    // Not a model at all.
    assert!(gather_before_widening(&[0xff, 0xff, 0xff]).is_none());
}

/// Each looked-up row, computed here from the table and scales as the graph defines it.
fn expected_rows(ids: &[i64], scale: impl Fn(usize, usize) -> f32) -> Vec<f32> {
    ids.iter()
        .flat_map(|&id| {
            let row = usize::try_from(id.rem_euclid(5)).expect("a row");
            (0..3).map(move |j| (row, j))
        })
        .map(|(row, j)| f32::from(TABLE[row * 3 + j]) * scale(row, j))
        .collect()
}

#[test]
fn onnx_runtime_answers_the_rewritten_lookup_as_the_graph_defines_it() {
    let ids = [4i64, 0, 2, 4, -1, 3];
    for (scale, dims, of) in [
        (&ROW_SCALES[..], &[5i64, 1][..], &(|row: usize, _: usize| ROW_SCALES[row]) as &dyn Fn(usize, usize) -> f32),
        (&COLUMN_SCALES[..], &[3][..], &|_: usize, j: usize| COLUMN_SCALES[j]),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let bytes = lookup_model(scale, dims).encode_to_vec();
        assert!(gather_before_widening(&bytes).is_some(), "{dims:?}: the chain is rewritten at load");
        std::fs::write(dir.path().join("model.onnx"), bytes).expect("write");
        let config =
            ModelConfig::parse("lookup", dir.path(), "backend = \"onnx\"\nfile = \"model.onnx\"\ndevice = \"cpu\"\n")
                .expect("config");
        let mut engine = OnnxEngine::load(&config, &settings(), Precision::Fp32, &[]).expect("load");
        let out = engine.run(&[Tensor::from_slice(vec![ids.len()], &ids).expect("ids")]).expect("run");
        assert_eq!(out[0].shape(), [ids.len(), 3]);
        assert_eq!(out[0].to_vec::<f32>().expect("f32"), expected_rows(&ids, of), "{dims:?}");
    }
}

/// MiniLM's int8 export, loaded as stored and as rewritten (both without constant folding, as inferd loads it),
/// gives the same last hidden state to the bit.
#[test]
fn the_bundled_int8_minilm_answers_the_same_to_the_bit_when_rewritten() {
    let file = workspace().join("models/minilm-int8/model.onnx");
    let bytes =
        std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e} (./scripts/setup.sh unpacks it)", file.display()));
    let (rewritten, tables) = gather_before_widening(&bytes).expect("its embedding tables are rewritten");
    assert_eq!(tables, 2, "the word and position embeddings");
    let runtime = crate::session::runtime(&settings().library, 1).expect("ONNX Runtime");
    let session = |model: Option<&[u8]>| -> Session {
        let mut builder = Session::builder(&runtime.environment)
            .and_then(|b| b.with_disabled_optimizers("ConstantFolding").map_err(Into::into))
            .expect("builder");
        match model {
            Some(bytes) => builder.commit_from_memory(bytes),
            None => builder.commit_from_file(&file),
        }
        .expect("session")
    };
    let ids: Vec<i64> = vec![101, 7592, 2088, 2003, 1037, 3231, 102, 101, 2023, 102, 0, 0, 0, 0];
    let mask: Vec<i64> = ids.iter().enumerate().map(|(i, &id)| i64::from(id != 0 || i < 7)).collect();
    let hidden = |mut session: Session| -> Vec<f32> {
        let input = |data: Vec<i64>| {
            SessionInputValue::from(ort::value::Tensor::from_array(([2usize, 7], data)).expect("tensor").into_dyn())
        };
        let inputs = vec![
            ("input_ids", input(ids.clone())),
            ("attention_mask", input(mask.clone())),
            ("token_type_ids", input(vec![0; ids.len()])),
        ];
        let outputs = session.run(inputs).expect("run");
        let (shape, data) = outputs["last_hidden_state"].try_extract_tensor::<f32>().expect("f32");
        assert_eq!(shape.as_ref(), [2, 7, 384]);
        data.to_vec()
    };
    let (stored, late) = (hidden(session(None)), hidden(session(Some(&rewritten))));
    assert!(stored.iter().all(|v| v.is_finite()));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert!(bits(&stored) == bits(&late), "the rewritten graph's states differ from the stored graph's");
    // The session a busy model moves to (crate::busy) folds the widening away: the same states but for the
    // order of the matrix products' sums.
    let folded =
        hidden(Session::builder(&runtime.environment).expect("builder").commit_from_file(&file).expect("session"));
    let worst = folded.iter().zip(&late).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "the folded session's states differ from the narrow one's by up to {worst}");
}

/// A model with narrow weights on the CPU moves its batches to a session that widened them once it is busy, gets
/// the same rows there, and moves back when it goes idle; `[onnx] fold_constants` set either way keeps one session.
#[test]
fn a_busy_model_with_narrow_weights_moves_to_a_widened_session_and_back_when_idle() {
    let ids = [4i64, 0, 2, 4, -1, 3];
    let expected = expected_rows(&ids, |row, _| ROW_SCALES[row]);
    let run = |engine: &mut OnnxEngine| -> Vec<f32> {
        let out = engine.run(&[Tensor::from_slice(vec![ids.len()], &ids).expect("ids")]).expect("run");
        out[0].to_vec::<f32>().expect("f32")
    };
    // The file is gone by the time the wide session is built (its folder dropped at once): it is built from the
    // handle held since the load.
    let mut engine = lookup_engine(&ROW_SCALES, "").2;
    let wide = |engine: &OnnxEngine| engine.busy.as_ref().expect("narrow weights on the CPU").is_wide();
    engine.busy.as_mut().expect("narrow weights on the CPU").busy_for = Duration::ZERO;
    assert_eq!(run(&mut engine), expected, "the first batch, on the narrow session, asks for the wide one");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !wide(&engine) {
        assert!(Instant::now() < deadline, "the wide session was never built");
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(run(&mut engine), expected);
    }
    assert_eq!(run(&mut engine), expected, "on the wide session");
    engine.release_cached_memory();
    assert!(!wide(&engine), "idle: the wide session is dropped");
    assert_eq!(run(&mut engine), expected, "on the narrow session again");
    // Folding set either way, or a model never released when idle: one session.
    for extra in [
        "[onnx]\nfold_constants = false\n",
        "[onnx]\nfold_constants = true\n",
        "[batching]\nrelease_after_idle_ms = 0\n",
    ] {
        let (_dir, _, mut engine) = lookup_engine(&ROW_SCALES, extra);
        assert!(engine.busy.is_none(), "{extra}");
        assert_eq!(run(&mut engine), expected, "{extra}");
    }
    // A file written over in place after the load is another model: the batches stay on the session as loaded.
    let (dir, _, mut engine) = lookup_engine(&ROW_SCALES, "");
    let other = lookup_model(&ROW_SCALES.map(|s| 2.0 * s), &[5, 1]).encode_to_vec();
    std::fs::write(dir.path().join("model.onnx"), other).expect("write over");
    engine.busy.as_mut().expect("narrow weights on the CPU").busy_for = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !engine.busy.as_ref().expect("busy").has_failed() {
        assert!(Instant::now() < deadline, "the changed file was never refused");
        assert!(!wide(&engine));
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(run(&mut engine), expected);
    }
}

/// The lookup model with `scales` per row, loaded on the CPU with `extra` lines of `model.toml`, its folder and its
/// configuration.
fn lookup_engine(scales: &[f32], extra: &str) -> (tempfile::TempDir, ModelConfig, OnnxEngine) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("model.onnx"), lookup_model(scales, &[5, 1]).encode_to_vec()).expect("write");
    let text = format!("backend = \"onnx\"\nfile = \"model.onnx\"\ndevice = \"cpu\"\n{extra}");
    let config = ModelConfig::parse("lookup", dir.path(), &text).expect("config");
    let engine = OnnxEngine::load(&config, &settings(), Precision::Fp32, &[]).expect("load");
    (dir, config, engine)
}

/// A session with its own pool (`[onnx] intra_op_threads`) beside sessions on the shared one: both load and give
/// the same rows.
#[test]
fn a_model_with_threads_of_its_own_answers_as_one_on_the_shared_pool() {
    let ids = [3i64, 1, 4];
    let answers: Vec<Vec<f32>> = ["", "[onnx]\nintra_op_threads = 2\n"]
        .iter()
        .map(|extra| {
            let (_dir, config, mut engine) = lookup_engine(&ROW_SCALES, extra);
            assert_eq!(config.onnx.intra_op_threads, (!extra.is_empty()).then_some(2));
            let out = engine.run(&[Tensor::from_slice(vec![ids.len()], &ids).expect("ids")]).expect("run");
            out[0].to_vec::<f32>().expect("f32")
        })
        .collect();
    assert_eq!(answers[0], expected_rows(&ids, |row, _| ROW_SCALES[row]));
    assert_eq!(answers[0], answers[1]);
}
