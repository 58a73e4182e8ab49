#!/usr/bin/env python3
"""The GPU check: runs inferd's GPU paths on a machine with an NVIDIA GPU, from the bundle that
scripts/gpu-bundle.sh made, and ends with one table. Exit status 1 when any check failed.

Started by gpu-check.sh (in the bundle's root, beside this file). Standard library only: the GPU machine has a
Python but no network and no Rust toolchain.

  1. nvidia-smi, and the CUDA libraries the binaries need: the driver's, and cuBLAS/cuRAND/NVRTC from the
     machine's Python site-packages (NVIDIA's wheels) or LD_LIBRARY_PATH; `ldd -r` proves every symbol resolves
     to a real library, never to a link stub.
  2. The GPU test executables (device selection, precision casts, GPU memory limits, NVML against nvidia-smi).
  3. `inferd serve` on a repository of CPU and `device = "cuda:0"` variants of the bundled models:
     (a) /health names the GPU, its memory and driver as nvidia-smi does, and GPU memory grew as models loaded;
     (b) every GPU variant's outputs agree with the CPU's within its precision's tolerance;
     (c) `inferd-bench engine` throughput at batch 1, 8, 64, 256 in each precision;
     (d) HTTP at 64 clients, with the GPU's busy percentage sampled through nvidia-smi (NVML) during the run.
  4. ONNX Runtime's CUDA execution provider, where an onnxruntime-gpu >= 1.31 is installed on the machine.
"""

import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

# 1 and 2, the machine's part (its libraries and test executables), beside this file; benches/gpu_*.py reach these
# through this module too.
import gpu_cudashm
from gpu_machine import (Sampler, check_links, cpu_seconds, find_libraries, onnxruntime_gpu, process_gpu_mib, run,
                         run_tests, smi)

MIB = 1 << 20
# Largest |gpu - cpu| over the largest |cpu| output a precision may give on the digits network.
DIGITS_TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
# Smallest cosine between a GPU and the CPU embedding of the same text.
MINILM_COSINE = {"fp32": 0.99999, "fp16": 0.999}
# Smallest cosine between a GPU and the CPU sparse embedding (as dense vectors) of the same text.
SPLADE_COSINE = {"fp32": 0.99999, "fp16": 0.999}
# Largest |gpu - cpu| of a token's label probability.
NER_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}
# The transformer architectures past BERT's family (tests/data/architectures: tiny models of each), and the smallest
# cosine between a text's vector on the GPU and in FP32 (the GPU's FP32 against the CPU's).
ARCHITECTURES = ("mpnet", "modernbert", "nomic", "gte", "qwen3")
ARCHITECTURE_COSINE = {"fp32": 0.99999, "fp16": 0.999, "bf16": 0.999}
# CLIP and SigLIP, tiny (tests/data/clip), and the photos they embed (from tests/data/photos).
CLIPS = ("clip", "siglip")
CLIP_PHOTOS = {"rocket.jpg": "image/jpeg", "camera.png": "image/png"}
FIGURE = "figure"


class Plan:
    """What the check runs. A rehearsal (`--rehearse`, for the test command on a machine without a GPU) runs the
    same steps with the CPU build, `cpu` in place of `cuda:0`, and short runs; what needs a GPU is "not run"."""

    def __init__(self, rehearse):
        self.rehearse = rehearse
        self.gpu = "cpu" if rehearse else "cuda:0"
        self.engine_batches = "1,8" if rehearse else "1,8,64,256"
        self.engine_seconds = ("0.2", "0.5") if rehearse else ("1", "2")
        self.http_seconds = (0.5, 2) if rehearse else (2, 10)
        # FP16 text on a CPU is slow: a rehearsal's few clients still see answers within its short run.
        self.clients = 4 if rehearse else 64
SENTENCES = [
    "What is dynamic batching?",
    "A GPU inference server groups concurrent requests into batches per model.",
    "GPUs",
    "The quick brown fox jumps over the lazy dog.",
    "Wie spät ist es? Es ist halb acht.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "Emoji 🚀 and punctuation!!! ... ???",
    "x",
    " ".join(["Long inputs are cut at the model's maximum sequence length of two hundred and fifty-six tokens."] * 20),
]


