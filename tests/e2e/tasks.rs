//! The tasks past embeddings end to end, and the routes that serve a model as its task says: sparse embeddings
//! (models/splade, a real SPLADE checkpoint, on candle and as an ONNX graph) and token classification (models/ner and
//! its ONNX graph), over TEI's routes, `POST /`, SageMaker's `/invocations`, Vertex AI's `/vertex` and
//! KServe v2; the defaults of routes without a model name; CORS; TEI's timing headers. The values themselves are
//! checked against float64 references by tests/python/test_tasks.py.

use inferd_tests::{heldout, Repo, TestServer};
use serde_json::{json, Value};

const TEXTS: [&str; 4] = [
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "GPUs",
    "Angela Merkel met Emmanuel Macron in Paris.",
];

async fn answer(server: &TestServer, path: &str, body: Value) -> Value {
    let r = server.post_json(path, &body).await;
    let status = r.status();
    let answer: Value = r.json().await.expect("JSON");
    assert_eq!(status, 200, "{path} {body}: {answer}");
    answer
}

async fn refused(server: &TestServer, path: &str, body: Value) -> (u16, String) {
    let r = server.post_json(path, &body).await;
    let status = r.status().as_u16();
    let answer: Value = r.json().await.expect("JSON");
    (status, answer["error"].as_str().unwrap_or_else(|| panic!("{path}: no error: {answer}")).to_owned())
}

/// A sparse answer `[[{index, value}]]` as (index, value) lists.
fn sparse(answer: &Value) -> Vec<Vec<(u64, f64)>> {
    let texts = answer.as_array().unwrap_or_else(|| panic!("a list per text: {answer}"));
    texts
        .iter()
        .map(|t| {
            let weights = t.as_array().expect("a list of weights");
            weights.iter().map(|w| (w["index"].as_u64().expect("index"), w["value"].as_f64().expect("value"))).collect()
        })
        .collect()
}

/// Whether two JSON lists of numbers agree within `tolerance`.
fn same_numbers(a: &Value, b: &Value, tolerance: f64) -> bool {
    let (a, b) = (a.as_array().expect("numbers"), b.as_array().expect("numbers"));
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.as_f64().expect("a number") - y.as_f64().expect("a number")).abs() < tolerance)
}

fn close(a: &[(u64, f64)], b: &[(u64, f64)], tolerance: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < tolerance)
}

#[tokio::test]
async fn sparse_embeddings_are_the_non_zero_weights_whatever_the_batch_or_engine() {
    let repo = Repo::new().bundled("splade").test_model("splade-onnx");
    let server = TestServer::ready(repo.path(), &[], None).await;
    for model in ["splade", "splade-onnx"] {
        let path = format!("/models/{model}/embed_sparse");
        let together = sparse(&answer(&server, &path, json!({ "inputs": TEXTS })).await);
        assert_eq!(together.len(), TEXTS.len());
        for (text, weights) in TEXTS.iter().zip(&together) {
            assert!(weights.windows(2).all(|w| w[0].0 < w[1].0), "by vocabulary index");
            assert!(weights.iter().all(|w| w.1 > 0.0) && !weights.is_empty(), "{text}: non-zero weights");
            let alone = sparse(&answer(&server, &path, json!({ "inputs": text })).await);
            assert!(close(&alone[0], weights, 1e-5), "{model}: padding changed {text}'s weights");
        }
        // The real model finds France's capital: the capital's and France's own tokens weigh the most.
        let mut first = together[0].clone();
        first.sort_by(|a, b| b.1.total_cmp(&a.1));
        let top: Vec<u64> = first.iter().take(2).map(|w| w.0).collect();
        assert_eq!(top, [3007, 2605], "{model}: `capital` and `france` first");
    }
    let candle = sparse(&answer(&server, "/models/splade/embed_sparse", json!({ "inputs": TEXTS })).await);
    let onnx = sparse(&answer(&server, "/models/splade-onnx/embed_sparse", json!({ "inputs": TEXTS })).await);
    assert!(candle.iter().zip(&onnx).all(|(a, b)| close(a, b, 1e-4)), "candle and ONNX Runtime agree");

    // KServe v2: the dense weights, the same values.
    let v2 = answer(
        &server,
        "/v2/models/splade/infer",
        json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [2], "data": &TEXTS[..2] }] }),
    )
    .await;
    let output = &v2["outputs"][0];
    assert_eq!((output["name"].as_str(), &output["shape"]), (Some("sparse_embedding"), &json!([2, 30522])));
    let values: Vec<f64> =
        output["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("a number")).collect();
    for (row, weights) in values.chunks(30522).zip(&candle) {
        let kept: Vec<(u64, f64)> =
            row.iter().enumerate().filter(|(_, v)| **v != 0.0).map(|(i, v)| (i as u64, *v)).collect();
        assert!(close(&kept, weights, 1e-6));
    }
}

