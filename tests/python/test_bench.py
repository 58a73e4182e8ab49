"""inferd-bench, the load generator of benches/, against a real inferd: each protocol and loop mode produces a JSON
report and its plots; engine-only mode measures a model in-process."""

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = os.environ.get("INFERD_BENCH_BIN", str(ROOT / "target" / "debug" / "inferd-bench"))


def run(*args):
    result = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("protocol", ["predict", "v2-json", "v2-binary"])
def test_a_closed_loop_sweep_reports_and_plots(server_url, tmp_path, protocol):
    table = run("http", "--url", f"http://{server_url}", "--model", "digits", "--protocol", protocol, "--rows", "2",
                "--sweep", "1,4", "--warmup", "0.2", "--duration", "0.5", "--quiet", "--out", str(tmp_path),
                "--name", "run")
    assert "req/s" in table
    reports = json.loads((tmp_path / "run.json").read_text())
    assert [r["concurrency"] for r in reports] == [1, 4]
    for r in reports:
        assert r["requests_ok"] > 0 and r["errors"] == {}, r
        assert r["rows_per_s"] == pytest.approx(2 * r["throughput_rps"])
        assert 0 < r["latency_us"]["p50"] <= r["latency_us"]["p99"] <= r["latency_us"]["max"]
        assert r["mean_batch_rows"] >= 2
        assert r["cdf"][-1][1] == 1.0
    for plot in ["run-cdf.svg", "run-throughput.svg", "run-p99.svg"]:
        svg = (tmp_path / plot).read_text()
        assert svg.startswith("<svg") and "<polyline" in svg


def test_the_rerank_protocol_scores_every_passage_and_the_engine_runs_its_pairs(server_url, tmp_path):
    run("http", "--url", f"http://{server_url}", "--model", "reranker", "--protocol", "rerank", "--rows", "5",
        "--concurrency", "4", "--warmup", "0.2", "--duration", "0.5", "--quiet", "--out", str(tmp_path),
        "--name", "rerank")
    [report] = json.loads((tmp_path / "rerank.json").read_text())
    # The server refuses a malformed rerank body with a 4xx, which the report would count as an error.
    assert report["requests_ok"] > 0 and report["errors"] == {}, report
    assert report["protocol"] == "rerank" and report["rows_per_request"] == 5
    run("engine", "--model-dir", str(ROOT / "models" / "reranker"), "--batch-sizes", "16", "--warmup", "0.1",
        "--duration", "0.3", "--out", str(tmp_path), "--name", "engine-rerank")
    [engine] = json.loads((tmp_path / "engine-rerank.json").read_text())
    assert engine["calls"] > 0 and 1.0 <= engine["padding_waste"] < 1.5, engine


def test_the_image_protocol_sends_a_picture_and_the_engine_runs_its_tensor(server_url, tmp_path):
    picture = ROOT / "tests" / "data" / "photos" / "rocket.jpg"
    run("http", "--url", f"http://{server_url}", "--model", "orientation", "--protocol", "image", "--body",
        str(picture), "--concurrency", "2", "--warmup", "0.2", "--duration", "0.5", "--quiet", "--out", str(tmp_path),
        "--name", "image")
    [report] = json.loads((tmp_path / "image.json").read_text())
    # A picture the server could not read would be a 400, counted as an error.
    assert report["requests_ok"] > 0 and report["errors"] == {}, report
    run("engine", "--model-dir", str(ROOT / "models" / "orientation"), "--picture", str(picture), "--batch-sizes",
        "2", "--warmup", "0.1", "--duration", "0.3", "--onnxruntime-lib",
        str(ROOT / ".cache/onnxruntime/libonnxruntime.so.1.31.1"), "--out", str(tmp_path), "--name", "engine-image")
    [engine] = json.loads((tmp_path / "engine-image.json").read_text())
    assert engine["calls"] > 0 and engine["prepare_ms"] > 0, engine


def test_an_open_loop_counts_errors_by_status(server_url, tmp_path):
    # A body the model refuses: every answer is a 400, counted, none is mistaken for a success.
    body = tmp_path / "bad.json"
    body.write_text(json.dumps({"input": [[1.0, 2.0]]}))
    run("http", "--url", f"http://{server_url}", "--model", "digits", "--body", str(body), "--rate", "200",
        "--warmup", "0", "--duration", "0.5", "--quiet", "--out", str(tmp_path), "--name", "open")
    [report] = json.loads((tmp_path / "open.json").read_text())
    assert report["rate"] == 200 and report["concurrency"] is None
    assert report["requests_ok"] == 0
    assert 80 <= report["errors"]["400"] <= 101, report["errors"]


def test_engine_mode_measures_the_model_in_process(tmp_path):
    run("engine", "--model-dir", str(ROOT / "models" / "digits"), "--batch-sizes", "1,8", "--warmup", "0.1",
        "--duration", "0.3", "--onnxruntime-lib", str(ROOT / ".cache/onnxruntime/libonnxruntime.so.1.31.1"),
        "--out", str(tmp_path), "--name", "engine")
    reports = json.loads((tmp_path / "engine.json").read_text())
    assert [r["batch_size"] for r in reports] == [1, 8]
    assert all(r["calls"] > 0 and r["rows_per_s"] > 0 for r in reports)


def test_a_closed_loop_against_nothing_counts_connection_errors_and_finishes(tmp_path):
    # A port nobody listens on: each client's connection fails, is counted as status 0, and is tried again
    # after a pause; the run ends on time with no success.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = tmp_path / "body.json"
    body.write_text("{}")
    run("http", "--url", f"http://127.0.0.1:{port}", "--model", "digits", "--body", str(body), "--path", "/predict",
        "--concurrency", "4", "--warmup", "0", "--duration", "0.5", "--quiet", "--out", str(tmp_path),
        "--name", "nothing")
    [report] = json.loads((tmp_path / "nothing.json").read_text())
    assert report["requests_ok"] == 0
    # 4 clients, one try per 10 ms pause each: about 200 in 0.5 s, not a busy loop of thousands.
    assert 20 <= report["errors"]["0"] <= 400, report["errors"]
