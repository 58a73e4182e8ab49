//! Text models end to end: all-MiniLM-L6-v2 on candle and its int8 ONNX export, both unpacked by
//! `scripts/setup.sh`, over TEI's, OpenAI's, KServe's and the seed's protocols.

use inferd_tests::{Repo, TestServer};
use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "the",
    "server",
    "batches",
    "requests",
    "of",
    "different",
    "lengths",
    "on",
    "a",
    "GPU",
    "naïve",
    "café",
    "embeddings",
    "are",
    "vectors",
    "Zürich",
    "—",
    "tokens",
    "padding",
    "must",
    "never",
    "change",
    "results",
    "!",
];

/// 64 sentences of 1 to 40 words: a ragged set.
fn sentences() -> Vec<String> {
    (0..64)
        .map(|i| {
            let len = 1 + (i * 7) % 40;
            (0..len).map(|j| WORDS[(i + j * 5) % WORDS.len()]).collect::<Vec<_>>().join(" ")
        })
        .collect()
}

/// MiniLM on candle as `minilm` and its int8 ONNX export as `minilm-int8`, each waiting `delay_us` for a batch.
fn text_repo(delay_us: u32) -> Repo {
    let delay = move |t: String| format!("{t}\nmax_queue_delay_us = {delay_us}\n");
    Repo::new().model("minilm", "minilm", delay).model("minilm-int8", "minilm-int8", |t| {
        let t = t.replace("[batching]", "");
        format!("{t}\n[batching]\nmax_batch_size = 64\nmax_queue_delay_us = {delay_us}\n")
    })
}