class Table:
    """The rows of the final table: check, subject, result (pass, FAIL, not run), figure."""

    def __init__(self):
        self.rows = []

    def add(self, check, subject, ok, figure):
        """`ok`: True (pass), False (FAIL), None (not run), or FIGURE for a row that only reports."""
        result = {None: "not run", FIGURE: "figure"}.get(ok) or ("pass" if ok else "FAIL")
        self.rows.append((check, subject, result, figure))
        print(f"gpu-check: {check} | {subject} | {result} | {figure}", flush=True)
        return ok

    def failed(self):
        return any(r[2] == "FAIL" for r in self.rows)

    def markdown(self):
        lines = ["| check | subject | result | figure |", "| --- | --- | --- | --- |"]
        lines += [f"| {c} | {s} | {r} | {f} |" for c, s, r, f in self.rows]
        return "\n".join(lines)


# 3. The server.

def variant(src, dst, device, precision):
    """A copy of model folder `src` at `dst` (links to its files) with `device` and `precision` set."""
    os.makedirs(dst)
    for entry in os.listdir(src):
        if entry != "model.toml":
            os.symlink(os.path.join(src, entry), os.path.join(dst, entry))
    kept, top = [], True
    for line in open(os.path.join(src, "model.toml")).read().splitlines():
        top = top and not line.lstrip().startswith("[")
        if top and re.match(r"\s*(device|precision|instances)\s*=", line):
            continue
        kept.append(line)
    with open(os.path.join(dst, "model.toml"), "w") as f:
        f.write(f'device = "{device}"\nprecision = "{precision}"\ninstances = 1\n' + "\n".join(kept) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(base, path, body=None, timeout=60, content_type="application/json"):
    """POSTs `body` (JSON, or bytes as `content_type`; GETs without one); returns (status, the answer's JSON)."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, headers={"content-type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, body


class Server:
    def __init__(self, bundle, repo, env, results, onnxruntime_lib):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(results, "server.log"), "w")
        cmd = [os.path.join(bundle, "bin", "inferd"), "serve", "--models", repo, "--host", "127.0.0.1",
               "--port", str(self.port), "--gpu-refresh-ms", "500", "--max-rows", "4096", "--allow-client-shm"]
        if onnxruntime_lib:
            cmd += ["--onnxruntime-lib", onnxruntime_lib]
        # candle's debug lines say where the GPU's memory went at each step of a load (server.log).
        env = dict(env, INFERD_LOG=env.get("INFERD_LOG", "info,ort=warn,inferd_candle=debug"))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_loaded(self, timeout):
        """Waits until every model has loaded or failed; returns what went wrong, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                tail = open(self.log.name, errors="replace").read().strip().splitlines()[-3:]
                return f"inferd exited with {self.proc.returncode}: " + " / ".join(tail)
            try:
                health = http(self.base, "/health", timeout=5)[1]
                states = {m["name"]: (m["state"], m.get("error")) for m in health["models"]}
            except (OSError, TypeError, KeyError):
                states = {}
            if states and all(state != "loading" for state, _ in states.values()):
                failed = [f"{name}: {error.splitlines()[0]}" for name, (state, error) in states.items()
                          if state != "ready"]
                return "; ".join(failed) or None
            time.sleep(0.5)
        return f"the models were still loading after {timeout} s"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def check_health(table, server, models, baseline_used_mib):
    """(a); with no baseline (a rehearsal), only the models' devices and precisions."""
    status, health = http(server.base, "/health")
    if status != 200 or not isinstance(health, dict):
        return table.add("health", "/health", False, f"answered {status}: {str(health)[:200]}")
    check_models(table, health, models)
    if baseline_used_mib is None:
        return
    if not health.get("gpus"):
        return table.add("health", "GPU 0", False, f"/health lists no GPU: {str(health)[:200]}")
    want = smi("name,uuid,memory.total,driver_version")
    gpu = health["gpus"][0]
    got = {"name": gpu["name"], "uuid": gpu["uuid"], "memory.total": str(gpu["memory_total_bytes"] // MIB),
           "driver_version": gpu["driver_version"]}
    same = got == want and health.get("gpu_available") is True
    table.add("health", "GPU 0 vs nvidia-smi", same,
              f"{got['name']}, {got['memory.total']} MiB, driver {got['driver_version']}" if same
              else f"/health {got} vs nvidia-smi {want}")
    # The snapshot refreshes every 500 ms: wait for one taken after the models loaded.
    grown = 0
    for _ in range(20):
        used = http(server.base, "/health")[1]["gpus"][0]["memory_used_bytes"] // MIB
        grown = used - baseline_used_mib
        if grown >= 64:
            break
        time.sleep(0.5)
    table.add("health", "GPU memory used", grown >= 64,
              f"{baseline_used_mib} MiB before inferd, {baseline_used_mib + grown} MiB with its models (+{grown})")


def report_memory(table, server, plan, stage, only=None):
    """What each model (or `only`) holds as /health reports it once warm (weights; on a GPU, the device memory its
    load and warm-up took), and the process's resident and GPU memory: a figure per model, checked for presence."""
    health = http(server.base, "/health")[1]
    models = [m for m in health.get("models", []) if m.get("state") == "ready" and (only is None or m["name"] == only)]
    gpu_mib = None if plan.rehearse else process_gpu_mib(server.proc.pid)
    for m in models:
        on_gpu = (m.get("device") or "").startswith("cuda")
        device = m.get("device_memory_bytes")
        figure = f"weights {m.get('weight_bytes', 0) / MIB:.1f} MiB"
        if on_gpu:
            figure += f", device memory at load {device / MIB:.1f} MiB" if device is not None else ", no device figure"
        ok = "weight_bytes" in m and (not on_gpu or plan.rehearse or device is not None)
        table.add(f"memory {stage}", m["name"], ok, figure)
    rss = health.get("process_resident_memory_bytes") or 0
    process = f"process RSS {rss / MIB:.0f} MiB" + (f", GPU {gpu_mib} MiB (nvidia-smi)" if gpu_mib is not None else "")
    table.add(f"memory {stage}", only or "inferd", FIGURE, process)
    return gpu_mib


def settle(server):
    """Waits for the idle models' release (12 s after the last request) and for the process's GPU memory to stop
    falling; returns it."""
    time.sleep(12)
    held = process_gpu_mib(server.proc.pid)
    for _ in range(10):
        time.sleep(1)
        now = process_gpu_mib(server.proc.pid)
        if now is None or held is None or now >= held:
            return now if held is None else held
        held = now
    return held


def check_rest(table, server, warm_mib, rested_mib, loaded_mib):
    """Once the loads stop, each worker gives back its engine's cached memory after `release_after_idle_ms`
    (default 10 s): waits up to 30 s for the process's GPU memory to come back within 10 % of what it held after
    warm-up (the memory goal's line for resting after a load) and to keep no more than a quarter of what the loads
    grew (8 MiB at least) from what it held at rest before them (`rested_mib`: kernels the output checks loaded
    into the context stay), which it would keep without the release."""
    base = warm_mib if rested_mib is None else rested_mib
    grown = loaded_mib - base

    def rested_ok(mib):
        return mib is not None and mib <= warm_mib * 1.10 and mib - base <= max(8, grown / 4)

    started = time.monotonic()
    rested = process_gpu_mib(server.proc.pid)
    while not rested_ok(rested) and time.monotonic() - started < 30:
        time.sleep(1)
        rested = process_gpu_mib(server.proc.pid)
    waited = time.monotonic() - started
    figure = (f"GPU {rested} MiB within {waited:.0f} s of the loads' end ({loaded_mib} MiB then, {base} MiB at rest "
              f"before them, {warm_mib} MiB after warm-up; at most +10 % of warm-up and a quarter of the loads' "
              f"growth)")
    if grown < 8 and rested_ok(rested):
        table.add("memory at rest", "inferd", FIGURE, figure + f"; the loads grew it by {grown} MiB only")
    else:
        table.add("memory at rest", "inferd", rested_ok(rested), figure)


def check_models(table, health, models):
    by_name = {m["name"]: m for m in health["models"]}
    wrong = [f"{name}: {by_name.get(name)}" for name, (device, precision) in models.items()
             if not by_name.get(name, {}).get("ready") or by_name[name]["device"] != device
             or by_name[name]["precision"] != precision]
    table.add("health", "models ready where configured", not wrong,
              "; ".join(wrong)[:300] if wrong else f"{len(models)} models")


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)) or 1.0)


