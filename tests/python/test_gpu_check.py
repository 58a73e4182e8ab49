"""The GPU check (scripts/gpu_check.py) rehearsed on the CPU build: its server, output comparison and benchmark steps
run here, with `cpu` in place of `cuda:0`, so that the few minutes a GPU machine is lent for are never spent on a
broken script. The steps that need a GPU report "not run"."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("INFERD_BIN", ROOT / "target" / "debug" / "inferd")).resolve()
BENCH = pathlib.Path(os.environ.get("INFERD_BENCH_BIN", ROOT / "target" / "debug" / "inferd-bench")).resolve()


ARCHITECTURES = ("mpnet", "modernbert", "nomic", "gte", "qwen3")


def rows(table):
    """The table's rows as (check, subject, result, figure)."""
    lines = [line for line in table.splitlines()[2:] if line.startswith("|")]
    return [tuple(cell.strip() for cell in line.strip("|").split(" | ")) for line in lines]


def test_the_gpu_check_rehearses_every_step_it_can_on_the_cpu(tmp_path):
    bundle = tmp_path / "bundle"
    for folder in ("bin", "models", "data"):
        (bundle / folder).mkdir(parents=True)
    (bundle / "bin" / "inferd").symlink_to(BINARY)
    (bundle / "bin" / "inferd-bench").symlink_to(BENCH)
    for model in ("digits-candle", "minilm", "splade", "ner"):
        (bundle / "models" / model).symlink_to(ROOT / "models" / model)
    for name in ARCHITECTURES:
        (bundle / "models" / f"arch-{name}").symlink_to(ROOT / "tests" / "data" / "architectures" / name)
    for name in ("clip", "siglip"):
        (bundle / "models" / f"clip-{name}").symlink_to(ROOT / "tests" / "data" / "clip" / name)
    for photo in ("rocket.jpg", "camera.png"):
        (bundle / "data" / photo).symlink_to(ROOT / "tests" / "data" / "photos" / photo)
    (bundle / "data" / "digits_heldout.json").symlink_to(ROOT / "tests" / "data" / "digits_heldout.json")
    (bundle / "MANIFEST").write_text("a rehearsal\n")
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--bundle", str(bundle), "--rehearse",
                          str(results)], capture_output=True, text=True, timeout=600)
    table = (results / "table.md").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = rows(table)
    results_by_subject = {(check, subject): result for check, subject, result, _ in got}
    assert all(result in ("pass", "figure", "not run") for _, _, result, _ in got), table
    # The GPU-only steps say they did not run; everything else ran and passed.
    assert results_by_subject[("gpu", "nvidia-smi, libraries, links, tests, GPU memory and busy")] == "not run"
    for model in ("digits-gpu-fp32", "digits-gpu-fp16", "digits-gpu-bf16"):
        assert results_by_subject[("outputs", f"{model} vs digits-cpu")] == "pass", table
    for model in ("minilm-gpu-fp32", "minilm-gpu-fp16"):
        assert results_by_subject[("outputs", f"{model} vs minilm-cpu")] == "pass", table
    # The tasks past embeddings: sparse embeddings and token classification, in FP16 on the GPU.
    for task in ("splade", "ner"):
        assert results_by_subject[("outputs", f"{task}-gpu-fp16 vs {task}-cpu")] == "pass", table
    # Each architecture past BERT's family in FP32 against the CPU, in FP16 and BF16 against FP32.
    for name in ARCHITECTURES:
        for precision, want in (("fp32", "cpu"), ("fp16", "gpu-fp32"), ("bf16", "gpu-fp32")):
            subject = f"arch-{name}-gpu-{precision} vs arch-{name}-{want}"
            assert results_by_subject[("outputs", subject)] == "pass", table
    # CLIP's and SigLIP's pictures and texts likewise.
    for name in ("clip", "siglip"):
        for precision, want in (("fp32", "cpu"), ("fp16", "gpu-fp32"), ("bf16", "gpu-fp32")):
            subject = f"clip-{name}-gpu-{precision} vs clip-{name}-{want}"
            assert results_by_subject[("outputs", subject)] == "pass", table
    for model in ("digits-gpu-fp32", "minilm-gpu-fp16"):
        assert results_by_subject[("http c=4", model)] == "pass", table
    engine = [subject for check, subject, result, _ in got if check == "engine rows/s" and result == "pass"]
    assert sorted(engine) == sorted(["digits-cpu", "digits-gpu-fp32", "digits-gpu-fp16", "digits-gpu-bf16",
                                     "minilm-cpu", "minilm-gpu-fp32", "minilm-gpu-fp16"]), table
    # The 8 MiB cuBLAS workspace inferd gives each handle, against cuBLAS's own 64 MiB: figures, as a ratio of rows/s.
    for model in ("digits-gpu-fp32", "minilm-gpu-fp16"):
        assert results_by_subject[("engine rows/s", f"{model} cublas-64MiB workspace")] == "figure", table
        assert results_by_subject[("cublas workspace", model)] == "figure", table
    assert results_by_subject[("health", "models ready where configured")] == "pass", table
    # CUDA shared memory: the CPU build refuses to register a region, naming the CUDA build.
    assert results_by_subject[("cuda shm", "register on the CPU build")] == "pass", table
    # The same table is printed at the end of the output.
    assert table.strip() in run.stdout


def test_a_failed_check_fails_the_run(tmp_path):
    """A bundle whose server cannot start: the table says so and the exit status is 1."""
    bundle = tmp_path / "bundle"
    for folder in ("bin", "models", "data"):
        (bundle / folder).mkdir(parents=True)
    (bundle / "bin" / "inferd").write_text("#!/bin/sh\necho 'not a server' >&2\nexit 3\n")
    (bundle / "bin" / "inferd").chmod(0o755)
    (bundle / "bin" / "inferd-bench").symlink_to(BENCH)
    (bundle / "models" / "digits-candle").symlink_to(ROOT / "models" / "digits-candle")
    (bundle / "data" / "digits_heldout.json").symlink_to(ROOT / "tests" / "data" / "digits_heldout.json")
    (bundle / "MANIFEST").write_text("a broken bundle\n")
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--bundle", str(bundle), "--rehearse",
                          str(results)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout
    server = [row for row in rows((results / "table.md").read_text()) if row[0] == "server"]
    assert server and server[0][2] == "FAIL" and "exited with 3" in server[0][3], server
