"""Starts a real inferd (the binary `cargo test` built) on a free loopback port, serving the bundled models
(MiniLM for /embed); `start_inferd` serves any other repository the same way."""

import contextlib
import os
import pathlib
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def start_inferd(models, *args):
    """A running inferd serving the repository `models` with extra command-line `args`; yields its address once
    every model has loaded (or failed), and stops it afterwards, checking that it exits 0."""
    binary = os.environ.get("INFERD_BIN", str(ROOT / "target" / "debug" / "inferd"))
    lib = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"
    proc = subprocess.Popen(
        [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--models", str(models),
         "--onnxruntime-lib", str(lib), *args],
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
            with urllib.request.urlopen(f"http://{address}/health") as r:
                if b'"status":"starting"' not in r.read():
                    break
        except urllib.error.HTTPError as e:
            if b'"status":"starting"' not in e.read():
                break
        except OSError:
            pass
        time.sleep(0.05)
    try:
        yield address
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, "inferd exits 0 on SIGTERM"


@pytest.fixture(scope="session")
def server_url():
    with start_inferd(ROOT / "models", "--default-embed-model", "minilm") as address:
        yield address