def check_outputs(table, server, pixels, gpu_models, cpu_model, kind):
    """(b): each GPU variant against the CPU one, on the same inputs."""
    if kind == "digits":
        status, cpu = http(server.base, f"/models/{cpu_model}/predict", {"input": pixels})
    else:
        status, cpu = http(server.base, f"/models/{cpu_model}/embed", {"inputs": SENTENCES})
    if status != 200:
        return table.add("outputs", cpu_model, False, f"{status}: {str(cpu)[:200]}")
    for model, precision in gpu_models:
        if kind == "digits":
            status, got = http(server.base, f"/models/{model}/predict", {"input": pixels})
            if status != 200:
                table.add("outputs", model, False, f"{status}: {str(got)[:200]}")
                continue
            want, got = cpu["prediction"], got["prediction"]
            scale = max(abs(v) for row in want for v in row)
            error = max(abs(g - w) for gr, wr in zip(got, want) for g, w in zip(gr, wr)) / scale
            same_class = sum(gr.index(max(gr)) == wr.index(max(wr)) for gr, wr in zip(got, want))
            tolerance = DIGITS_TOLERANCE[precision]
            table.add("outputs", f"{model} vs {cpu_model}", error <= tolerance and len(got) == len(want),
                      f"max error {error:.1e} of the largest output (tolerance {tolerance:.0e}); same digit "
                      f"{same_class}/{len(want)}")
        else:
            status, got = http(server.base, f"/models/{model}/embed", {"inputs": SENTENCES})
            if status != 200:
                table.add("outputs", model, False, f"{status}: {str(got)[:200]}")
                continue
            worst = min(cosine(g, w) for g, w in zip(got, cpu))
            floor = MINILM_COSINE[precision]
            table.add("outputs", f"{model} vs {cpu_model}", worst >= floor and len(got) == len(cpu),
                      f"lowest cosine {worst:.6f} over {len(got)} texts (at least {floor})")