fn rows(body: &Value) -> Vec<Vec<f64>> {
    let rows = body.as_array().unwrap_or_else(|| panic!("a list of embeddings: {body}"));
    rows.iter()
        .map(|r| r.as_array().expect("an embedding").iter().map(|v| v.as_f64().expect("a number")).collect())
        .collect()
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn norm(a: &[f64]) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

async fn embed(server: &TestServer, model: &str, body: Value) -> Vec<Vec<f64>> {
    let r = server.post_json(&format!("/models/{model}/embed"), &body).await;
    let status = r.status();
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(status, 200, "{body}");
    rows(&body)
}

#[tokio::test]
async fn padding_never_changes_an_embedding() {
    let repo = text_repo(50_000);
    let server = TestServer::ready(repo.path(), &[], None).await;
    let texts = sentences();
    for model in ["minilm", "minilm-int8"] {
        let mut alone = Vec::new();
        for text in &texts {
            alone.push(embed(&server, model, json!({ "inputs": text })).await.remove(0));
        }
        // All 64 in one request, then 64 clients at once: both batch ragged sequences together.
        let together = embed(&server, model, json!({ "inputs": texts })).await;
        let bodies = texts.iter().map(|text| json!({ "inputs": [text] })).collect();
        let concurrent: Vec<Vec<f64>> = post_concurrently(&server, model, bodies)
            .await
            .into_iter()
            .map(|(status, body)| {
                assert_eq!(status, 200, "{body}");
                rows(&body).remove(0)
            })
            .collect();
        for (i, a) in alone.iter().enumerate() {
            assert_eq!(a.len(), 384);
            assert!((norm(a) - 1.0).abs() < 1e-5, "{model}: normalised by default");
            for (how, b) in [("one request", &together[i]), ("concurrent", &concurrent[i])] {
                let diff = max_abs_diff(a, b);
                assert!(diff < 1e-5, "{model}, sentence {i} ({how}): off by {diff} when padded");
            }
        }
        let m = server.metrics().await;
        let labels = [("model", model)];
        let (real, padded) =
            (m.value("inferd_batch_tokens_total", &labels), m.value("inferd_batch_padded_tokens_total", &labels));
        let batches = m.value("inferd_batch_size_rows_count", &labels);
        assert!(padded > real, "{model}: ragged batches were padded ({padded} > {real})");
        assert!(batches < 64.0 + 64.0 + 64.0 - 10.0, "{model}: texts batched together ({batches} batches)");
        assert!(padded / real <= 1.5, "{model}: padding waste {} stays bounded", padded / real);
    }
}

/// Posts every body to `/models/{model}/embed` at once; the answers in order, as (status, JSON).
async fn post_concurrently(server: &TestServer, model: &str, bodies: Vec<Value>) -> Vec<(u16, Value)> {
    let url = server.url(&format!("/models/{model}/embed"));
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let request = server.client.post(&url).body(body.to_string());
            tokio::spawn(async move {
                let r = request.send().await.expect("the server answers");
                (r.status().as_u16(), r.json::<Value>().await.expect("JSON"))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("the client task"));
    }
    answers
}

#[tokio::test]
async fn long_texts_are_truncated_unless_asked_not_to() {
    let repo = text_repo(1000);
    let server = TestServer::ready(repo.path(), &[], None).await;
    let long = vec!["inference"; 400].join(" ");
    let r = server.post_json("/models/minilm/embed", &json!({ "inputs": long, "truncate": false })).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(body["error_type"], "Validation");
    let error = body["error"].as_str().expect("a message");
    assert!(error.contains("402 tokens long; this model takes at most 256"), "{error}");
    let cut = embed(&server, "minilm", json!({ "inputs": long })).await;

    // Token ids are truncated the same way: 400 ids embed as their first 256.
    let mut ids = vec![101u32];
    ids.extend(std::iter::repeat_n(2_000u32, 398));
    ids.push(102);
    let whole = embed(&server, "minilm", json!({ "inputs": [ids.clone()] })).await;
    let first = embed(&server, "minilm", json!({ "inputs": [ids[..256].to_vec()] })).await;
    assert!(max_abs_diff(&whole[0], &first[0]) < 1e-6);
    let r = server.post_json("/models/minilm/embed", &json!({ "inputs": [ids], "truncate": false })).await;
    assert_eq!(r.status(), 400);
    assert_eq!(cut[0].len(), 384);
}

#[tokio::test]
async fn every_bad_text_input_gets_a_clear_4xx() {
    let repo = text_repo(1000).bundled("digits");
    let server = TestServer::ready(repo.path(), &["--max-rows", "8", "--default-embed-model", "minilm"], None).await;
    let nine: Vec<&str> = vec!["a"; 9];
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("/embed", json!({ "inputs": [] }), 400, "the input is empty"),
        ("/embed", json!({ "inputs": "" }), 400, "text 0 is empty"),
        ("/embed", json!({ "inputs": ["fine", ""] }), 400, "text 1 is empty"),
        ("/embed", json!({ "inputs": ["a", 3] }), 400, "invalid embed request"),
        ("/embed", json!({ "inputs": [null] }), 400, "invalid embed request"),
        ("/embed", json!({ "input": "a" }), 400, "invalid embed request"),
        ("/embed", json!({ "inputs": nine }), 413, "at most 8 per request"),
        ("/embed", json!({ "inputs": [[101, 999_999, 102]] }), 400, "outside the model's vocabulary of 30522"),
        ("/embed", json!({ "inputs": [[]] }), 400, "token list 0 is empty"),
        ("/embed", json!({ "inputs": [[-1]] }), 400, "invalid embed request"),
        ("/embed", json!({ "inputs": "a", "dimensions": 0 }), 400, "dimensions: must be at least 1"),
        ("/embed", json!({ "inputs": "a", "dimensions": 385 }), 400, "cannot lengthen them to 385"),
        ("/embed", json!({ "inputs": "a", "dimensions": -3 }), 400, "invalid embed request"),
        ("/embed_all", json!({ "inputs": "a", "dimensions": 8 }), 400, "each token's whole state"),
        ("/models/digits/embed", json!({ "inputs": "a" }), 400, "does not embed text"),
        ("/models/nope/embed", json!({ "inputs": "a" }), 404, "no model named `nope`"),
        ("/models/minilm/predict", json!({ "input": [[1.0, 2.0]] }), 400, "text"),
        ("/models/minilm/predict", json!({ "input": [] }), 400, "has no rows"),
        (
            "/v2/models/minilm/infer",
            json!({ "inputs": [{ "name": "text", "datatype": "FP32", "shape": [1], "data": [1.0] }] }),
            400,
            "BYTES",
        ),
        (
            "/v2/models/minilm/infer",
            json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [1], "data": [3] }] }),
            400,
            "string",
        ),
    ];
    for (path, body, status, expected) in cases {
        let r = server.post_json(path, &body).await;
        let got = r.status().as_u16();
        let json: Value = r.json().await.unwrap_or_else(|e| panic!("{path} {body}: not JSON: {e}"));
        let error = json["error"].as_str().unwrap_or_else(|| panic!("{path} {body}: no error: {json}"));
        assert_eq!(got, status, "{path} {body}: {error}");
        assert!(error.contains(expected), "{path} {body}: expected {expected:?} in {error:?}");
    }

    // OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
    let openai: Vec<(Value, u16, &str)> = vec![
        (json!({ "model": "minilm", "input": [] }), 400, "the input is empty"),
        (json!({ "model": "minilm", "input": "a", "dimensions": 1000 }), 400, "384-dimensional"),
        (json!({ "model": "minilm", "input": "a", "dimensions": 0 }), 400, "at least 1"),
        (json!({ "model": "minilm", "input": "a", "dimensions": -1 }), 400, "invalid embeddings request"),
        (json!({ "model": "minilm", "input": "a", "encoding_format": "hex" }), 400, "encoding_format"),
        (json!({ "model": "digits", "input": "a" }), 400, "does not embed text"),
        (json!({ "model": "nope", "input": "a" }), 404, "no model named `nope`"),
    ];
    for (body, status, expected) in openai {
        let r = server.post_json("/v1/embeddings", &body).await;
        let got = r.status().as_u16();
        let json: Value = r.json().await.expect("JSON");
        let error = json["error"]["message"].as_str().unwrap_or_else(|| panic!("{body}: no error.message: {json}"));
        assert_eq!(got, status, "{body}: {error}");
        assert!(json["error"]["type"].is_string(), "{json}");
        assert!(error.contains(expected), "{body}: expected {expected:?} in {error:?}");
    }

    // Binary BYTES that are not UTF-8.
    let (header, body) = v2_binary_texts(&[b"fine".as_slice(), b"\xff\xfe broken".as_slice()]);
    let r = server
        .client
        .post(server.url("/v2/models/minilm/infer"))
        .header("inference-header-content-length", header)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 400);
    let error: Value = r.json().await.expect("JSON");
    assert!(error["error"].as_str().expect("error").contains("element 1 is not UTF-8"), "{error}");

    // Still serving.
    assert_eq!(embed(&server, "minilm", json!({ "inputs": ["still here"] })).await.len(), 1);
}

