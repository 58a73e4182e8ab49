"""Where the first text model's GPU memory goes: one server per case, from the GPU bundle, on a machine with a GPU.

    python3 benches/gpu_first_model.py target/gpu-bundle/inferd-gpu.tar.xz RESULTS

Each case serves a few variants of the bundled models on cuda:0 and reports, once they are ready, each model's
device memory at load (/health), the process's GPU memory (nvidia-smi) and candle's debug lines of each load step.
`CUDA_MODULE_LOADING=EAGER` loads every kernel of each library at its first use instead of each kernel at its own:
what a case gains from it is the code that lazy loading defers to a model's warm-up.
"""
import json
import os
import sys

from gpu_bundle import open_bundle

CASES = [
    ("minilm-fp16 alone", [("minilm", "fp16")], {}),
    ("minilm-fp32 alone", [("minilm", "fp32")], {}),
    ("minilm-fp32 then minilm-fp16", [("minilm", "fp32"), ("minilm", "fp16")], {}),
    ("digits-fp32 alone", [("digits-candle", "fp32")], {}),
    ("digits-fp32 then minilm-fp16", [("digits-candle", "fp32"), ("minilm", "fp16")], {}),
    ("minilm-fp16 alone, eager module loading", [("minilm", "fp16")], {"CUDA_MODULE_LOADING": "EAGER"}),
]


def main():
    archive, results = sys.argv[1], os.path.abspath(sys.argv[2])
    os.makedirs(results, exist_ok=True)
    bundle, g, base_env = open_bundle(archive)
    rows = ["| case | model | weights MiB | device memory at load MiB | process GPU MiB (nvidia-smi) |",
            "| --- | --- | --- | --- | --- |"]
    for n, (case, models, extra) in enumerate(CASES):
        repo = os.path.join(results, f"repo-{n}")
        out = os.path.join(results, f"case-{n}")
        os.makedirs(out, exist_ok=True)
        for i, (src, precision) in enumerate(models):
            # The server loads models in name order: the prefix keeps the case's order.
            g.variant(os.path.join(bundle, "models", src), os.path.join(repo, f"{i}-{src}-{precision}"),
                      "cuda:0", precision)
        server = g.Server(bundle, repo, dict(base_env, **extra), out, None)
        try:
            problem = server.wait_loaded(180)
            if problem:
                rows.append(f"| {case} | - | - | - | {problem[:200]} |")
                continue
            health = g.http(server.base, "/health")[1]
            gpu = g.process_gpu_mib(server.proc.pid)
            for m in health["models"]:
                weights = m.get("weight_bytes", 0) / g.MIB
                device = m.get("device_memory_bytes")
                device = f"{device / g.MIB:.1f}" if device is not None else "-"
                rows.append(f"| {case} | {m['name']} | {weights:.1f} | {device} | {gpu} |")
        finally:
            server.stop()
        print(f"== {case}", flush=True)
        for line in open(os.path.join(out, "server.log"), errors="replace"):
            if "inferd_candle" in line or "loaded" in line:
                print("   " + line.rstrip()[:400])
    print("\n".join(rows))
    with open(os.path.join(results, "table.md"), "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
