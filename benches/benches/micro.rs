//! Micro-benchmarks of the request path's CPU work: the batching decision, gathering and scattering a batch's
//! rows, decoding a /predict body, and decoding a v2 body with binary tensors. Run with `cargo bench -p inferd-benches`; compare within one run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use inferd_batcher::policy::{decide, Candidate, Policy};
use inferd_codec::Limits;
use inferd_core::{BatchingConfig, DataType, ModelMetadata, Precision, Tensor, TensorSpec};

fn batching_policy(c: &mut Criterion) {
    let policy = Policy::from_config(&BatchingConfig { max_queue_delay_us: 1_000, ..BatchingConfig::default() }, false);
    let t0 = Instant::now();
    // 128 queued requests of two shapes, interleaved: the decision scans both groups.
    let queue: Vec<Candidate<u8>> = (0..128)
        .map(|i| Candidate { rows: 1, key: (i % 2) as u8, enqueued_at: t0 + Duration::from_micros(i), seq_len: 1 })
        .collect();
    c.bench_function("decide/128_queued_2_shapes", |b| b.iter(|| decide(black_box(&queue), &policy, t0, false)));
}

fn concat_split(c: &mut Criterion) {
    let rows: Vec<Tensor> =
        (0..64).map(|i| Tensor::from_slice(vec![1, 64], &vec![i as f32; 64]).expect("valid")).collect();
    let refs: Vec<&Tensor> = rows.iter().collect();
    c.bench_function("concat_rows/64x[1,64]_fp32", |b| b.iter(|| Tensor::concat_rows(black_box(&refs))));
    let batch = Tensor::concat_rows(&refs).expect("same shapes");
    let counts = vec![1usize; 64];
    c.bench_function("split_rows/[64,64]_fp32_into_64", |b| b.iter(|| batch.split_rows(black_box(&counts))));
}

fn json_decode(c: &mut Criterion) {
    let spec = |cols: i64| {
        vec![TensorSpec { name: "input".into(), datatype: DataType::Fp32, shape: vec![-1, cols], optional: false }]
    };
    for (rows, cols) in [(1usize, 64i64), (8, 64), (1, 512)] {
        let row: Vec<String> = (0..cols).map(|i| format!("{}.25", i % 17)).collect();
        let body = format!("{{\"input\": [{}]}}", vec![format!("[{}]", row.join(",")); rows].join(","));
        let specs = spec(cols);
        c.bench_function(&format!("decode_predict/{rows}x{cols}_fp32"), |b| {
            b.iter(|| inferd_codec::predict::decode_predict(black_box(body.as_bytes()), &specs, &Limits::NONE))
        });
    }
}

fn binary_decode(c: &mut Criterion) {
    for (rows, cols) in [(1usize, 64usize), (64, 512)] {
        let spec = |name: &str, width| TensorSpec {
            name: name.into(),
            datatype: DataType::Fp32,
            shape: vec![-1, width],
            optional: false,
        };
        let meta = ModelMetadata {
            inputs: vec![spec("input", cols as i64)],
            outputs: vec![spec("logits", 10)],
            device: "cpu".into(),
            precision: Precision::Fp32,
            platform: "bench",
            text: None,
        };
        let data: Vec<u8> = (0..rows * cols).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let header = format!(
            r#"{{"inputs":[{{"name":"input","shape":[{rows},{cols}],"datatype":"FP32","parameters":{{"binary_data_size":{}}}}}]}}"#,
            data.len()
        );
        let mut body = header.clone().into_bytes();
        body.extend_from_slice(&data);
        let body = bytes::Bytes::from(body);
        c.bench_function(&format!("decode_infer_binary/{rows}x{cols}_fp32"), |b| {
            b.iter(|| {
                inferd_codec::v2::decode_infer(
                    black_box(&body),
                    Some(header.len()),
                    &meta,
                    &Limits::NONE,
                    &inferd_codec::shm::NoRegions,
                )
            })
        });
    }
}

criterion_group!(benches, batching_policy, concat_split, json_decode, binary_decode);
criterion_main!(benches);