#[tokio::test]
async fn bad_texts_never_fail_good_ones_in_the_same_burst() {
    let repo = text_repo(30_000);
    let server = TestServer::ready(repo.path(), &[], None).await;
    let texts = sentences();
    let expected = embed(&server, "minilm", json!({ "inputs": texts[..16] })).await;
    let bodies =
        (0..32).map(|i| if i % 2 == 0 { json!({ "inputs": [texts[i / 2]] }) } else { json!({ "inputs": ["ok", ""] }) });
    let answers = post_concurrently(&server, "minilm", bodies.collect()).await;
    for (i, (status, body)) in answers.iter().enumerate() {
        assert_eq!(*status, if i % 2 == 0 { 200 } else { 400 }, "{body}");
    }
    let got: Vec<Vec<f64>> = answers.iter().step_by(2).map(|(_, body)| rows(body).remove(0)).collect();
    for i in 0..16 {
        assert!(max_abs_diff(&got[i], &expected[i]) < 1e-5);
    }
}

#[tokio::test]
async fn every_protocol_gives_the_same_embedding() {
    let repo = text_repo(1000);
    let server = TestServer::ready(repo.path(), &[], None).await;
    let texts = ["A sentence to embed.", "Une phrase à plonger — 文章"];
    let tei = embed(&server, "minilm", json!({ "inputs": texts })).await;

    let r = server.post_json("/models/minilm/predict", &json!({ "input": texts })).await;
    assert_eq!(r.status(), 200);
    let predict = rows(&r.json::<Value>().await.expect("JSON")["prediction"]);

    let r = server.post_json("/v1/embeddings", &json!({ "model": "minilm", "input": texts })).await;
    assert_eq!(r.status(), 200);
    let openai: Value = r.json().await.expect("JSON");
    assert_eq!(openai["object"], "list");
    assert_eq!(openai["model"], "minilm");
    assert_eq!(openai["data"][1]["index"], 1);
    assert_eq!(openai["data"][1]["object"], "embedding");
    let tokens = openai["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(tokens > 8, "{tokens} tokens counted");
    assert_eq!(openai["usage"]["total_tokens"], tokens);
    let openai: Vec<Vec<f64>> = (0..2).map(|i| rows(&json!([openai["data"][i]["embedding"]])).remove(0)).collect();

    let r = server
        .post_json(
            "/v2/models/minilm/infer",
            &json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [2], "data": texts }] }),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v2: Value = r.json().await.expect("JSON");
    assert_eq!(v2["outputs"][0]["name"], "embedding");
    assert_eq!(v2["outputs"][0]["shape"], json!([2, 384]));
    let flat: Vec<f64> =
        v2["outputs"][0]["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("f")).collect();
    let v2: Vec<Vec<f64>> = flat.chunks(384).map(<[f64]>::to_vec).collect();

    // Unnormalised on request: same direction, not unit length.
    let raw = embed(&server, "minilm", json!({ "inputs": texts, "normalize": false })).await;
    for i in 0..2 {
        for other in [&predict[i], &openai[i], &v2[i]] {
            assert!(max_abs_diff(&tei[i], other) < 1e-6);
        }
        let n = norm(&raw[i]);
        assert!((n - 1.0).abs() > 0.01, "not normalised: norm {n}");
        let scaled: Vec<f64> = raw[i].iter().map(|x| x / n).collect();
        assert!(max_abs_diff(&tei[i], &scaled) < 1e-5);
    }

    // /health, v2 metadata and /v1/models describe the text models.
    let (_, health) = server.health().await;
    let minilm = health["models"].as_array().expect("models").iter().find(|m| m["name"] == "minilm").expect("minilm");
    assert_eq!(
        (&minilm["task"], &minilm["dimensions"], &minilm["max_seq_len"]),
        (&json!("embed"), &json!(384), &json!(256))
    );
    let meta: Value = server
        .client
        .get(server.url("/v2/models/minilm-int8"))
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(meta["inputs"], json!([{ "name": "text", "datatype": "BYTES", "shape": [-1] }]));
    assert_eq!(meta["outputs"], json!([{ "name": "embedding", "datatype": "FP32", "shape": [-1, 384] }]));
    assert_eq!(meta["parameters"], json!({ "task": "embed", "dimensions": 384, "max_seq_len": 256 }));
    let models: Value =
        server.client.get(server.url("/v1/models")).send().await.expect("answers").json().await.expect("JSON");
    let ids: Vec<&str> =
        models["data"].as_array().expect("data").iter().map(|m| m["id"].as_str().expect("id")).collect();
    assert_eq!(ids, ["minilm", "minilm-int8"]);
}