#[tokio::test]
async fn token_classification_answers_entities_in_the_inference_apis_shape() {
    let repo = Repo::new().bundled("ner").test_model("ner-onnx");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let text = TEXTS[3];
    let tokens = answer(
        &server,
        "/models/ner",
        json!({ "inputs": text, "parameters": { "aggregation_strategy": "none", "ignore_labels": [] } }),
    )
    .await;
    let tokens = tokens.as_array().expect("a list of tokens");
    // Every real token, in order, with its label, position and span; special tokens left out.
    assert!(tokens.len() >= 9, "{tokens:?}");
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(token["index"], json!(i + 1), "positions count the first special token");
        assert!(token["entity"].is_string() && token.get("entity_group").is_none(), "{token}");
        let (start, end) =
            (token["start"].as_u64().expect("start") as usize, token["end"].as_u64().expect("end") as usize);
        let span: String = text.chars().skip(start).take(end - start).collect();
        assert_eq!(span.to_lowercase(), token["word"].as_str().expect("word").trim_start_matches("##"), "{token}");
    }
    for strategy in ["simple", "first", "average", "max"] {
        let body = json!({ "inputs": text, "parameters": { "aggregation_strategy": strategy } });
        let candle = answer(&server, "/models/ner", body.clone()).await;
        let groups = candle.as_array().expect("entities");
        assert!(groups
            .iter()
            .all(|g| g["entity_group"].is_string() && g.get("index").is_none() && g["entity_group"] != "O"));
        // The ONNX graph of the same weights finds the same entities.
        let onnx = answer(&server, "/models/ner-onnx", body).await;
        let key = |v: &Value| -> Vec<(Value, Value, Value, Value)> {
            let list = v.as_array().expect("entities");
            list.iter()
                .map(|e| (e["entity_group"].clone(), e["word"].clone(), e["start"].clone(), e["end"].clone()))
                .collect()
        };
        assert_eq!(key(&candle), key(&onnx), "{strategy}");
    }
    // A list of texts answers a list of lists; the default strategy is `simple`.
    let batch = answer(&server, "/models/ner", json!({ "inputs": [text, "GPUs"] })).await;
    let simple =
        answer(&server, "/models/ner", json!({ "inputs": text, "parameters": { "aggregation_strategy": "simple" } }))
            .await;
    assert_eq!(batch[0], simple);

    // KServe v2: each token's probabilities and each text's count of tokens.
    let v2 = answer(
        &server,
        "/v2/models/ner/infer",
        json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [2], "data": [text, "GPUs"] }] }),
    )
    .await;
    let outputs = v2["outputs"].as_array().expect("outputs");
    assert_eq!(outputs[0]["name"], "token_scores");
    assert_eq!(outputs[1]["name"], "token_count");
    let counts = outputs[1]["data"].as_array().expect("counts");
    assert_eq!(counts[0], json!(tokens.len() + 2), "special tokens included");
    let labels = outputs[0]["shape"][2].as_u64().expect("labels") as usize;
    let probabilities: Vec<f64> =
        outputs[0]["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("p")).collect();
    let first_text = &probabilities[..counts[0].as_u64().expect("count") as usize * labels];
    assert!(first_text.chunks(labels).all(|p| (p.iter().sum::<f64>() - 1.0).abs() < 1e-5), "each token's sum to 1");
}