def check_task_outputs(table, server, task, precision):
    """(b) for the tasks past embeddings: the GPU's sparse weights (as dense vectors, by cosine) or each token's
    label probabilities (by the largest difference) against the CPU's, and the same entities."""
    gpu, cpu = f"{task}-gpu-{precision}", f"{task}-cpu"
    if task == "splade":
        answers = [http(server.base, f"/models/{m}/embed_sparse", {"inputs": SENTENCES}) for m in (cpu, gpu)]
        if any(status != 200 for status, _ in answers):
            return table.add("outputs", gpu, False, "; ".join(str(a)[:200] for _, a in answers))
        (_, want), (_, got) = answers
        dense = lambda weights: {w["index"]: w["value"] for w in weights}  # noqa: E731
        worst = 1.0
        for g, w in zip(got, want):
            g, w = dense(g), dense(w)
            keys = sorted(set(g) | set(w))
            worst = min(worst, cosine([g.get(k, 0.0) for k in keys], [w.get(k, 0.0) for k in keys]))
        floor = SPLADE_COSINE[precision]
        return table.add("outputs", f"{gpu} vs {cpu}", worst >= floor and len(got) == len(want),
                         f"lowest cosine {worst:.6f} over {len(got)} texts' sparse weights (at least {floor})")
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(SENTENCES)], "data": SENTENCES}]}
    answers = [http(server.base, f"/v2/models/{m}/infer", body) for m in (cpu, gpu)]
    if any(status != 200 for status, _ in answers):
        return table.add("outputs", gpu, False, "; ".join(str(a)[:200] for _, a in answers))
    (_, want), (_, got) = answers
    error = max(abs(g - w) for g, w in zip(got["outputs"][0]["data"], want["outputs"][0]["data"]))
    tolerance = NER_TOLERANCE[precision]
    same = got["outputs"][1]["data"] == want["outputs"][1]["data"]
    entities = [http(server.base, f"/models/{m}", {"inputs": SENTENCES[0], "parameters": {"aggregation_strategy":
                                                                                            "first"}})[1]
                for m in (cpu, gpu)]
    agree = [(e.get("entity_group"), e.get("start"), e.get("end")) for e in entities[0]] == \
        [(e.get("entity_group"), e.get("start"), e.get("end")) for e in entities[1]]
    table.add("outputs", f"{gpu} vs {cpu}", error <= tolerance and same,
              f"largest token probability difference {error:.1e} (tolerance {tolerance:.0e}); "
              f"entities of the first text {'the same' if agree else 'differ'}")