/// A KServe v2 binary body with one BYTES input `text`: the JSON header's length, and the whole body.
fn v2_binary_texts(texts: &[&[u8]]) -> (usize, Vec<u8>) {
    let mut data = Vec::new();
    for t in texts {
        data.extend_from_slice(&u32::try_from(t.len()).expect("short").to_le_bytes());
        data.extend_from_slice(t);
    }
    let header = json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [texts.len()],
        "parameters": { "binary_data_size": data.len() } }] })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend(data);
    (header.len(), body)
}

#[tokio::test]
async fn text_clients_hear_a_refused_key_in_their_own_error_shape() {
    let repo = text_repo(0);
    let server =
        TestServer::ready(repo.path(), &["--api-key", "s3cret", "--default-embed-model", "minilm"], None).await;
    let openai = json!({ "model": "minilm", "input": "hello" });
    for key in [None, Some("wrong")] {
        let mut request = server.client.post(server.url("/v1/embeddings")).json(&openai);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let r = request.send().await.expect("answered");
        assert_eq!(r.status(), 401);
        let body: Value = r.json().await.expect("JSON");
        // OpenAI's clients read `error.type` and `error.code` to tell a bad key from a bad request.
        assert_eq!(body["error"]["type"], "authentication_error", "{body}");
        assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("API key")), "{body}");

        let r = server.client.post(server.url("/embed")).json(&json!({ "inputs": "hello" }));
        let r = match key {
            Some(key) => r.bearer_auth(key),
            None => r,
        };
        let r = r.send().await.expect("answered");
        assert_eq!(r.status(), 401);
        let body: Value = r.json().await.expect("JSON");
        assert!(body["error"].as_str().is_some_and(|m| m.contains("API key")), "{body}");
        assert!(body["error_type"].is_string(), "TEI's shape: {body}");
    }
    let r = server.client.post(server.url("/v1/embeddings")).bearer_auth("s3cret").json(&openai).send().await;
    assert_eq!(r.expect("answered").status(), 200);
}
