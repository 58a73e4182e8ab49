"""Starts a real inferd (the binary `cargo test` built) on a free loopback port, serving the bundled models
(MiniLM for /embed); `start_inferd` serves any other repository the same way."""

import contextlib
import json
import os
import pathlib
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port():
    """A TCP port nothing listens on now (the kernel's pick), for a listener that cannot take port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_inferd(models, *args, grpc=False, keep_log=None, env=None):
    """Starts inferd serving the repository `models` with extra command-line `args` and environment variables `env`
    (beside this process's), on free ports (gRPC too with `grpc`, else none); returns `(process, http_address,
    grpc_address or None)` once every model has loaded (or failed). The caller stops it. `keep_log`, a list,
    receives each line the server logs."""
    binary = os.environ.get("INFERD_BIN", str(ROOT / "target" / "debug" / "inferd"))
    lib = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"
    grpc_port = free_port() if grpc else 0
    proc = subprocess.Popen(
        [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", str(grpc_port),
         "--models", str(models), "--onnxruntime-lib", str(lib), *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
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
    if keep_log is not None:
        keep_log.extend(log)
    # Keep draining the log so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [keep_log is not None and keep_log.append(line) for line in proc.stderr],
                     daemon=True).start()
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
    return proc, address, (f"127.0.0.1:{grpc_port}" if grpc else None)


@contextlib.contextmanager
def start_inferd(models, *args, grpc=False, env=None, keep_log=None):
    """A running inferd (see `launch_inferd`); yields its address, or `(http_address, grpc_address)` with `grpc`,
    and stops it afterwards, checking that it exits 0."""
    proc, address, grpc_address = launch_inferd(models, *args, grpc=grpc, env=env, keep_log=keep_log)
    try:
        yield (address, grpc_address) if grpc else address
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, "inferd exits 0 on SIGTERM"


@pytest.fixture(scope="session")
def server_url():
    with start_inferd(ROOT / "models", "--default-embed-model", "minilm") as address:
        yield address


def post(url, body, headers=None, timeout=60):
    """POSTs `body` as JSON; returns (status, the answer's JSON), an error status included."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json",
                                                                       **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
