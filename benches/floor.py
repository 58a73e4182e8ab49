#!/usr/bin/env python3
"""The HTTP floor: inferd serving digits against nginx answering every POST with the bytes inferd answers, driven by
the same load (inferd-bench, one row per request, the request file compare.sh sends) at 1 and 64 clients. nginx does
no work beyond HTTP, so its figures are what a request costs on this machine before any model: the server CPU a
request (the server's user and system time over the window, from /proc: nginx's master and workers together), the
requests a second and, with one client, the latency. Each pair is measured ROUNDS times, interleaved, and the table
takes the median of each side. The ratios are inferd's over nginx's, in the same run. Every round's figures go to
benches/results/floor/floor.json.

Run: benches/floor.sh (installs Debian's nginx-light first where it is missing), or
     python3 benches/floor.py [--duration 5] [--rounds 3] [--binary target/release/inferd]
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
REQUEST = ROOT / "tests" / "data" / "request.json"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it answered {url}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing answered {url}")


def family(pid):
    """`pid` and its children (nginx's workers)."""
    pids = [pid]
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            pids.append(int(stat.parent.name))
    return pids


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def load(bench, port, clients, duration, out, name):
    """inferd-bench against the server on `port`: its report, and the server CPU microseconds a request."""
    subprocess.run([bench, "http", "--url", f"http://127.0.0.1:{port}", "--model", "digits", "--path", "/predict",
                    "--body", str(REQUEST), "--concurrency", str(clients), "--warmup", "0.5", "--duration",
                    str(duration), "--quiet", "--out", str(out), "--name", name], check=True,
                   stdout=subprocess.DEVNULL)
    [report] = json.loads((out / f"{name}.json").read_text())
    assert report["errors"] == {}, report
    return report


def measure(server, bench, port, clients, duration, out, name):
    pids = family(server.pid)
    before = cpu_ticks(pids)
    started = time.perf_counter()
    report = load(bench, port, clients, duration, out, name)
    elapsed = time.perf_counter() - started
    ticks = cpu_ticks(pids) - before
    # The bench's warm-up requests are not in its report: the CPU of the whole run is shared over the requests of
    # the whole run, counted from the report's rate.
    requests = report["throughput_rps"] * elapsed
    return {"rps": report["throughput_rps"], "cpu_us": ticks / TICKS * 1e6 / requests,
            "p50_ms": report["latency_us"]["p50"] / 1000, "p99_ms": report["latency_us"]["p99"] / 1000}


def nginx_config(folder, port, body):
    text = body.decode()
    assert "'" not in text and "\\" not in text, "the answer quotes as is in nginx's `return`"
    (folder / "nginx.conf").write_text(f"""daemon off;
worker_processes auto;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            default_type application/json;
            return 200 '{text}';
        }}
    }}
}}
""")
    return folder / "nginx.conf"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "inferd"))
    parser.add_argument("--bench", default=str(ROOT / "target" / "release" / "inferd-bench"))
    parser.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    parser.add_argument("--out", default=str(ROOT / "benches" / "results" / "floor"))
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="inferd-floor-"))
    port = free_port()
    lib = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"

    def start_inferd():
        proc = subprocess.Popen([args.binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--grpc-port",
                                 "0", "--models", str(ROOT / "models" / "digits"), "--onnxruntime-lib", str(lib),
                                 "--log", "warn"])
        wait_ready(f"http://127.0.0.1:{port}/health/ready", proc)
        return proc

    def start_nginx():
        proc = subprocess.Popen([args.nginx, "-c", str(config), "-p", str(folder)])
        wait_ready(f"http://127.0.0.1:{port}/", proc)
        return proc

    def stop(proc):
        proc.terminate()
        proc.wait(timeout=30)

    # nginx answers what inferd answers to the same request, byte for byte.
    server = start_inferd()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", REQUEST.read_bytes(),
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request) as r:
        body = r.read()
    stop(server)
    config = nginx_config(folder, port, body)

    results = {}
    for r in range(1, args.rounds + 1):
        for name, start in [("nginx", start_nginx), ("inferd", start_inferd)]:
            server = start()
            for clients in [64, 1]:
                key = f"{name}-c{clients}"
                print(f"== round {r}/{args.rounds}: {name}, {clients} clients", flush=True)
                figures = measure(server, args.bench, port, clients, args.duration, folder, f"{key}-r{r}")
                results.setdefault(key, []).append(figures)
            stop(server)

    median = {key: {f: statistics.median(m[f] for m in runs) for f in runs[0]} for key, runs in results.items()}
    (out / "floor.json").write_text(json.dumps({"answer_bytes": len(body), "runs": results, "median": median},
                                               indent=1))
    print(f"\nThe answer: {len(body)} bytes. Medians of {args.rounds} interleaved rounds of {args.duration} s.\n")
    print(f"{'server':8} {'clients':>7} {'req/s':>9} {'CPU us/req':>11} {'p50 ms':>8} {'p99 ms':>8}")
    for key, m in median.items():
        name, clients = key.split("-c")
        print(f"{name:8} {clients:>7} {m['rps']:9.0f} {m['cpu_us']:11.1f} {m['p50_ms']:8.3f} {m['p99_ms']:8.3f}")
    cpu = median["inferd-c64"]["cpu_us"] / median["nginx-c64"]["cpu_us"]
    p50 = median["inferd-c1"]["p50_ms"] / median["nginx-c1"]["p50_ms"]
    print(f"\ninferd / nginx: server CPU a request at 64 clients {cpu:.2f}x (target <= 4), "
          f"p50 at 1 client {p50:.2f}x (target <= 1.5)")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
