"""Triton's HTTP client, unchanged, against inferd's KServe v2 routes: metadata, JSON and binary tensors, FP16 on
both engines, compression and errors. Outputs are compared with float64 logits numpy computed when the bundled
models were made (tests/data/digits_heldout.json)."""

import json
import pathlib
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "tests" / "data" / "digits_heldout.json").read_text())
PIXELS = np.array(DATA["pixels"], dtype=np.float32)
REFERENCE = np.array(DATA["reference_logits"], dtype=np.float64)
FP32_MODELS = ["digits", "digits-candle"]
FP16_MODELS = ["digits-fp16", "digits-fp16-candle"]


@pytest.fixture(scope="module")
def client(server_url):
    return httpclient.InferenceServerClient(server_url)


def infer(client, model, rows=8, dtype="FP32", binary_in=True, binary_out=True, **kwargs):
    x = PIXELS[:rows].astype(np.float16 if dtype == "FP16" else np.float32)
    inp = httpclient.InferInput("input", list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("logits", binary_data=binary_out)
    return client.infer(model, [inp], outputs=[out], **kwargs)


def close_to_reference(logits, rows, tolerance):
    assert logits.shape == (rows, 10)
    np.testing.assert_allclose(logits.astype(np.float64), REFERENCE[:rows], rtol=tolerance, atol=tolerance)


def test_server_live_ready_and_metadata(client, server_url):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "inferd"
    assert "binary_tensor_data" in meta["extensions"]
    for path in ("/v2/health/live", "/v2/health/ready"):
        with urllib.request.urlopen(f"http://{server_url}{path}") as r:
            assert r.status == 200
            assert r.read() == b""


@pytest.mark.parametrize("model", FP32_MODELS + FP16_MODELS)
def test_model_metadata_config_and_ready(client, model):
    dtype = "FP16" if model in FP16_MODELS else "FP32"
    assert client.is_model_ready(model)
    assert client.is_model_ready(model, model_version="1")
    meta = client.get_model_metadata(model)
    assert meta["name"] == model
    assert meta["versions"] == ["1"]
    assert meta["platform"] == ("candle" if model.endswith("candle") else "onnxruntime_onnx")
    assert meta["inputs"] == [{"name": "input", "datatype": dtype, "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": dtype, "shape": [-1, 10]}]
    config = client.get_model_config(model)
    # Named as Triton names ONNX Runtime's backend and platform.
    assert (config["backend"], config["platform"]) == (
        ("candle", "candle") if model.endswith("candle") else ("onnxruntime", "onnxruntime_onnx"))
    assert config["max_batch_size"] == 64
    assert config["input"] == [{"name": "input", "data_type": f"TYPE_{dtype}", "format": "FORMAT_NONE", "dims": [64],
                                "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False}]
    assert config["output"] == [{"name": "logits", "data_type": f"TYPE_{dtype}", "dims": [10], "label_filename": "",
                                 "is_shape_tensor": False}]
    # Every key of Triton's configuration, so that code written against Triton's answer finds each.
    assert set(config) == {"name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
                           "output", "batch_input", "batch_output", "optimization", "dynamic_batching",
                           "instance_group", "default_model_filename", "cc_model_filenames", "metric_tags",
                           "parameters", "model_warmup"}
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["optimization"]["priority"] == "PRIORITY_DEFAULT"
    assert config["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "REJECT"
    (group,) = config["instance_group"]
    assert (group["name"], group["kind"], group["count"], group["gpus"]) == (model, "KIND_CPU", 1, [])
    assert config["default_model_filename"] == ("model.safetensors" if model.endswith("candle") else "model.onnx")
    assert config["parameters"]["device"] == {"string_value": "cpu"}


def test_model_names_may_arrive_url_quoted(server_url):
    with urllib.request.urlopen(f"http://{server_url}/v2/models/digits%2Dfp16") as r:
        assert json.loads(r.read())["name"] == "digits-fp16"


def test_repository_index_lists_every_model(client):
    index = client.get_model_repository_index()
    assert sorted(m["name"] for m in index) == sorted(FP32_MODELS + FP16_MODELS + ["minilm", "minilm-int8", "reranker", "classifier", "orientation",
                                                                        "splade", "ner"])
    assert all(m["state"] == "READY" and m["version"] == "1" for m in index)


@pytest.mark.parametrize("model", FP32_MODELS)
@pytest.mark.parametrize("binary_in,binary_out", [(False, False), (True, False), (False, True), (True, True)])
def test_infer_json_binary_and_mixed(client, model, binary_in, binary_out):
    result = infer(client, model, rows=8, binary_in=binary_in, binary_out=binary_out, request_id="req-7")
    close_to_reference(result.as_numpy("logits"), 8, 1e-4)
    response = result.get_response()
    assert response["model_name"] == model
    assert response["model_version"] == "1"
    assert response["id"] == "req-7"
    output = response["outputs"][0]
    assert ("binary_data_size" in output.get("parameters", {})) == binary_out


def test_a_batch_of_rows_classifies_the_digits(client):
    result = infer(client, "digits", rows=64)
    predicted = result.as_numpy("logits").argmax(axis=1)
    assert (predicted == np.array(DATA["labels"][:64])).mean() >= 0.95


def test_default_outputs_come_back_in_binary(client):
    inp = httpclient.InferInput("input", [2, 64], "FP32")
    inp.set_data_from_numpy(PIXELS[:2])
    result = client.infer("digits", [inp])
    close_to_reference(result.as_numpy("logits"), 2, 1e-4)


@pytest.mark.parametrize("model", FP16_MODELS)
@pytest.mark.parametrize("binary", [True, False])
def test_fp16_models_over_binary_and_json(client, model, binary):
    result = infer(client, model, rows=8, dtype="FP16", binary_in=binary, binary_out=binary)
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float16
    # FP16 weights and arithmetic: logits agree with the float64 reference to about 1e-2.
    close_to_reference(logits, 8, 2e-2)
    assert result.get_response()["outputs"][0]["datatype"] == "FP16"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses(client, algorithm):
    for binary in (True, False):
        result = infer(
            client,
            "digits",
            rows=8,
            binary_in=binary,
            binary_out=binary,
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        close_to_reference(result.as_numpy("logits"), 8, 1e-4)


def test_a_wrong_shape_raises_a_useful_error(client):
    inp = httpclient.InferInput("input", [1, 63], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 63), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("digits", [inp])
    assert e.value.status() == "400"
    assert "shape [1, 63] does not fit the model's [-1, 64]" in e.value.message()


def test_a_wrong_datatype_raises_a_useful_error(client):
    inp = httpclient.InferInput("input", [1, 64], "INT32")
    inp.set_data_from_numpy(np.zeros((1, 64), dtype=np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("digits", [inp])
    assert e.value.status() == "400"
    assert "the model takes FP32, got INT32" in e.value.message()


def test_an_unknown_model_raises_a_useful_error(client):
    inp = httpclient.InferInput("input", [1, 64], "FP32")
    inp.set_data_from_numpy(PIXELS[:1])
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet", [inp])
    assert e.value.status() == "404"
    assert "no model named `resnet`" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("resnet")
    assert "no model named `resnet`" in e.value.message()
    assert not client.is_model_ready("resnet")


def test_an_unknown_version_is_not_found(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("digits", model_version="2")
    assert "model `digits` has no version 2 (it has [1])" in e.value.message()


def test_statistics_grow_with_each_request(client):
    """Triton's statistics extension over HTTP, as `get_inference_statistics` reads it: the same counts gRPC's
    ModelStatistics gives."""
    assert "statistics" in client.get_server_metadata()["extensions"]
    (before,) = client.get_inference_statistics("digits")["model_stats"]
    infer(client, "digits", rows=5)
    (after,) = client.get_inference_statistics("digits", model_version="1")["model_stats"]
    assert (after["name"], after["version"]) == ("digits", "1")
    assert after["inference_count"] == before["inference_count"] + 5
    assert after["execution_count"] >= before["execution_count"] + 1
    queue, success = after["inference_stats"]["queue"], after["inference_stats"]["success"]
    assert queue["count"] == before["inference_stats"]["queue"]["count"] + 1
    assert success["count"] == before["inference_stats"]["success"]["count"] + 1 and success["ns"] > 0
    # The engine run's three steps, each request counting its batch's: joining inputs, running, splitting outputs.
    for step in ("compute_input", "compute_infer", "compute_output"):
        grown = after["inference_stats"][step]
        assert grown["count"] == before["inference_stats"][step]["count"] + 1 and grown["ns"] > 0, (step, grown)
    # By batch size: the run of 5 rows is among them.
    sizes = {b["batch_size"]: b for b in after["batch_stats"]}
    assert sizes[5]["compute_infer"]["count"] >= 1 and sizes[5]["compute_infer"]["ns"] > 0, sizes
    assert [b["batch_size"] for b in after["batch_stats"]] == sorted(sizes)
    (memory,) = after["memory_usage"]
    assert memory["type"] == "CPU" and memory["byte_size"] > 0, memory
    assert after["response_stats"] == {} and after["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    names = {s["name"] for s in client.get_inference_statistics()["model_stats"]}
    assert {"digits", "digits-candle"} <= names
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("no-such-model")
    assert "no model named" in str(e.value)
