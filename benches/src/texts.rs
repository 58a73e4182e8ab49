//! The text benchmarks' fixed set of sentences, from one word to a paragraph (3 to about 120 tokens), and their
//! request bodies: sentences to embed, and queries with passages to rerank.

use bytes::Bytes;
use serde_json::json;

use crate::bodies::Body;

/// Mixed lengths, as an embedding service sees them: queries, titles, sentences and passages.
pub const SENTENCES: &[&str] = &[
    "GPUs",
    "What is dynamic batching?",
    "The quick brown fox jumps over the lazy dog.",
    "How do I deploy a model to Azure Kubernetes Service?",
    "Inference servers group concurrent requests into batches to keep the accelerator busy.",
    "naïve café résumé",
    "Sentence embeddings map a text to a vector whose cosine similarity with other vectors reflects meaning, so \
     that search, clustering and deduplication can work on meaning rather than on words.",
    "Best pizza near me",
    "The model was exported to ONNX with dynamic batch and sequence axes, then quantized to int8.",
    "Zürich, Genève and Lugano are three of the largest cities of Switzerland.",
    "error: could not compile `inferd` due to 2 previous errors",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, \
     it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of \
     Darkness, it was the spring of hope, it was the winter of despair.",
    "Thanks!",
    "Padding a batch to its longest sequence wastes compute on the shorter ones.",
    "Which GPU has the most memory?",
    "A tokenizer splits text into word pieces from a fixed vocabulary, adding the special tokens the model expects \
     at the start and at the end of every sequence, and cutting sequences longer than the model takes.",
    "Return policy",
    "The weather in Seattle is rainy for most of the year, but the summers are dry and mild.",
    "東京は日本の首都です。",
    "Rust gives memory safety without a garbage collector.",
    "Customers who bought this item also bought a charger, a case and a screen protector.",
    "ok",
    "Kubernetes restarts a container whose liveness probe fails, and stops sending it traffic while its readiness \
     probe fails; a slow model load therefore needs a startup probe with a generous threshold, or the pod is \
     killed before it ever serves.",
    "Is the service up?",
];

/// `count` TEI-style bodies of `rows` sentences each, going round the set so that consecutive requests differ.
pub fn bodies(rows: usize, count: usize) -> anyhow::Result<Vec<Body>> {
    (0..count)
        .map(|b| {
            let texts: Vec<&str> = (0..rows).map(|i| SENTENCES[(b * rows + i) % SENTENCES.len()]).collect();
            Ok(Body { bytes: Bytes::from(serde_json::to_vec(&json!({ "inputs": texts }))?), header_length: None })
        })
        .collect()
}

/// The reranking benchmark's queries: the set's short sentences, as a search box sends them.
fn queries() -> Vec<&'static str> {
    SENTENCES.iter().copied().filter(|s| s.chars().count() <= 60).collect()
}

/// Request `b` of the reranking benchmark: a query and `passages` passages, both going round their sets so that
/// consecutive requests differ.
pub fn rerank_request(b: usize, passages: usize) -> (&'static str, Vec<&'static str>) {
    let queries = queries();
    let query = queries[b % queries.len()];
    (query, (0..passages).map(|i| SENTENCES[(b * passages + i) % SENTENCES.len()]).collect())
}

/// `count` TEI `/rerank` bodies of a query and `passages` passages each, asking for the sigmoid scores.
pub fn rerank_bodies(passages: usize, count: usize) -> anyhow::Result<Vec<Body>> {
    (0..count)
        .map(|b| {
            let (query, texts) = rerank_request(b, passages);
            let body = json!({ "query": query, "texts": texts, "raw_scores": false });
            Ok(Body { bytes: Bytes::from(serde_json::to_vec(&body)?), header_length: None })
        })
        .collect()
}
