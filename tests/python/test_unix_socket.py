"""HTTP and gRPC on Unix domain sockets (`--unix-socket`, `--grpc-unix-socket`), for clients on the same host:
curl's `--unix-socket` and Triton's gRPC client on a `unix:` target get the answers TCP gives, behind the same API
key; the socket files have mode 0660, replace a stale socket left at the path, are refused where a server still
listens or another kind of file lies, and are gone at exit; SIGTERM drains the clients on a socket as it drains
TCP's."""

import json
import os
import signal
import socket
import stat
import subprocess
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, launch_inferd

DATA = json.loads((ROOT / "tests" / "data" / "digits_heldout.json").read_text())
PIXELS = np.array(DATA["pixels"], dtype=np.float32)
KEY = "unix-socket-key"


@pytest.fixture
def repository(tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "digits").symlink_to(ROOT / "models" / "digits", target_is_directory=True)
    return repo


def curl(sock, path, body=None, key=KEY):
    """`curl --unix-socket`: (status, JSON body)."""
    args = ["curl", "-sS", "--unix-socket", str(sock), "-o", "-", "-w", "\n%{http_code}", f"http://inferd{path}"]
    if key:
        args += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout
    text, status = out.rsplit("\n", 1)
    return int(status), json.loads(text) if text else None


def infer_body(rows):
    return {"inputs": [{"name": "input", "shape": [rows, 64], "datatype": "FP32",
                        "data": PIXELS[:rows].flatten().tolist()}]}


def stale_socket(path):
    """A socket file whose server is gone: bound, never listened on, closed."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


def test_http_and_grpc_answer_on_unix_sockets_and_the_files_go_at_exit(repository, tmp_path):
    http_sock, grpc_sock = tmp_path / "http.sock", tmp_path / "grpc.sock"
    stale_socket(http_sock)
    proc, address, _ = launch_inferd(repository, "--api-key", KEY, "--unix-socket", http_sock,
                                     "--grpc-unix-socket", grpc_sock)
    try:
        for sock in (http_sock, grpc_sock):
            mode = os.stat(sock).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660, oct(mode)
        # HTTP: the same answer as over TCP, the same key.
        status, over_socket = curl(http_sock, "/v2/models/digits/infer", infer_body(3))
        assert status == 200, over_socket
        tcp = subprocess.run(["curl", "-sS", "-H", f"Authorization: Bearer {KEY}", "-H",
                              "Content-Type: application/json", "--data-binary", json.dumps(infer_body(3)),
                              f"http://{address}/v2/models/digits/infer"], check=True, capture_output=True,
                             text=True).stdout
        assert over_socket["outputs"] == json.loads(tcp)["outputs"]
        status, body = curl(http_sock, "/v2/models/digits/infer", infer_body(1), key=None)
        assert status == 401, body
        assert curl(http_sock, "/health/ready", key=None)[0] == 200
        # gRPC on a unix: target. gRPC's C core (Python's, C++'s) names the socket's path as the :authority, which
        # the HTTP/2 server refuses as malformed; the client says `localhost`, as grpc-go does of itself.
        client = grpcclient.InferenceServerClient(f"unix://{grpc_sock}",
                                                  channel_args=[("grpc.default_authority", "localhost")])
        x = grpcclient.InferInput("input", [3, 64], "FP32")
        x.set_data_from_numpy(PIXELS[:3])
        got = client.infer("digits", [x], headers={"authorization": f"Bearer {KEY}"}).as_numpy("logits")
        assert np.allclose(got, np.array(over_socket["outputs"][0]["data"]).reshape(3, -1), atol=1e-5)
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.infer("digits", [x])
        # A second server at the same paths is refused: one is listening there.
        second = subprocess.run([str(ROOT / "target" / "debug" / "inferd"), "serve", "--port", "0", "--grpc-port",
                                 "0", "--models", str(repository), "--unix-socket", str(http_sock)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and "listening on it already" in second.stderr, second.stderr
        assert stat.S_ISSOCK(os.stat(http_sock).st_mode), "the refused server left the socket alone"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert not http_sock.exists() and not grpc_sock.exists(), "the socket files go at exit"


def test_a_path_that_is_not_a_socket_is_refused(repository, tmp_path):
    path = tmp_path / "not-a-socket"
    path.write_text("keep me")
    run = subprocess.run([str(ROOT / "target" / "debug" / "inferd"), "serve", "--port", "0", "--grpc-port", "0",
                          "--models", str(repository), "--unix-socket", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "not a socket" in run.stderr, run.stderr
    assert path.read_text() == "keep me"


def test_sigterm_drains_clients_on_the_socket(repository, tmp_path):
    """Clients keep sending over the socket; SIGTERM: every request sent is answered 200, and the socket goes."""
    sock = tmp_path / "http.sock"
    proc, _, _ = launch_inferd(repository, "--unix-socket", sock, "--drain-delay", "0.5")
    answers, failures, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                status, _ = curl(sock, "/v2/models/digits/infer", infer_body(4), key=None)
            except subprocess.CalledProcessError as e:
                # Once the drain stops taking connections, a new one finds no server: not a lost request.
                if e.returncode in (7, 56):
                    return
                failures.append(e.stderr)
                return
            (answers if status == 200 else failures).append(status)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        while len(answers) < 40 and not failures:
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if proc.poll() is None:
            proc.kill()
    assert not failures, failures[:5]
    assert len(answers) >= 40
    assert not sock.exists()
