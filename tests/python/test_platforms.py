"""The hosting platforms' container contracts, as their documentation gives them, against the real binary started the
way each platform starts a container: only its environment says where to listen and what to serve.

- SageMaker (docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-inference-code.html): the container runs as
  `<image> serve`, listens on SAGEMAKER_BIND_TO_PORT (8080 without it), answers `GET /ping` with 200 once ready and
  `POST /invocations` with the model's answer.
- Vertex AI (cloud.google.com/vertex-ai/docs/predict/custom-container-requirements): listens on AIP_HTTP_PORT, answers
  AIP_HEALTH_ROUTE with 200 once ready, and AIP_PREDICT_ROUTE's `{"instances": [...], "parameters": {...}}` with
  `{"predictions": [...]}`, one per instance, in order.
- `inferd healthcheck` (the images' HEALTHCHECK) asks the port the server picked from the same variables."""

import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, free_port, post

BINARY = os.environ.get("INFERD_BIN", str(ROOT / "target" / "debug" / "inferd"))
LIB = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"
MINILM = ROOT / "models" / "minilm"


def start(environment):
    """inferd as a platform starts it: `inferd serve`, everything else from the environment; waits until ready."""
    env = {"PATH": os.environ.get("PATH", ""), "MODEL_PATH": str(MINILM), "INFERD_ONNXRUNTIME_LIB": str(LIB),
           "INFERD_HOST": "127.0.0.1", "INFERD_GRPC_PORT": "0", **environment}
    proc = subprocess.Popen([BINARY, "serve"], env=env, stderr=subprocess.DEVNULL)
    return proc, env


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()



def wait_ready(url):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if get(url)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered 200")


def stop(proc):
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_sagemaker_container_contract():
    port = free_port()
    proc, env = start({"SAGEMAKER_BIND_TO_PORT": str(port)})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/ping")
        status, embedded = post(f"{base}/invocations", {"inputs": ["What is dynamic batching?", "GPUs"]})
        assert status == 200 and len(embedded) == 2 and len(embedded[0]) == 384
        status, direct = post(f"{base}/embed", {"inputs": ["What is dynamic batching?", "GPUs"]})
        assert max(abs(a - b) for a, b in zip(embedded[0], direct[0])) < 1e-6
        # The images' HEALTHCHECK finds the port the same way.
        check = subprocess.run([BINARY, "healthcheck"], env=env, capture_output=True, timeout=30)
        assert check.returncode == 0, check.stderr
    finally:
        stop(proc)


def test_vertex_ai_container_contract():
    port = free_port()
    predict, health = "/v1/endpoints/123/deployedModels/456:predict", "/v1/endpoints/123/deployedModels/456"
    proc, env = start({"AIP_HTTP_PORT": str(port), "AIP_PREDICT_ROUTE": predict, "AIP_HEALTH_ROUTE": health})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}{health}")
        body = {"instances": [{"inputs": "What is dynamic batching?"}, {"inputs": ["GPUs", "TPUs"]}],
                "parameters": {"anything": 1}}
        status, answer = post(f"{base}{predict}", body)
        assert status == 200 and list(answer) == ["predictions"]
        predictions = answer["predictions"]
        assert [len(p) for p in predictions] == [1, 2] and len(predictions[1][0]) == 384
        status, direct = post(f"{base}/embed", {"inputs": ["GPUs", "TPUs"]})
        assert max(abs(a - b) for a, b in zip(predictions[1][1], direct[1])) < 1e-6
        check = subprocess.run([BINARY, "healthcheck"], env=env, capture_output=True, timeout=30)
        assert check.returncode == 0, check.stderr
    finally:
        stop(proc)


@pytest.mark.parametrize("route", ["v1/predict", "/a/:b", "/a b"])
def test_a_route_vertex_ai_could_not_mean_is_refused_at_start(route):
    run = subprocess.run([BINARY, "serve", "--aip-predict-route", route], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ.get("PATH", "")})
    assert run.returncode != 0 and "is not a route" in run.stderr, run.stderr