def check_architecture(table, server, name):
    """(b) for each architecture: its GPU FP32 vectors against the CPU's, and its FP16 and BF16 ones against the GPU's
    FP32, text by text (pooled as the folder says, not normalised), and each token's state likewise."""
    models = [f"arch-{name}-cpu"] + [f"arch-{name}-gpu-{p}" for p in ("fp32", "fp16", "bf16")]
    pooled, tokens = {}, {}
    for model in models:
        answers = [http(server.base, f"/models/{model}/{route}", {"inputs": SENTENCES, "normalize": False})
                   for route in ("embed", "embed_all")]
        if any(status != 200 for status, _ in answers):
            return table.add("outputs", model, False, "; ".join(str(a)[:200] for _, a in answers))
        pooled[model], tokens[model] = answers[0][1], answers[1][1]
    for model, precision in zip(models[1:], ("fp32", "fp16", "bf16")):
        want = models[0] if precision == "fp32" else models[1]
        worst = min(cosine(g, w) for g, w in zip(pooled[model], pooled[want]))
        worst_token = min(cosine(g, w) for gt, wt in zip(tokens[model], tokens[want]) for g, w in zip(gt, wt))
        floor = ARCHITECTURE_COSINE[precision]
        table.add("outputs", f"{model} vs {want}", worst >= floor and len(pooled[model]) == len(SENTENCES),
                  f"lowest cosine {worst:.6f} over {len(SENTENCES)} texts (at least {floor}); per token "
                  f"{worst_token:.6f}")


def check_clip(table, server, bundle, name):
    """(b) for CLIP and SigLIP: the GPU's FP32 vectors of photos and texts against the CPU's, and its FP16 and BF16
    ones against its FP32, each picture and text alike (normalised: the space's cosine is what they serve)."""
    models = [f"clip-{name}-cpu"] + [f"clip-{name}-gpu-{p}" for p in ("fp32", "fp16", "bf16")]
    vectors = {}
    for model in models:
        got, problems = [], []
        for photo, kind in CLIP_PHOTOS.items():
            data = open(os.path.join(bundle, "data", photo), "rb").read()
            status, answer = http(server.base, f"/models/{model}/predict", data, content_type=kind)
            if status != 200:
                problems.append(f"{photo}: {status} {str(answer)[:200]}")
                continue
            got.append(answer["predictions"][0]["outputs"]["embedding"])
        status, answer = http(server.base, f"/models/{model}/embed", {"inputs": SENTENCES, "truncate": True})
        if status != 200 or problems:
            return table.add("outputs", model, False, "; ".join(problems + [f"texts: {status} {str(answer)[:200]}"]))
        vectors[model] = got + answer
    for model, precision in zip(models[1:], ("fp32", "fp16", "bf16")):
        want = models[0] if precision == "fp32" else models[1]
        worst = min(cosine(g, w) for g, w in zip(vectors[model], vectors[want]))
        floor = ARCHITECTURE_COSINE[precision]
        table.add("outputs", f"{model} vs {want}", worst >= floor and len(vectors[model]) == len(vectors[want]),
                  f"lowest cosine {worst:.6f} over {len(CLIP_PHOTOS)} photos and {len(SENTENCES)} texts "
                  f"(at least {floor})")