#[tokio::test]
async fn each_route_serves_the_task_it_is_for_and_names_what_the_model_does() {
    let repo = Repo::new().bundled("minilm").bundled("splade").bundled("ner").bundled("classifier");
    let server = TestServer::ready(repo.path(), &["--default-embed-model", "minilm"], None).await;
    for (path, body, words) in [
        (
            "/models/minilm/embed_sparse",
            json!({ "inputs": "a" }),
            "model `minilm` does not give sparse embeddings: it embeds text",
        ),
        ("/models/splade/embed", json!({ "inputs": "a" }), "does not embed text: it gives sparse embeddings"),
        (
            "/models/ner/rerank",
            json!({ "query": "q", "texts": ["a"] }),
            "does not rerank text: it classifies the tokens",
        ),
        ("/models/classifier/embed_all", json!({ "inputs": "a" }), "does not embed text: it classifies text"),
        (
            "/models/ner",
            json!({ "inputs": "a", "parameters": { "aggregation_strategy": "grouped" } }),
            "`grouped` is not one of",
        ),
        ("/models/ner", json!({ "inputs": "a", "parameters": { "stride": 8 } }), "stride"),
        ("/models/ner", json!({ "inputs": [[101, 102]] }), "invalid token classification request"),
    ] {
        let (status, error) = refused(&server, path, body).await;
        assert_eq!(status, 400, "{path}: {error}");
        assert!(error.contains(words), "{path}: {error}");
    }
    // `POST /` serves what the model serves: its default text model here, and the named one under /models/{model}.
    let root = answer(&server, "/", json!({ "inputs": "a" })).await;
    assert_eq!(root.as_array().expect("embeddings")[0].as_array().expect("an embedding").len(), 384);
    let sparse = answer(&server, "/models/splade", json!({ "inputs": "a" })).await;
    assert!(sparse[0][0]["index"].is_u64());
    let classified = answer(&server, "/models/classifier", json!({ "inputs": "a" })).await;
    assert!(classified[0]["label"].is_string());

    // KServe v2's `dimensions` parameter: an embedder's first dimensions, renormalised; refused by any other model.
    let texts = |dimensions: Value| {
        json!({ "parameters": { "dimensions": dimensions },
                "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [1], "data": ["dynamic batching"] }] })
    };
    let short = answer(&server, "/v2/models/minilm/infer", texts(json!(64))).await;
    assert_eq!(short["outputs"][0]["shape"], json!([1, 64]));
    let norm: f64 =
        short["outputs"][0]["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("x").powi(2)).sum();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    for (model, dimensions, words) in [
        ("minilm", json!(0), "at least 1"),
        ("minilm", json!(400), "cannot lengthen"),
        ("minilm", json!(-1), "expected u64"),
        ("splade", json!(64), "the `dimensions` parameter shortens an embedding model's"),
    ] {
        let (status, error) = refused(&server, &format!("/v2/models/{model}/infer"), texts(dimensions)).await;
        assert_eq!(status, 400, "{error}");
        assert!(error.contains(words), "{model}: {error}");
    }
}

#[tokio::test]
async fn an_ambiguous_default_is_refused_alike_by_every_route_that_would_pick_it() {
    let repo = Repo::new().bundled("minilm").model("mpnet", "minilm", |t| t).bundled("reranker");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let (status, embed) = refused(&server, "/embed", json!({ "inputs": "a" })).await;
    assert_eq!(status, 400);
    assert!(embed.contains("`minilm`, `mpnet`") && embed.contains("--default-embed-model"), "{embed}");
    let (status, root) = refused(&server, "/", json!({ "inputs": "a" })).await;
    assert_eq!((status, &root), (400, &embed), "POST / picks no model /embed would not");
    let r = server.client.get(server.url("/info")).send().await.expect("answers");
    assert_eq!(r.status(), 400);
    let info: Value = r.json().await.expect("JSON");
    assert_eq!(info["error"], embed, "nor does /info");
    // The reranker is still the only one of its task, and OpenAI's body without a model has no default embedder.
    answer(&server, "/rerank", json!({ "query": "q", "texts": ["a", "b"] })).await;
    let r = server.post_json("/v1/embeddings", &json!({ "input": "a" })).await;
    assert_eq!(r.status(), 400);

    let chosen = TestServer::ready(repo.path(), &["--default-embed-model", "mpnet"], None).await;
    let info: Value = chosen.client.get(chosen.url("/info")).send().await.expect("answers").json().await.expect("JSON");
    assert_eq!(info["model_id"], "mpnet");
    let openai = answer(&chosen, "/embeddings", json!({ "input": "a", "dimensions": 16 })).await;
    assert_eq!(
        (&openai["model"], openai["data"][0]["embedding"].as_array().map(Vec::len)),
        (&json!("mpnet"), Some(16))
    );
}

#[tokio::test]
async fn sagemaker_and_vertex_serve_the_default_model_as_its_own_route_would() {
    let repo = Repo::new().bundled("minilm");
    let server = TestServer::ready(
        repo.path(),
        &["--aip-predict-route", "/v1/endpoints/7/deployedModels/8:predict", "--aip-health-route", "/isalive"],
        None,
    )
    .await;
    for probe in ["/ping", "/", "/isalive"] {
        let r = server.client.get(server.url(probe)).send().await.expect("answers");
        assert_eq!(r.status(), 200, "{probe}");
    }
    let embed = answer(&server, "/embed", json!({ "inputs": ["a", "b c"] })).await;
    let invoked = answer(&server, "/invocations", json!({ "inputs": ["a", "b c"] })).await;
    assert_eq!(invoked, embed);
    let instances =
        json!({ "instances": [{ "inputs": "a" }, { "inputs": ["b c"] }], "parameters": { "ignored": true } });
    for path in ["/vertex", "/v1/endpoints/7/deployedModels/8:predict"] {
        let vertex = answer(&server, path, instances.clone()).await;
        let predictions = vertex["predictions"].as_array().expect("predictions");
        assert_eq!(predictions.len(), 2, "{path}");
        for (prediction, want) in predictions.iter().zip(embed.as_array().expect("embeddings")) {
            // Each instance's own answer, one embedding; batched with the other instance, so equal to rounding.
            assert!(same_numbers(&prediction[0], want, 1e-6), "{path}: {prediction} against {want}");
        }
    }
    let r = server.post_json("/vertex", &json!({ "instances": [{ "inputs": "a" }, { "inputs": "" }] })).await;
    assert_eq!(r.status(), 400, "a bad instance fails the request, in its own words");
    assert!(r.text().await.expect("body").contains("text 0 is empty"));

    // A tensor model: `/invocations` is its `/predict`.
    let digits = Repo::new().bundled("digits");
    let server = TestServer::ready(digits.path(), &[], None).await;
    let body = json!({ "input": [heldout().pixels[0]] });
    assert_eq!(answer(&server, "/invocations", body.clone()).await, answer(&server, "/predict", body.clone()).await);
    let vertex = answer(&server, "/vertex", json!({ "instances": [body] })).await;
    assert!(vertex["predictions"][0]["prediction"].is_array(), "{vertex}");
}

#[tokio::test]
async fn cors_answers_preflights_for_the_origins_allowed_and_is_absent_when_off() {
    let repo = Repo::new().bundled("minilm");
    let on =
        TestServer::ready(repo.path(), &["--cors-allow-origin", "https://app.example", "--api-key", "k"], None).await;
    let off = TestServer::ready(repo.path(), &[], None).await;
    let preflight = |server: &TestServer, origin: &str| {
        server
            .client
            .request(reqwest::Method::OPTIONS, server.url("/embed"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization, content-type")
            .send()
    };
    let r = preflight(&on, "https://app.example").await.expect("answers");
    assert!(r.status().is_success(), "a preflight needs no API key");
    let headers = r.headers();
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    let methods = headers["access-control-allow-methods"].to_str().expect("ASCII").to_ascii_uppercase();
    assert!(methods.contains("POST") && methods.contains("GET"), "{methods}");
    let allowed = headers["access-control-allow-headers"].to_str().expect("ASCII").to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"), "{allowed}");
    let r = preflight(&on, "https://elsewhere.example").await.expect("answers");
    assert!(r.headers().get("access-control-allow-origin").is_none(), "another origin is not allowed");
    let r = on
        .client
        .post(on.url("/embed"))
        .header("origin", "https://app.example")
        .header("authorization", "Bearer k")
        .json(&json!({ "inputs": "a" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(
        (r.status().as_u16(), &r.headers()["access-control-allow-origin"]),
        (200, &"https://app.example".parse().expect("header"))
    );

    let r = preflight(&off, "https://app.example").await.expect("answers");
    assert!(r.headers().get("access-control-allow-origin").is_none(), "off by default");
    let r = off
        .client
        .post(off.url("/embed"))
        .header("origin", "https://app.example")
        .json(&json!({ "inputs": "a" }))
        .send();
    assert!(r.await.expect("answers").headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn text_answers_carry_teis_timing_headers() {
    let repo = Repo::new().bundled("minilm").bundled("reranker");
    let server = TestServer::ready(repo.path(), &["--default-embed-model", "minilm"], None).await;
    let headers = |r: &reqwest::Response| {
        [
            "x-compute-time",
            "x-tokenization-time",
            "x-queue-time",
            "x-inference-time",
            "x-compute-tokens",
            "x-compute-characters",
        ]
        .map(|h| r.headers().get(h).map(|v| v.to_str().expect("ASCII").parse::<u64>().expect("a whole number")))
    };
    let r = server.post_json("/embed", &json!({ "inputs": ["GPUs", "a b"] })).await;
    let [compute, tokenization, queue, inference, tokens, characters] = headers(&r).map(|h| h.expect("present"));
    let tokenized = answer(&server, "/tokenize", json!({ "inputs": ["GPUs", "a b"] })).await;
    let counted: usize = tokenized.as_array().expect("texts").iter().map(|t| t.as_array().expect("tokens").len()).sum();
    assert_eq!((tokens, characters), (counted as u64, 7), "special tokens included; 4 + 3 characters");
    assert!(compute >= tokenization + queue + inference, "{compute} against its parts");
    let r = server.post_json("/rerank", &json!({ "query": "q", "texts": ["a"] })).await;
    assert!(headers(&r).iter().all(Option::is_some));
    let r = server.post_json("/tokenize", &json!({ "inputs": "a" })).await;
    assert!(headers(&r).iter().all(Option::is_none), "only on inference");
}
