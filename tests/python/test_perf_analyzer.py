"""Triton's own load generator, perf_analyzer (installed by scripts/fetch-perf-analyzer.sh into
.cache/perf-analyzer/), against a real inferd over gRPC: unary `ModelInfer` and `ModelStreamInfer` (`--streaming`)
on digits for a short window. perf_analyzer calls ModelMetadata, ModelConfig, ServerMetadata and, since inferd
advertises the statistics extension, ModelStatistics around each window before it sends any load, so a run that
exits 0 with a throughput also covers those. The statistics Triton's gRPC client reads must have grown by at least
the requests perf_analyzer measured.

A missing perf_analyzer is a failure, unless INFERD_SKIP_PERF_ANALYZER=1 (then these tests are skipped)."""

import csv
import os
import re
import subprocess

import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, start_inferd

PERF_ANALYZER = ROOT / ".cache" / "perf-analyzer" / "bin" / "perf_analyzer"


@pytest.fixture(scope="module")
def grpc_address():
    if not PERF_ANALYZER.exists():
        if os.environ.get("INFERD_SKIP_PERF_ANALYZER") == "1":
            pytest.skip(f"INFERD_SKIP_PERF_ANALYZER=1 and no {PERF_ANALYZER}")
        pytest.fail(f"no {PERF_ANALYZER}: run scripts/fetch-perf-analyzer.sh (or set INFERD_SKIP_PERF_ANALYZER=1)")
    with start_inferd(ROOT / "models" / "digits", grpc=True) as (_, grpc_address):
        yield grpc_address


def queued(client):
    """Requests of digits whose batch started, as Triton's statistics give them."""
    (stats,) = client.get_inference_statistics("digits").model_stats
    return stats.inference_stats.queue.count


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
def test_perf_analyzer_loads_inferd_over_grpc(grpc_address, tmp_path, streaming):
    client = grpcclient.InferenceServerClient(grpc_address)
    before = queued(client)
    report = tmp_path / "report.csv"
    # --stability-percentage 1000: the run measures three windows whatever their spread. With the check on, a run
    # that stays unstable for 10 windows (a busy machine) exits 2 and writes no CSV.
    args = [str(PERF_ANALYZER), "-m", "digits", "-i", "grpc", "-u", grpc_address, "--concurrency-range", "4:4",
            "--measurement-interval", "1000", "--stability-percentage", "1000", "--input-data", "zero",
            "-f", str(report)] + (["--streaming"] if streaming else [])
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    with report.open() as f:
        (row,) = csv.DictReader(f)
    assert row["Concurrency"] == "4"
    assert float(row["Inferences/Second"]) > 0, row
    assert 0 < int(row["p50 latency"]) <= int(row["p99 latency"]), row
    measured = int(re.search(r"Request count: (\d+)", output).group(1))
    assert measured > 0, output
    grew = queued(client) - before
    assert grew >= measured, f"statistics grew by {grew}, perf_analyzer measured {measured} requests\n{output}"
    # Its server-side line splits the compute into input, infer and output, from the statistics' three steps.
    server = re.search(r"compute input (\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec", output)
    assert server, output
    (stats,) = client.get_inference_statistics("digits").model_stats
    steps = stats.inference_stats
    assert steps.compute_input.ns > 0 and steps.compute_infer.ns > 0 and steps.compute_output.ns > 0, steps
    print(f"perf_analyzer, server side: {server.group(0)}")
