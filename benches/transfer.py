#!/usr/bin/env python3
"""What a request's bytes cost on their way in and out, by transport: system shared memory, binary HTTP over a Unix
socket, binary HTTP over TCP, and gRPC. Two payloads: `identity` (16 MiB in, the same 16 MiB out: pure transfer)
and `wide` (4,096 rows: 8 MiB in, 160 KiB of logits out). One client, one request at a time, for DURATION seconds
each, interleaved in ROUNDS: requests a second, and the server's CPU a request (its user and system time over the
window, from /proc), each transport's figure the median of its rounds. The ratio is shared memory's requests a second
over binary HTTP over TCP's, in the same run.

The HTTP client is the same few lines for the socket and TCP (a raw http.client request: the JSON part, then the
tensor), so that only the transport differs; shared memory is that client too, its tensors written to and read from
the regions around each request, as a gateway would. gRPC is tritonclient's.

Run: .venv/bin/python benches/transfer.py [--duration 3] [--rounds 3] [--binary target/release/inferd]
     (the models from scripts/setup.sh: .cache/models/identity and .cache/models/wide)
"""

import argparse
import http.client
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
from conftest import launch_inferd  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("inferd")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)


def v2_binary(conn, model, x, output_bytes):
    """One v2 request, the input in binary after the JSON; returns the output as an array."""
    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    conn.request("POST", f"/v2/models/{model}/infer", body=header + x.tobytes(),
                 headers={"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"})
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200, body[:300]
    json_len = int(response.headers["Inference-Header-Content-Length"])
    assert len(body) - json_len == output_bytes
    return np.frombuffer(body, np.float32, offset=json_len)


def v2_shared(conn, model, x, output_bytes, regions):
    """One v2 request with its input and output in shared memory: written there before, read from there after."""
    region_in, region_out = regions
    shm.set_shared_memory_region(region_in, [x])
    body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {
        "shared_memory_region": "in", "shared_memory_byte_size": x.nbytes}}],
        "outputs": [{"name": output_name(model), "parameters": {
            "shared_memory_region": "out", "shared_memory_byte_size": output_bytes}}]}).encode()
    conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = response.read()
    assert response.status == 200, answer[:300]
    return shm.get_contents_as_numpy(region_out, np.float32, [output_bytes // 4]).copy()


def output_name(model):
    return "output" if model == "identity" else "logits"


def grpc_infer(client, model, x, output_bytes):
    given = grpcclient.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    out = client.infer(model, [given]).as_numpy(output_name(model))
    assert out.nbytes == output_bytes
    return out


def cpu_ticks(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def measure(pid, call, duration):
    """(requests a second, server CPU milliseconds a request) over `duration` seconds of back-to-back `call`s."""
    call()
    ticks, start, n = cpu_ticks(pid), time.perf_counter(), 0
    while time.perf_counter() - start < duration:
        call()
        n += 1
    elapsed = time.perf_counter() - start
    return n / elapsed, (cpu_ticks(pid) - ticks) / TICKS * 1000 / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "inferd"))
    parser.add_argument("--models", default=str(ROOT / ".cache" / "models"))
    args = parser.parse_args()
    os.environ["INFERD_BIN"] = args.binary
    folder = pathlib.Path(tempfile.mkdtemp(prefix="inferd-transfer-"))
    repo = folder / "models"
    repo.mkdir()
    for model in ["identity", "wide"]:
        (repo / model).symlink_to(pathlib.Path(args.models) / model, target_is_directory=True)
    sock = folder / "http.sock"
    proc, address, grpc_address = launch_inferd(repo, "--allow-client-shm", "--unix-socket", str(sock), grpc=True)
    payloads = {"identity": (np.random.default_rng(1).random((1, 4 * 1024 * 1024), np.float32), 16 << 20),
                "wide": (np.random.default_rng(2).random((4096, 512), np.float32), 4096 * 10 * 4)}
    key = f"/inferd-transfer-{os.getpid()}"
    region_in = shm.create_shared_memory_region("in", key + "-in", 16 << 20)
    region_out = shm.create_shared_memory_region("out", key + "-out", 16 << 20)
    try:
        tcp = http.client.HTTPConnection(*address.rsplit(":", 1))
        unix = UnixConnection(str(sock))
        grpc = grpcclient.InferenceServerClient(grpc_address)
        for name, region in [("in", key + "-in"), ("out", key + "-out")]:
            body = json.dumps({"key": region, "offset": 0, "byte_size": 16 << 20})
            tcp.request("POST", f"/v2/systemsharedmemory/region/{name}/register", body=body)
            response = tcp.getresponse()
            assert response.status == 200, response.read()
            response.read()
        rows = []
        for model, (x, out_bytes) in payloads.items():
            transports = {
                "shared memory": lambda: v2_shared(unix, model, x, out_bytes, (region_in, region_out)),
                "HTTP binary, Unix socket": lambda: v2_binary(unix, model, x, out_bytes),
                "HTTP binary, TCP": lambda: v2_binary(tcp, model, x, out_bytes),
                "gRPC": lambda: grpc_infer(grpc, model, x, out_bytes),
            }
            # The same answer every way.
            answers = [np.asarray(call()).ravel() for call in transports.values()]
            for other in answers[1:]:
                np.testing.assert_array_equal(other, answers[0])
            figures = {name: [] for name in transports}
            for _ in range(args.rounds):
                for name, call in transports.items():
                    figures[name].append(measure(proc.pid, call, args.duration))
            base = statistics.median(r for r, _ in figures["HTTP binary, TCP"])
            for name, measured in figures.items():
                rate = statistics.median(r for r, _ in measured)
                cpu = statistics.median(c for _, c in measured)
                rows.append((model, name, rate, cpu, rate / base))
        print(f"{'model':9} {'transport':26} {'req/s':>8} {'server CPU ms/req':>18} {'vs HTTP TCP':>12}")
        for model, name, rate, cpu, ratio in rows:
            print(f"{model:9} {name:26} {rate:8.1f} {cpu:18.2f} {ratio:11.2f}x")
    finally:
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