def engine_bench(table, plan, bundle, repo, model, env, results, variant=""):
    """(c): `inferd-bench engine` at each batch size; returns {batch: rows/s}."""
    name = f"engine-{model}" + (f"-{variant.split()[0]}" if variant else "")
    warmup, duration = plan.engine_seconds
    status, out = run([os.path.join(bundle, "bin", "inferd-bench"), "engine", "--model-dir",
                       os.path.join(repo, model), "--batch-sizes", plan.engine_batches, "--warmup", warmup,
                       "--duration", duration, "--out", results, "--name", name], 300, env=env,
                      log=os.path.join(results, f"{name}.log"))
    try:
        reports = json.load(open(os.path.join(results, f"{name}.json")))
        rates = {r["batch_size"]: r["rows_per_s"] for r in reports}
    except (OSError, ValueError, KeyError):
        rates = {}
    ok = status == 0 and len(rates) == len(plan.engine_batches.split(","))
    figure = (", ".join(f"b{b}: {r:,.0f}" for b, r in sorted(rates.items())) if ok
              else (out.strip().splitlines() or ["no output"])[-1])
    # A variant only measures a figure: where it cannot run, it says so without failing the check.
    table.add("engine rows/s", f"{model} {variant}".strip(), (FIGURE if ok else None) if variant else ok, figure)
    return rates


def http_bench(table, plan, bundle, server, model, protocol, env, results):
    """(d): 64 clients for 10 s against the server, the GPU's busy percentage sampled meanwhile."""
    check = f"http c={plan.clients}"
    name = f"http-{model}"
    warmup, duration = plan.http_seconds
    sampler = None if plan.rehearse else Sampler()
    started, cpu_before = time.monotonic(), cpu_seconds(server.proc.pid)
    status, out = run([os.path.join(bundle, "bin", "inferd-bench"), "http", "--url", server.base, "--model", model,
                       "--protocol", protocol, "--concurrency", str(plan.clients), "--warmup", str(warmup), "--duration",
                       str(duration), "--quiet", "--out", results, "--name", name], 120, env=env,
                      log=os.path.join(results, f"{name}.log"))
    ended, cpu_after = time.monotonic(), cpu_seconds(server.proc.pid)
    if sampler:
        sampler.stop()
    busy = sampler.between(started + warmup, ended) if sampler else []
    try:
        report = json.load(open(os.path.join(results, f"{name}.json")))[0]
    except (OSError, ValueError, IndexError):
        return table.add(check, model, False, (out.strip().splitlines() or ["no output"])[-1])
    errors = sum(report["errors"].values())
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    figure = (f"{report['rows_per_s']:,.0f} rows/s, p50 {report['latency_us']['p50'] / 1e3:.1f} ms, "
              f"p99 {report['latency_us']['p99'] / 1e3:.1f} ms, mean batch {report.get('mean_batch_rows') or 0:.1f}, "
              f"{errors} errors")
    # The server's CPU over warm-up and load, a row: what the front (HTTP, JSON, tokenizing) costs beside the GPU.
    if cpu_before is not None and cpu_after is not None and report["requests_ok"]:
        rows = report["rows_per_s"] * (ended - started)
        figure += (f"; server CPU {(cpu_after - cpu_before) / (ended - started):.1f} cores, "
                   f"{(cpu_after - cpu_before) / rows * 1e6:,.0f} us a row")
    if sampler:
        figure += f"; GPU busy {mean_busy:.0f}% mean, {max(busy, default=0):.0f}% max ({len(busy)} samples)"
    ok = status == 0 and errors == 0 and report["requests_ok"] > 0 and (plan.rehearse or mean_busy > 0)
    table.add(check, model, ok, figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="the unpacked bundle")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: run every step that can on the CPU build, briefly (the test command does)")
    parser.add_argument("results", nargs="?", default="/tmp/inferd-gpu-check", help="folder for logs and the table")
    args = parser.parse_args()
    bundle, results = os.path.abspath(args.bundle), os.path.abspath(args.results)
    os.makedirs(results, exist_ok=True)
    table = Table()
    try:
        check(table, Plan(args.rehearse), bundle, results)
    except Exception as e:  # a broken check is a failed check, reported in the table
        table.add("gpu-check", "itself", False, f"{type(e).__name__}: {e}")
    print("\n" + table.markdown())
    with open(os.path.join(results, "table.md"), "w") as f:
        f.write(table.markdown() + "\n")
    return 1 if table.failed() else 0


