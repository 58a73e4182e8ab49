"""Triton's own gRPC client, unchanged, against inferd's KServe v2 gRPC service (`--grpc-port`): every RPC it calls,
numpy in and out for FP32, FP16, INT64 and BYTES (a text model), streams with many requests in flight, every error
status of the one error table, model control, the health service, a cancelled stream and the drain.

The repository is built per module from the bundled models: digits (FP32), digits-fp16, minilm (texts), `ids`
(the int8 MiniLM export served as plain tensors: INT64 token ids in, FP32 hidden states out; ONNX Runtime
itself refuses an id outside its vocabulary) and two copies of digits that wait long for full batches:
`slow` and `narrow` (a queue of one)."""

import concurrent.futures
import json
import queue
import re
import signal
import socket
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, launch_inferd, start_inferd

DATA = json.loads((ROOT / "tests" / "data" / "digits_heldout.json").read_text())
PIXELS = np.array(DATA["pixels"], dtype=np.float32)
REFERENCE = np.array(DATA["reference_logits"], dtype=np.float64)
KEY = "grpc-test-key"
# How long `slow` and `narrow` wait for a full batch.
SLOW_DELAY_US = 2_500_000
SLOW_BATCHING = """
[batching]
max_batch_size = 64
max_queue_delay_us = {delay}
max_queue_size = {queue}
"""


def link(repo, name, source=None):
    """repo/name as a link to the bundled model `source` (default: `name`)."""
    (repo / name).symlink_to(ROOT / "models" / (source or name), target_is_directory=True)


def slow_copy(repo, name, delay_us, queue_size):
    """digits, waiting up to `delay_us` for a full batch, with a queue of `queue_size` requests."""
    folder = repo / name
    folder.mkdir()
    (folder / "model.onnx").symlink_to(ROOT / "models" / "digits" / "model.onnx")
    (folder / "model.toml").write_text('backend = "onnx"\nfile = "model.onnx"\n'
                                       + SLOW_BATCHING.format(delay=delay_us, queue=queue_size))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("grpc-models")
    for name in ("digits", "digits-fp16", "minilm"):
        link(repo, name)
    ids = repo / "ids"
    ids.mkdir()
    (ids / "model.onnx").symlink_to(ROOT / "models" / "minilm-int8" / "model.onnx")
    (ids / "model.toml").write_text('backend = "onnx"\nfile = "model.onnx"\n')
    slow_copy(repo, "slow", SLOW_DELAY_US, 256)
    slow_copy(repo, "narrow", SLOW_DELAY_US, 1)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with start_inferd(repository, "--model-control", "explicit", "--max-body-bytes", str(1 << 20),
                      grpc=True) as addresses:
        yield addresses


@pytest.fixture(scope="module")
def client(server):
    return grpcclient.InferenceServerClient(server[1])


