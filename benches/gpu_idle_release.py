"""What giving back a GPU's cached memory after an idle spell costs the next request: one server from the GPU bundle
serving MiniLM FP16 on cuda:0 twice, with `[batching] release_after_idle_ms` 1000 and 0, on a machine with a GPU.

    python3 benches/gpu_idle_release.py target/gpu-bundle/inferd-gpu.tar.xz RESULTS

Each round waits 2 s (past the release), then times one request of 64 texts; then the same request again at
once (the pool already grown). Prints the latencies and the process's GPU memory between rounds.
"""
import os
import statistics
import sys
import time

from gpu_bundle import open_bundle

ROUNDS = 8


def main():
    archive, results = sys.argv[1], os.path.abspath(sys.argv[2])
    os.makedirs(results, exist_ok=True)
    bundle, g, env = open_bundle(archive)
    texts = (g.SENTENCES * 7)[:64]
    lines = []
    for release_ms in (1000, 0):
        repo = os.path.join(results, f"repo-{release_ms}")
        name = "minilm-gpu-fp16"
        g.variant(os.path.join(bundle, "models", "minilm"), os.path.join(repo, name), "cuda:0", "fp16")
        toml = os.path.join(repo, name, "model.toml")
        text = open(toml).read()  # the bundled minilm has a [batching] table
        open(toml, "w").write(text.replace("[batching]", f"[batching]\nrelease_after_idle_ms = {release_ms}", 1))
        out = os.path.join(results, f"server-{release_ms}")
        os.makedirs(out, exist_ok=True)
        server = g.Server(bundle, repo, env, out, None)
        try:
            problem = server.wait_loaded(180)
            if problem:
                lines.append(f"release_after_idle_ms = {release_ms}: {problem}")
                continue
            after_idle, again, memory = [], [], []
            for _ in range(ROUNDS):
                time.sleep(2)
                memory.append(g.process_gpu_mib(server.proc.pid))
                for into in (after_idle, again):
                    start = time.perf_counter()
                    status, _ = g.http(server.base, f"/models/{name}/embed", {"inputs": texts})
                    into.append((time.perf_counter() - start) * 1000)
                    assert status == 200, status
            lines.append(f"release_after_idle_ms = {release_ms}: 64 texts after 2 s idle: median "
                         f"{statistics.median(after_idle):.1f} ms ({', '.join(f'{t:.1f}' for t in after_idle)}); "
                         f"at once after: median {statistics.median(again):.1f} ms; process GPU MiB before each "
                         f"round {memory}")
        finally:
            server.stop()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