def check(table, plan, bundle, results):
    print(open(os.path.join(bundle, "MANIFEST")).read(), flush=True)
    if plan.rehearse:
        env = dict(os.environ)
        table.add("gpu", "nvidia-smi, libraries, links, tests, GPU memory and busy", None, "a rehearsal on the CPU")
    else:
        status, out = run(["nvidia-smi"], 60)
        print(out, flush=True)
        if status != 0:
            table.add("nvidia-smi", "GPU 0", False, (out.strip().splitlines() or ["no output"])[-1])
            return
        gpu = smi("name,memory.total,driver_version")
        table.add("nvidia-smi", "GPU 0", True,
                  f"{gpu['name']}, {gpu['memory.total']} MiB, driver {gpu['driver_version']}")
        library_path = find_libraries(table)
        if library_path is None:
            return
        env = dict(os.environ, LD_LIBRARY_PATH=library_path)
        if not check_links(table, bundle, env):
            return
        run_tests(table, bundle, env, results)

    models = os.path.join(bundle, "models")
    repo = os.path.join(results, "repository")
    shutil.rmtree(repo, ignore_errors=True)
    served = {}  # name -> (device, precision)

    def add(src, name, device, precision):
        variant(os.path.join(models, src), os.path.join(repo, name), device, precision)
        served[name] = (device, precision)

    add("digits-candle", "digits-cpu", "cpu", "fp32")
    for p in ("fp32", "fp16", "bf16"):
        add("digits-candle", f"digits-gpu-{p}", plan.gpu, p)
    minilm = os.path.exists(os.path.join(models, "minilm", "model.safetensors"))
    if minilm:
        add("minilm", "minilm-cpu", "cpu", "fp32")
        for p in ("fp32", "fp16"):
            add("minilm", f"minilm-gpu-{p}", plan.gpu, p)
    else:
        table.add("minilm", "text model", None, "its weights are not in this bundle")
    # The tasks past embeddings, on candle: sparse embeddings and token classification, in FP16 on the GPU.
    tasks = [t for t in ("splade", "ner") if os.path.exists(os.path.join(models, t, "model.safetensors"))]
    for task in tasks:
        add(task, f"{task}-cpu", "cpu", "fp32")
        add(task, f"{task}-gpu-fp16", plan.gpu, "fp16")
    # The architectures past BERT's family, tiny, on candle: FP32, FP16 and BF16 on the GPU.
    architectures = [a for a in ARCHITECTURES if os.path.exists(os.path.join(models, f"arch-{a}", "model.safetensors"))]
    for name in architectures:
        add(f"arch-{name}", f"arch-{name}-cpu", "cpu", "fp32")
        for p in ("fp32", "fp16", "bf16"):
            add(f"arch-{name}", f"arch-{name}-gpu-{p}", plan.gpu, p)
    # CLIP and SigLIP, tiny: pictures and texts, FP32, FP16 and BF16 on the GPU.
    clips = [c for c in CLIPS if os.path.exists(os.path.join(models, f"clip-{c}", "model.safetensors"))]
    for name in clips:
        add(f"clip-{name}", f"clip-{name}-cpu", "cpu", "fp32")
        for p in ("fp32", "fp16", "bf16"):
            add(f"clip-{name}", f"clip-{name}-gpu-{p}", plan.gpu, p)
    ort = None if plan.rehearse else onnxruntime_gpu()
    if ort:
        add("digits", "digits-onnx-cpu", "cpu", "fp32")
        add("digits", "digits-onnx-gpu", "cuda:0", "fp32")
    elif not plan.rehearse:
        table.add("onnx cuda", "digits", None, "no onnxruntime-gpu >= 1.31 on this machine; its CUDA provider library "
                  "(284 MB, 186 MB compressed) cannot travel in the bundle")

    baseline = None if plan.rehearse else int(smi("memory.used")["memory.used"])
    server = Server(bundle, repo, env, results, ort)
    try:
        problem = server.wait_loaded(300)
        if problem:
            table.add("server", "inferd serve", False, problem[:600])
            return
        table.add("server", "inferd serve", True, f"{len(served)} models ready")
        check_health(table, server, served, baseline)  # in a rehearsal: the models' devices and precisions
        warm = report_memory(table, server, plan, "after warm-up")
        pixels = json.load(open(os.path.join(bundle, "data", "digits_heldout.json")))["pixels"]
        check_outputs(table, server, pixels, [(f"digits-gpu-{p}", p) for p in ("fp32", "fp16", "bf16")],
                      "digits-cpu", "digits")
        if minilm:
            check_outputs(table, server, None, [(f"minilm-gpu-{p}", p) for p in ("fp32", "fp16")], "minilm-cpu",
                          "minilm")
        if ort:
            check_outputs(table, server, pixels, [("digits-onnx-gpu", "fp32")], "digits-onnx-cpu", "digits")
        for task in tasks:
            check_task_outputs(table, server, task, "fp16")
        for name in architectures:
            check_architecture(table, server, name)
        for name in clips:
            check_clip(table, server, bundle, name)
        # The models the output checks ran give back their working memory once idle (`release_after_idle_ms`,
        # 10 s): what the process holds then is what the loads' growth, and its return, are measured from.
        rested = None if plan.rehearse else settle(server)
        # Each load's growth of the process's GPU memory is that model's: the arena it grew under 64 clients.
        for model, protocol in [("digits-gpu-fp32", "predict")] + ([("minilm-gpu-fp16", "embed")] if minilm else []):
            before = None if plan.rehearse else process_gpu_mib(server.proc.pid)
            http_bench(table, plan, bundle, server, model, protocol, env, results)
            after = report_memory(table, server, plan, "after load", only=model)
            if before is not None and after is not None:
                table.add("memory after load", model, FIGURE, f"the process's GPU memory grew {after - before} MiB "
                          f"under its load ({before} -> {after} MiB)")
        if warm is not None and after is not None:
            check_rest(table, server, warm, rested, after)
        library_path = env.get("LD_LIBRARY_PATH", "")
        gpu_cudashm.check(table, plan, http, server.base, library_path, pixels, ["digits-cpu", "digits-gpu-fp32"])
    finally:
        server.stop()

    rates = {}
    for name in served:
        if not name.startswith(("digits-onnx", "splade", "ner", "arch-", "clip-")):
            rates[name] = engine_bench(table, plan, bundle, repo, name, env, results)
    # inferd gives each cuBLAS handle 8 MiB of workspace where cuBLAS would give 64 (one handle per candle model
    # instance): the same engines with cuBLAS's own size, to check that the memory saved costs no speed.
    for name in ("digits-gpu-fp32", "minilm-gpu-fp16"):
        if os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
            table.add("cublas workspace", name, None,
                      "CUBLAS_WORKSPACE_CONFIG is set here: inferd's 8 MiB is not what ran")
        elif rates.get(name):
            wide = engine_bench(table, plan, bundle, repo, name, dict(env, CUBLAS_WORKSPACE_CONFIG=":4096:16"),
                                results, "cublas-64MiB workspace")
            top = max(rates[name])
            if wide.get(top):
                table.add("cublas workspace", name, FIGURE, f"at batch {top}: 8 MiB gives "
                          f"{rates[name][top] / wide[top]:.2f}x the rows/s of 64 MiB")
    # What the GPU and its lower precisions buy: each GPU variant against the CPU and against the GPU in FP32.
    for family in ("digits", "minilm"):
        cpu, fp32 = rates.get(f"{family}-cpu"), rates.get(f"{family}-gpu-fp32")
        for name, r in rates.items():
            if not name.startswith(f"{family}-gpu") or not r:
                continue
            top = max(r)
            figures = [f"{r[top] / cpu[top]:.2f}x the CPU"] if cpu else []
            if fp32 and name != f"{family}-gpu-fp32":
                figures.append(f"{r[top] / fp32[top]:.2f}x FP32 on the GPU")
            table.add("engine ratio", name, FIGURE, f"at batch {top}: " + ", ".join(figures))


if __name__ == "__main__":
    sys.exit(main())
