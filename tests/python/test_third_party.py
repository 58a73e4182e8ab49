"""Third-party ONNX models as others exported them, taken out of PyPI wheels by scripts/fetch-test-models.sh:
magika's file-type classifier and RapidOCR's text detector (dynamic height and width, warmed at the shape its
model.toml gives), text-direction classifier and text recogniser. inferd answers what ONNX Runtime's own Python
API answers for the same file, over JSON and binary; and Triton's model repository API (the index, load, reload,
unload) works through tritonclient."""

import pathlib
import shutil

import numpy as np
import onnxruntime
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start_inferd

THIRD_PARTY = ROOT / "tests" / "data" / "third-party"
# Each model's input, the shapes sent (batch first), and how its data is drawn.
INPUTS = {
    "magika": ("bytes", [(1, 2048), (5, 2048)], lambda rng, shape: rng.integers(0, 257, shape, dtype=np.int32)),
    "ppocr-det": ("x", [(1, 3, 320, 320), (2, 3, 160, 224)], lambda rng, shape: rng.random(shape, dtype=np.float32)),
    "ppocr-cls": ("x", [(3, 3, 48, 192)], lambda rng, shape: rng.random(shape, dtype=np.float32) * 2 - 1),
    "ppocr-rec": ("x", [(1, 3, 48, 320), (2, 3, 48, 160)], lambda rng, shape: rng.random(shape, dtype=np.float32)),
}
CASES = [(model, shape) for model, (_, shapes, _) in INPUTS.items() for shape in shapes]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """A copy of the third-party models, which the model control test may add to."""
    repo = tmp_path_factory.mktemp("third-party")
    for model in INPUTS:
        shutil.copytree(THIRD_PARTY / model, repo / model)
    return repo


@pytest.fixture(scope="module")
def client(repository):
    with start_inferd(repository, "--model-control", "explicit") as address:
        yield httpclient.InferenceServerClient(address, network_timeout=120)


def reference(model, x):
    session = onnxruntime.InferenceSession(THIRD_PARTY / model / "model.onnx", providers=["CPUExecutionProvider"])
    name, _, _ = INPUTS[model]
    output = session.get_outputs()[0].name
    return output, session.run([output], {name: x})[0]


def ask(client, model, x, binary):
    name, _, _ = INPUTS[model]
    datatype = "INT32" if x.dtype == np.int32 else "FP32"
    tensor = httpclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=binary)
    output, _ = reference(model, x[:1])
    result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput(output, binary_data=binary)])
    return result.as_numpy(output)


@pytest.mark.parametrize("model,shape", CASES)
@pytest.mark.parametrize("binary", [False, True])
def test_outputs_equal_onnx_runtime_on_the_same_file(client, model, shape, binary):
    rng = np.random.default_rng(sum(shape) + binary)
    x = INPUTS[model][2](rng, shape)
    _, want = reference(model, x)
    got = ask(client, model, x, binary)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_every_model_warmed_at_its_configured_shapes(client):
    index = client.get_model_repository_index()
    assert sorted((m["name"], m["version"], m["state"]) for m in index) == [
        (model, "1", "READY") for model in sorted(INPUTS)
    ]
    for model in INPUTS:
        assert client.is_model_ready(model)
        config = client.get_model_config(model)
        assert config["max_batch_size"] > 0, "each graph has a batch dimension"


def test_models_load_reload_and_unload_through_tritonclient(client, repository):
    x = INPUTS["ppocr-cls"][2](np.random.default_rng(3), (2, 3, 48, 192))
    _, want = reference("ppocr-cls", x)
    client.unload_model("ppocr-cls")
    assert not client.is_model_ready("ppocr-cls")
    with pytest.raises(InferenceServerException) as e:
        ask(client, "ppocr-cls", x, True)
    assert e.value.status() == "503" and "not loaded: unloaded" in e.value.message()
    entry = next(m for m in client.get_model_repository_index() if m["name"] == "ppocr-cls")
    assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", "unloaded")
    client.load_model("ppocr-cls")
    assert client.is_model_ready("ppocr-cls")
    np.testing.assert_allclose(ask(client, "ppocr-cls", x, True), want, rtol=1e-5, atol=1e-6)
    # A reload of a model that is serving: it keeps answering the same.
    client.load_model("ppocr-cls")
    np.testing.assert_allclose(ask(client, "ppocr-cls", x, False), want, rtol=1e-5, atol=1e-6)
    # A model folder added while serving is listed, then loads on request: a fixed-batch graph, which serves
    # without a batch dimension.
    shutil.copytree(ROOT / "tests" / "data" / "models" / "fixed-batch", repository / "fixed-batch")
    entry = next(m for m in client.get_model_repository_index() if m["name"] == "fixed-batch")
    assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", "not loaded")
    client.load_model("fixed-batch")
    assert client.get_model_config("fixed-batch")["max_batch_size"] == 0
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 1, 1, 1]], dtype=np.float32))
    np.testing.assert_allclose(client.infer("fixed-batch", [tensor]).as_numpy("y"), [[2.5, 2.5]])
    # What Triton's client may send that inferd does not take: a configuration in the request.
    with pytest.raises(InferenceServerException) as e:
        client.load_model("ppocr-cls", config='{"max_batch_size": 2}')
    assert e.value.status() == "400" and "not supported" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.load_model("no-such-model")
    assert e.value.status() == "404"