def digits_input(rows=8, dtype=np.float32, name="input"):
    x = PIXELS[:rows].astype(dtype)
    tensor = grpcclient.InferInput(name, list(x.shape), "FP16" if dtype == np.float16 else "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def error_of(call):
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


def metric(http_address, name, **labels):
    """A sample of inferd's /metrics, 0 where absent."""
    with urllib.request.urlopen(f"http://{http_address}/metrics") as r:
        text = r.read().decode()
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(selector)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_server_and_model_rpcs(server, client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "inferd"
    # The same extensions on both protocols, as Triton lists them; every one of them served.
    over_http = httpclient.InferenceServerClient(server[0]).get_server_metadata()["extensions"]
    assert list(meta.extensions) == over_http
    assert set(over_http) == {"binary_tensor_data", "classification", "model_repository", "model_configuration",
                              "system_shared_memory", "statistics", "trace", "logging"}
    assert client.is_model_ready("digits")
    assert client.is_model_ready("digits", model_version="1")
    # A model or version the server does not have is not ready, as Triton answers, rather than an error.
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("digits", model_version="7")
    assert not client.is_model_ready("digits", model_version="one")
    model = client.get_model_metadata("digits", as_json=True)
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert model["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["-1", "10"]}]
    config = client.get_model_config("digits", as_json=True)["config"]
    assert (config["backend"], config["platform"]) == ("onnxruntime", "onnxruntime_onnx")
    assert config["max_batch_size"] == 64
    # Protobuf's JSON leaves out what holds its default (false, 0, FORMAT_NONE, empty lists).
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": ["64"]}]
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 1024
    assert config["dynamic_batching"]["default_queue_policy"]["allow_timeout_override"] is True
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"][0]["name"] == "digits" and config["default_model_filename"] == "model.onnx"
    assert config["parameters"]["device"] == {"string_value": "cpu"}
    assert "optimization" in config
    text = client.get_model_config("minilm", as_json=True)["config"]
    assert text["input"][0]["data_type"] == "TYPE_STRING"
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} == {"digits", "digits-fp16", "minilm", "ids", "slow", "narrow"}
    assert all(m["state"] == "READY" for m in index)


def test_fp32_numpy_in_and_out_and_statistics_grow(client):
    before = client.get_inference_statistics("digits", as_json=True)["model_stats"][0]
    result = client.infer("digits", [digits_input(8)], request_id="r-8")
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float32 and logits.shape == (8, 10)
    np.testing.assert_allclose(logits.astype(np.float64), REFERENCE[:8], rtol=1e-4, atol=1e-4)
    assert result.get_response().id == "r-8"
    after = client.get_inference_statistics("digits", as_json=True)["model_stats"][0]
    assert after["version"] == "1"
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 8
    queued = lambda s: int(s.get("inference_stats", {}).get("queue", {}).get("count", 0))
    assert queued(after) == queued(before) + 1
    for step in ("compute_input", "compute_infer", "compute_output"):
        assert int(after["inference_stats"][step]["ns"]) > int(before["inference_stats"].get(step, {}).get("ns", 0))
    assert any(int(b["batch_size"]) == 8 for b in after["batch_stats"]), after["batch_stats"]
    assert after["memory_usage"][0]["type"] == "CPU" and int(after["memory_usage"][0]["byte_size"]) > 0


def test_typed_contents_work_as_raw_does(server):
    """A request with `contents` (what other gRPC clients send) rather than `raw_input_contents`."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server[1]))
    request = service_pb2.ModelInferRequest(model_name="digits")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 64])
    tensor.contents.fp32_contents.extend(PIXELS[:2].ravel().tolist())
    response = stub.ModelInfer(request)
    logits = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 10)
    np.testing.assert_allclose(logits.astype(np.float64), REFERENCE[:2], rtol=1e-4, atol=1e-4)


def test_fp16_numpy_in_and_out(client):
    result = client.infer("digits-fp16", [digits_input(8, np.float16)])
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float16 and logits.shape == (8, 10)
    np.testing.assert_allclose(logits.astype(np.float64), REFERENCE[:8], rtol=2e-2, atol=2e-2)


def test_int64_numpy_in_and_out(client):
    ids = np.array([[101, 7592, 2088, 102], [101, 2088, 102, 0]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    inputs = []
    for name, value in (("input_ids", ids), ("attention_mask", mask), ("token_type_ids", np.zeros_like(ids))):
        tensor = grpcclient.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    hidden = client.infer("ids", inputs).as_numpy("last_hidden_state")
    assert hidden.dtype == np.float32 and hidden.shape == (2, 4, 384)
    assert np.isfinite(hidden).all()


def test_bytes_texts_embed_as_over_http(server, client):
    texts = np.array(["a cat sat on the mat", "gRPC carries tensors", "é ü ß"], dtype=object)
    tensor = grpcclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(texts)
    got = client.infer("minilm", [tensor]).as_numpy("embedding")
    assert got.dtype == np.float32 and got.shape == (3, 384)
    http = httpclient.InferenceServerClient(server[0])
    over_http = httpclient.InferInput("text", [len(texts)], "BYTES")
    over_http.set_data_from_numpy(texts)
    np.testing.assert_array_equal(got, http.infer("minilm", [over_http]).as_numpy("embedding"))
    # The `dimensions` parameter: the first dimensions, renormalised; out of range, INVALID_ARGUMENT; a model that
    # gives no embeddings refuses it rather than leave it unread.
    short = client.infer("minilm", [tensor], parameters={"dimensions": 64}).as_numpy("embedding")
    want = got[:, :64] / np.linalg.norm(got[:, :64], axis=1, keepdims=True)
    assert short.shape == (3, 64) and np.max(np.abs(short - want)) < 1e-6
    for model, inputs, dimensions, words in (("minilm", [tensor], 385, "cannot lengthen"),
                                             ("minilm", [tensor], 0, "at least 1"),
                                             ("digits", [digits_input()], 8, "shortens an embedding model")):
        with pytest.raises(InferenceServerException) as e:
            client.infer(model, inputs, parameters={"dimensions": dimensions})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and words in e.value.message(), e.value


def test_every_error_status(client, server):
    bad_shape = grpcclient.InferInput("input", [2, 63], "FP32")
    bad_shape.set_data_from_numpy(np.zeros((2, 63), dtype=np.float32))
    e = error_of(lambda: client.infer("digits", [bad_shape]))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "does not fit" in e.message()
    e = error_of(lambda: client.infer("no-such-model", [digits_input(1)]))
    assert e.status() == "StatusCode.NOT_FOUND" and "no model named" in e.message()
    e = error_of(lambda: client.infer("digits", [digits_input(1)], model_version="7"))
    assert e.status() == "StatusCode.NOT_FOUND"
    # Past --max-body-bytes (1 MiB): refused from the message's length, before it is read.
    big = grpcclient.InferInput("input", [4096 + 1024, 64], "FP32")
    big.set_data_from_numpy(np.zeros((4096 + 1024, 64), dtype=np.float32))
    e = error_of(lambda: client.infer("digits", [big]))
    assert e.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--max-body-bytes" in e.message()
    # An id outside the vocabulary is refused by ONNX Runtime itself: the client's input, INVALID_ARGUMENT.
    ids = grpcclient.InferInput("input_ids", [1, 2], "INT64")
    ids.set_data_from_numpy(np.array([[101, 10**9]], dtype=np.int64))
    others = []
    for name in ("attention_mask", "token_type_ids"):
        t = grpcclient.InferInput(name, [1, 2], "INT64")
        t.set_data_from_numpy(np.ones((1, 2), dtype=np.int64))
        others.append(t)
    e = error_of(lambda: client.infer("ids", [ids] + others))
    assert e.status() == "StatusCode.INVALID_ARGUMENT", e
    # Finite inputs whose logits overflow to infinity: the model's answer is not one inferd gives, INTERNAL.
    huge = grpcclient.InferInput("input", [1, 64], "FP32")
    huge.set_data_from_numpy(np.full((1, 64), 3e38, dtype=np.float32))
    e = error_of(lambda: client.infer("digits", [huge]))
    assert e.status() == "StatusCode.INTERNAL" and "finite numbers only" in e.message(), e
    # The queue's own deadline (the request's `timeout` parameter, µs) passes while `slow` waits for a batch.
    e = error_of(lambda: client.infer("slow", [digits_input(1)], timeout=200_000))
    assert e.status() == "StatusCode.DEADLINE_EXCEEDED", e
    # grpc-timeout: the server answers DEADLINE_EXCEEDED too (the client may say so first).
    e = error_of(lambda: client.infer("slow", [digits_input(1)], client_timeout=0.3))
    assert e.status() == "StatusCode.DEADLINE_EXCEEDED", e
    # A queue of one: of two requests waiting together, one is shed.
    def outcome():
        try:
            return client.infer("narrow", [digits_input(1)]).as_numpy("logits").shape
        except InferenceServerException as e:
            return e.status()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda _: outcome(), range(2)))
    assert sorted(map(str, outcomes)) == ["(1, 10)", "StatusCode.RESOURCE_EXHAUSTED"], outcomes
    # Shared memory off (no --allow-client-shm): no regions, and registering says how to turn it on.
    assert len(client.get_system_shared_memory_status().regions) == 0
    e = error_of(lambda: client.register_system_shared_memory("r", "/inferd-none", 8))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "--allow-client-shm" in e.message(), e


def test_model_control_load_and_unload(client):
    client.unload_model("slow")
    assert not client.is_model_ready("slow")
    e = error_of(lambda: client.infer("slow", [digits_input(1)]))
    assert e.status() == "StatusCode.UNAVAILABLE", e
    index = {m["name"]: m["state"] for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["slow"] == "UNAVAILABLE"
    client.load_model("slow")
    assert client.is_model_ready("slow")
    e = error_of(lambda: client.load_model("no-such-folder"))
    assert e.status() == "StatusCode.NOT_FOUND", e


def test_a_stream_of_200_requests_to_two_models_each_answered_by_id(client):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        sent = {}
        for i in range(200):
            model = "digits" if i % 2 else "digits-fp16"
            rows = 1 + i % 4
            dtype = np.float32 if model == "digits" else np.float16
            client.async_stream_infer(model, [digits_input(rows, dtype)], request_id=f"req-{i}")
            sent[f"req-{i}"] = (model, rows)
        seen = {}
        for _ in range(200):
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            seen[response.id] = (response.model_name, result.as_numpy("logits").shape[0])
        assert seen == sent
    finally:
        client.stop_stream()


def test_an_error_in_a_stream_leaves_it_open(client):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        bad = grpcclient.InferInput("input", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        client.async_stream_infer("digits", [bad], request_id="bad")
        result, error = answers.get(timeout=30)
        assert result is None and "does not fit" in str(error)
        client.async_stream_infer("no-such-model", [digits_input(1)], request_id="unknown")
        result, error = answers.get(timeout=30)
        assert result is None and "no model named" in str(error)
        client.async_stream_infer("digits", [digits_input(2)], request_id="good")
        result, error = answers.get(timeout=30)
        assert error is None and result.get_response().id == "good"
    finally:
        client.stop_stream()


def test_health_service_and_api_key(repository):
    with start_inferd(repository / "digits", "--api-key", KEY, grpc=True) as (_, address):
        channel = grpc.insecure_channel(address)
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        # HealthCheckRequest{service}, HealthCheckResponse{status = 1: SERVING}: no key needed for probes. The
        # status follows readiness within a moment.
        deadline = time.time() + 5
        while check(b"") != b"\x08\x01" and time.time() < deadline:
            time.sleep(0.05)
        assert check(b"") == b"\x08\x01"
        service = b"inference.GRPCInferenceService"
        assert check(b"\x0a" + bytes([len(service)]) + service) == b"\x08\x01"
        client = grpcclient.InferenceServerClient(address)
        assert client.is_server_live()
        e = error_of(lambda: client.infer("digits", [digits_input(1)]))
        assert e.status() == "StatusCode.UNAUTHENTICATED" and "API key" in e.message()
        e = error_of(lambda: client.infer("digits", [digits_input(1)], headers={"authorization": "Bearer wrong"}))
        assert e.status() == "StatusCode.UNAUTHENTICATED"
        result = client.infer("digits", [digits_input(1)], headers={"authorization": f"Bearer {KEY}"})
        assert result.as_numpy("logits").shape == (1, 10)


def test_a_cancelled_stream_frees_its_queued_work(server, client):
    """Requests queued on `slow` (which waits 2.5 s for a full batch) by a stream that is then cancelled never run:
    no batch of theirs is counted, and the queue empties."""
    http = server[0]
    batches = lambda: metric(http, "inferd_batch_size_rows_count", model="slow")
    depth = lambda: metric(http, "inferd_queue_depth", model="slow")
    before = batches()
    client.start_stream(callback=lambda result, error: None)
    sent = time.time()
    for i in range(5):
        client.async_stream_infer("slow", [digits_input(1)], request_id=f"c-{i}")
    while depth() < 5 and time.time() < sent + 1.0:
        time.sleep(0.05)
    assert depth() == 5
    client.stop_stream(cancel_requests=True)
    # Past the moment the batch would have run.
    time.sleep(max(0.0, sent + SLOW_DELAY_US / 1e6 + 0.5 - time.time()))
    assert depth() == 0
    assert batches() == before, "a cancelled request ran"
    assert metric(http, "inferd_requests_in_flight", model="slow", protocol="grpc") == 0


def test_the_drain_loses_nothing_over_grpc(repository):
    """64 clients, unary and streaming, under load; SIGTERM: every request sent is answered, none with an error."""
    proc, _, address = launch_inferd(repository / "digits", "--drain-timeout", "20", grpc=True)
    stop = threading.Event()
    outcomes = {"ok": 0, "errors": []}
    lock = threading.Lock()

    def unary():
        client = grpcclient.InferenceServerClient(address)
        while not stop.is_set():
            try:
                client.infer("digits", [digits_input(2)])
                with lock:
                    outcomes["ok"] += 1
            except InferenceServerException as e:
                # Once the server stops taking connections, a new call may find no server: not a lost request.
                if "UNAVAILABLE" in str(e.status()) and "connect" in e.message().lower():
                    return
                with lock:
                    outcomes["errors"].append(f"unary: {e}")
                return

    def streaming():
        client = grpcclient.InferenceServerClient(address)
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put(error))
        sent = 0
        try:
            while not stop.is_set():
                client.async_stream_infer("digits", [digits_input(1)])
                sent += 1
                error = answers.get(timeout=30)
                with lock:
                    if error is None:
                        outcomes["ok"] += 1
                    else:
                        outcomes["errors"].append(f"stream: {error}")
                        return
        finally:
            client.stop_stream()

    threads = [threading.Thread(target=unary if i % 2 else streaming) for i in range(64)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert proc.wait(timeout=30) == 0
    assert outcomes["errors"] == [], outcomes["errors"][:5]
    assert outcomes["ok"] > 64


def test_the_in_flight_budget_counts_a_message_as_it_arrives(repository):
    """A message larger than the whole --max-inflight-bytes (1 MiB) is refused while it arrives, not once read."""
    with start_inferd(repository / "digits", "--max-inflight-bytes", str(1 << 20), "--max-body-bytes", str(8 << 20),
                      grpc=True) as (_, address):
        client = grpcclient.InferenceServerClient(address)
        e = error_of(lambda: client.infer("digits", [digits_input_of(np.zeros((4096, 64), dtype=np.float32))]))
        assert e.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--max-inflight-bytes" in e.message(), e
        # The refused message's bytes came back: a request within the budget is served.
        assert client.infer("digits", [digits_input(8)]).as_numpy("logits").shape == (8, 10)


def digits_input_of(x):
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def test_a_silent_connection_is_closed_and_watchers_do_not_hold_the_drain(repository):
    """A TCP connection that never speaks is closed after --header-read-timeout; a health Watch stream hears
    NOT_SERVING when the drain begins and then ends, so SIGTERM finishes in well under --drain-timeout."""
    proc, _, address = launch_inferd(repository / "digits", "--header-read-timeout", "1", "--drain-timeout", "20",
                                     grpc=True)
    try:
        host, port = address.split(":")
        with socket.create_connection((host, int(port))) as silent:
            silent.settimeout(10)
            started = time.time()
            assert silent.recv(1) == b""
            assert time.time() - started < 5
        channel = grpc.insecure_channel(address)
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        statuses = watch(b"")
        deadline = time.time() + 5
        status = next(statuses)
        while status != b"\x08\x01" and time.time() < deadline:
            status = next(statuses)
        assert status == b"\x08\x01"
        stopped = time.time()
        proc.send_signal(signal.SIGTERM)
        assert list(statuses) == [b"\x08\x02"]
        assert proc.wait(timeout=15) == 0
        assert time.time() - stopped < 10
    finally:
        proc.kill()
