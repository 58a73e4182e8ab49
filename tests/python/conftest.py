"""Starts a real inferd (the binary `cargo test` built) on a free loopback port, serving the bundled models
(MiniLM for /embed)."""

import os
import pathlib
import re
import subprocess
import threading
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server_url():
    binary = os.environ.get("INFERD_BIN", str(ROOT / "target" / "debug" / "inferd"))
    lib = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"
    proc = subprocess.Popen(
        [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--models", str(ROOT / "models"),
         "--onnxruntime-lib", str(lib), "--default-embed-model", "minilm"],
        stderr=subprocess.PIPE,
        text=True,
    )
    address = None
    log = []
    deadline = time.time() + 60
    while address is None and time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        match = re.search(r"listening addr=(\S+)", line)
        if match:
            address = match.group(1)
    if address is None:
        proc.kill()
        raise RuntimeError("inferd did not start:\n" + "".join(log))
    # Keep draining the log so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://{address}/v2/health/ready") as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    yield address
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "inferd exits 0 on SIGTERM"
