"""What models cost and whether they fit: /health and /metrics report each model's weights and the process's
resident memory; a model whose weights and working set do not fit in the memory left is refused at load, with a
message that says so, while the others serve; and the ONNX Runtime settings that keep memory low
(`fold_constants`, `cpu_arena`) give the same answers as the ones that do not.

How much memory the server holds idle and after a load is a benchmark's question (benches/memory.sh), not these."""

import json
import pathlib
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import ROOT, start_inferd

TEXTS = ["the server gives memory back", "int8 weights stay int8", "a third, longer sentence about batching " * 4]


def get_json(url):
    """The JSON body, whatever the status (/health says 503 while a model has failed)."""
    try:
        with urllib.request.urlopen(url) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def post_json(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as r:
        return json.load(r)


def copy_model(source, target, extra):
    """A copy of a bundled model's folder (its files linked) whose model.toml ends with `extra`."""
    target.mkdir()
    for f in source.iterdir():
        if f.name != "model.toml":
            (target / f.name).symlink_to(f)
    toml = (source / "model.toml").read_text()
    (target / "model.toml").write_text(toml.replace('"../minilm/', f'"{ROOT}/models/minilm/') + "\n" + extra)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("memory")
    for name in ("digits", "minilm"):
        (repo / name).symlink_to(ROOT / "models" / name)
    copy_model(ROOT / "models" / "minilm-int8", repo / "int8", "")
    copy_model(ROOT / "models" / "minilm-int8", repo / "int8-folded", "[onnx]\nfold_constants = true\ncpu_arena = true\n")
    copy_model(ROOT / "models" / "digits", repo / "huge", "[memory]\nworking_set = 1000000000000000\n")
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with start_inferd(repository, "--strict-readiness", "false") as address:
        yield f"http://{address}"


def test_health_and_metrics_report_weights_and_resident_memory(server):
    health = get_json(f"{server}/health")
    models = {m["name"]: m for m in health["models"]}
    int8_file = (ROOT / "models" / "minilm-int8" / "model.onnx").stat().st_size
    # The int8 graph's initializers as stored: the file less its graph and names.
    assert 0.97 * int8_file < models["int8"]["weight_bytes"] <= int8_file
    assert models["int8-folded"]["weight_bytes"] == models["int8"]["weight_bytes"]
    # Candle holds the safetensors file's tensors in FP32, as stored: the file less its header.
    candle_file = (ROOT / "models" / "minilm" / "model.safetensors").stat().st_size
    assert 0.99 * candle_file < models["minilm"]["weight_bytes"] < candle_file
    assert 0 < models["digits"]["weight_bytes"] < 40_000
    assert all("device_memory_bytes" not in m for m in health["models"]), "no GPU here"
    rss = health["process_resident_memory_bytes"]
    assert rss > models["minilm"]["weight_bytes"], "the process holds at least MiniLM's weights"
    metrics = urllib.request.urlopen(f"{server}/metrics").read().decode()
    assert f'inferd_model_weight_bytes{{model="int8"}} {models["int8"]["weight_bytes"]}' in metrics
    assert f'inferd_model_weight_bytes{{model="minilm"}} {models["minilm"]["weight_bytes"]}' in metrics
    resident = [line for line in metrics.splitlines() if line.startswith("process_resident_memory_bytes ")]
    assert len(resident) == 1 and 0.5 * rss < float(resident[0].split()[1]) < 2 * rss


def test_a_model_that_does_not_fit_is_refused_at_load_and_the_others_serve(server):
    models = {m["name"]: m for m in get_json(f"{server}/health")["models"]}
    huge = models["huge"]
    assert huge["state"] == "failed" and not huge["ready"]
    assert "host memory" in huge["error"] and "working_set" in huge["error"], huge["error"]
    assert "available" in huge["error"], huge["error"]
    assert "weight_bytes" not in huge
    with pytest.raises(urllib.error.HTTPError) as refused:
        post_json(f"{server}/models/huge/predict", {"input": [[0.0] * 64]})
    assert refused.value.code in (400, 404, 503)
    assert json.load(refused.value)["error"]
    answer = post_json(f"{server}/models/digits/predict", {"input": [[0.0] * 64]})
    assert len(answer["prediction"][0]) == 10


def test_int8_weights_kept_narrow_give_the_answers_of_folded_ones(server):
    kept = np.array(post_json(f"{server}/models/int8/embed", {"inputs": TEXTS}))
    folded = np.array(post_json(f"{server}/models/int8-folded/embed", {"inputs": TEXTS}))
    assert kept.shape == (3, 384)
    np.testing.assert_allclose(kept, folded, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(kept, axis=1), 1.0, atol=1e-5)
