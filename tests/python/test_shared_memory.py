"""Triton's system shared-memory extension, driven by tritonclient's own `tritonclient.utils.shared_memory` over HTTP
and gRPC: regions registered, inputs read from and outputs written to them on digits and `wide` (the answers those
of the same request sent in the body), status, unregister; each mistake (an unknown region, a region larger than
its object, an offset past the end, a key that is a path, a span too small for the answer) refused as the client's
(400 / INVALID_ARGUMENT) with what was wrong; regions unregistered and registered again while requests use them
break none; an object that shrinks under its region fails that region's requests (400) and never the server; an
output that overflows is refused before it reaches the region; a SIGBUS sent from outside still ends the server;
the API key applies; /metrics counts the regions; off without --allow-client-shm; and perf_analyzer's
`--shared-memory system` runs clean over both protocols."""

import base64
import csv
import os
import re
import signal
import subprocess
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import ROOT, launch_inferd, start_inferd

KEY = "shm-key"
PERF_ANALYZER = ROOT / ".cache" / "perf-analyzer" / "bin" / "perf_analyzer"
CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("models")
    (repo / "digits").symlink_to(ROOT / "models" / "digits", target_is_directory=True)
    (repo / "wide").symlink_to(ROOT / ".cache" / "models" / "wide", target_is_directory=True)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with start_inferd(repository, "--allow-client-shm", "--api-key", KEY, grpc=True) as addresses:
        yield addresses


def client_for(protocol, server):
    http, grpc = server
    # A new dict each call: tritonclient's HTTP client writes Inference-Header-Content-Length into the one it gets.
    def auth():
        return {"authorization": f"Bearer {KEY}"}

    if protocol == "http":
        return httpclient.InferenceServerClient(http), auth
    return grpcclient.InferenceServerClient(grpc), auth


@pytest.fixture
def regions(request):
    """Makes regions with tritonclient's helper; destroys them after the test."""
    made = []

    def make(name, byte_size):
        handle = shm.create_shared_memory_region(name, f"/inferd-test-{os.getpid()}-{name}", byte_size)
        made.append(handle)
        return handle, f"/inferd-test-{os.getpid()}-{name}"

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def rows_for(model, rows):
    rng = np.random.default_rng(7)
    width = 64 if model == "digits" else 512
    return (rng.random((rows, width)) * 16).astype(np.float32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model,rows", [("digits", 3), ("wide", 64)])
def test_inputs_and_outputs_in_shared_memory_answer_as_the_body_does(server, regions, protocol, model, rows):
    client, auth = client_for(protocol, server)
    lib = CLIENTS[protocol]
    x = rows_for(model, rows)
    expected_in = lib.InferInput("input", list(x.shape), "FP32")
    expected_in.set_data_from_numpy(x)
    expected = client.infer(model, [expected_in], headers=auth()).as_numpy("logits")

    region_in, key_in = regions(f"{protocol}-{model}-in", x.nbytes + 16)
    region_out, key_out = regions(f"{protocol}-{model}-out", expected.nbytes + 8)
    shm.set_shared_memory_region(region_in, [x], offset=16)
    client.unregister_system_shared_memory(headers=auth())
    client.register_system_shared_memory("in", key_in, x.nbytes + 16, headers=auth())
    client.register_system_shared_memory("out", key_out, expected.nbytes + 8, headers=auth())
    status = client.get_system_shared_memory_status(headers=auth())
    if protocol == "http":
        listed = {r["name"]: (r["key"], int(r["offset"]), int(r["byte_size"])) for r in status}
    else:
        listed = {n: (r.key, r.offset, r.byte_size) for n, r in status.regions.items()}
    assert listed == {"in": (key_in, 0, x.nbytes + 16), "out": (key_out, 0, expected.nbytes + 8)}

    given = lib.InferInput("input", list(x.shape), "FP32")
    given.set_shared_memory("in", x.nbytes, offset=16)
    wanted = lib.InferRequestedOutput("logits")
    wanted.set_shared_memory("out", expected.nbytes + 8, offset=0)
    result = client.infer(model, [given], outputs=[wanted], headers=auth())
    (output,) = result.get_response()["outputs"] if protocol == "http" else result.get_response(as_json=True)["outputs"]
    assert output["shape"] in ([rows, 10], [str(rows), "10"]), output
    got = shm.get_contents_as_numpy(region_out, np.float32, [rows, 10])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)

    metrics = urllib.request.urlopen(urllib.request.Request(f"http://{server[0]}/metrics", headers=auth())).read()
    assert b'inferd_shared_memory_regions{kind="system"} 2' in metrics
    assert f'inferd_shared_memory_bytes{{kind="system"}} {x.nbytes + expected.nbytes + 24}'.encode() in metrics
    assert b'inferd_shared_memory_regions{kind="cuda"} 0' in metrics

    client.unregister_system_shared_memory("in", headers=auth())
    remaining = client.get_system_shared_memory_status(headers=auth())
    names = [r["name"] for r in remaining] if protocol == "http" else list(remaining.regions)
    assert names == ["out"]
    client.unregister_system_shared_memory(headers=auth())


def refused(call):
    """The message of the 400 / INVALID_ARGUMENT `call` raises."""
    with pytest.raises(InferenceServerException) as e:
        call()
    status = str(e.value.status())
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), f"{status}: {e.value.message()}"
    return e.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_mistake_is_the_clients_with_what_was_wrong(server, regions, protocol):
    client, auth = client_for(protocol, server)
    lib = CLIENTS[protocol]
    x = rows_for("digits", 2)
    region, key = regions(f"{protocol}-mistakes", x.nbytes)
    shm.set_shared_memory_region(region, [x])
    client.unregister_system_shared_memory(headers=auth())

    message = refused(lambda: client.register_system_shared_memory("big", key, x.nbytes + 1, headers=auth()))
    assert "too small" in message, message
    for path in ["/dev/shm/" + key.lstrip("/"), "../" + key.lstrip("/"), "/a/b"]:
        message = refused(lambda: client.register_system_shared_memory("path", path, 8, headers=auth()))
        assert "not a POSIX shared-memory name" in message, message
    message = refused(lambda: client.register_system_shared_memory("none", "/inferd-no-such-object", 8, headers=auth()))
    assert "cannot open shared memory object" in message, message
    client.register_system_shared_memory("x", key, x.nbytes, headers=auth())
    message = refused(lambda: client.register_system_shared_memory("x", key, x.nbytes, headers=auth()))
    assert "registered already" in message, message

    def infer(region="x", size=x.nbytes, offset=0, out=None):
        given = lib.InferInput("input", list(x.shape), "FP32")
        given.set_shared_memory(region, size, offset=offset)
        outputs = None
        if out:
            outputs = [lib.InferRequestedOutput("logits")]
            outputs[0].set_shared_memory(*out)
        return client.infer("digits", [given], outputs=outputs, headers=auth())

    assert "region `nowhere` is not registered" in refused(lambda: infer(region="nowhere"))
    message = refused(lambda: infer(offset=8))
    assert f"run past the end of shared memory region `x`, which holds {x.nbytes} bytes" in message, message
    message = refused(lambda: infer(size=x.nbytes - 4))
    assert "needs 512 bytes" in message, message
    message = refused(lambda: infer(out=("x", 8)))
    assert "output `logits`: it needs 80 bytes, but its span of shared memory region `x`" in message, message
    assert "is not registered" in refused(lambda: client.get_system_shared_memory_status("nowhere", headers=auth()))
    message = refused(lambda: client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64, headers=auth()))
    assert "CUDA shared memory" in message and "system shared memory" in message, message
    client.unregister_cuda_shared_memory(headers=auth())
    client.unregister_system_shared_memory(headers=auth())


def shared_call(client, lib, auth, x, out_bytes):
    """A digits request with its input in region `in` and its logits in region `out`."""
    given = lib.InferInput("input", list(x.shape), "FP32")
    given.set_shared_memory("in", x.nbytes)
    wanted = lib.InferRequestedOutput("logits")
    wanted.set_shared_memory("out", out_bytes)
    return lambda: client.infer("digits", [given], outputs=[wanted], headers=auth())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_object_that_shrinks_under_its_region_fails_its_requests_not_the_server(server, regions, protocol):
    client, auth = client_for(protocol, server)
    lib = CLIENTS[protocol]
    x = rows_for("digits", 2)
    expected_in = lib.InferInput("input", list(x.shape), "FP32")
    expected_in.set_data_from_numpy(x)
    expected = client.infer("digits", [expected_in], headers=auth()).as_numpy("logits")
    client.unregister_system_shared_memory(headers=auth())
    for side in ("in", "out"):
        made = {name: regions(f"{protocol}-shrink-{side}-{name}", 8192) for name in ("in", "out")}
        shm.set_shared_memory_region(made["in"][0], [x])
        for name, (_, key) in made.items():
            client.register_system_shared_memory(name, key, 8192, headers=auth())
        infer = shared_call(client, lib, auth, x, expected.nbytes)
        infer()
        # The client cuts the object to nothing under its registered region: the server, which had its pages
        # mapped, fails this request and the next ones that name the region, and stays up.
        path = "/dev/shm/" + made[side][1].lstrip("/")
        os.truncate(path, 0)
        for _ in range(2):
            message = refused(infer)
            assert f"region `{side}` lost its memory" in message and "register it again" in message, message
        assert client.is_server_live(headers=auth())
        # The object whole again and the region registered again, it serves.
        os.truncate(path, 8192)
        shm.set_shared_memory_region(made["in"][0], [x])
        client.unregister_system_shared_memory(side, headers=auth())
        client.register_system_shared_memory(side, made[side][1], 8192, headers=auth())
        infer()
        got = shm.get_contents_as_numpy(made["out"][0], np.float32, list(expected.shape))
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        client.unregister_system_shared_memory(headers=auth())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_that_overflows_is_refused_before_it_reaches_shared_memory(server, regions, protocol):
    client, auth = client_for(protocol, server)
    lib = CLIENTS[protocol]
    # Finite inputs whose logits overflow to infinity: scanned as they are written to the region, which keeps
    # what it held.
    x = np.full((1, 64), 3e38, np.float32)
    region_in, key_in = regions(f"{protocol}-overflow-in", x.nbytes)
    region_out, key_out = regions(f"{protocol}-overflow-out", 40)
    shm.set_shared_memory_region(region_in, [x])
    shm.set_shared_memory_region(region_out, [np.full(10, 7.0, np.float32)])
    client.unregister_system_shared_memory(headers=auth())
    client.register_system_shared_memory("in", key_in, x.nbytes, headers=auth())
    client.register_system_shared_memory("out", key_out, 40, headers=auth())
    with pytest.raises(InferenceServerException) as e:
        shared_call(client, lib, auth, x, 40)()
    assert str(e.value.status()) in ("500", "StatusCode.INTERNAL"), e.value
    assert "output `logits` holds -inf" in e.value.message() and "finite numbers only" in e.value.message(), e.value
    assert (shm.get_contents_as_numpy(region_out, np.float32, [10]) == 7.0).all()
    client.unregister_system_shared_memory(headers=auth())


def test_a_sigbus_sent_from_outside_still_ends_the_server(repository, regions):
    """The handler that guards mapped regions takes the faults in them only: a SIGBUS that another process sends
    ends the server, as SIGBUS does by default, once regions are mapped too."""
    _, key = regions("signalled", 64)
    proc, address, _ = launch_inferd(repository, "--allow-client-shm")
    try:
        client = httpclient.InferenceServerClient(address)
        client.register_system_shared_memory("signalled", key, 64)
        assert client.get_system_shared_memory_status()[0]["name"] == "signalled"
        os.kill(proc.pid, signal.SIGBUS)
        assert proc.wait(timeout=30) == -signal.SIGBUS
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unregistering_while_requests_use_a_region_breaks_none(server, regions):
    http, _ = server

    def auth():
        return {"authorization": f"Bearer {KEY}"}

    x = rows_for("wide", 64)
    region, key = regions("churn", x.nbytes)
    region_out, key_out = regions("churn-out", 64 * 10 * 4)
    shm.set_shared_memory_region(region, [x])
    client = httpclient.InferenceServerClient(http, concurrency=4)
    client.unregister_system_shared_memory(headers=auth())
    client.register_system_shared_memory("churn", key, x.nbytes, headers=auth())
    client.register_system_shared_memory("churn-out", key_out, 64 * 10 * 4, headers=auth())
    expected_in = httpclient.InferInput("input", list(x.shape), "FP32")
    expected_in.set_data_from_numpy(x)
    expected = client.infer("wide", [expected_in], headers=auth()).as_numpy("logits")
    stop = threading.Event()
    outcomes = {"answered": 0, "unregistered": 0}
    failures = []

    def churn():
        # tritonclient's HTTP client belongs to the thread that made it (gevent).
        client = httpclient.InferenceServerClient(http)
        while not stop.is_set():
            for name, k, size in [("churn", key, x.nbytes), ("churn-out", key_out, 64 * 10 * 4)]:
                client.unregister_system_shared_memory(name, headers=auth())
                client.register_system_shared_memory(name, k, size, headers=auth())

    def load():
        others = httpclient.InferenceServerClient(http)
        for _ in range(40):
            given = httpclient.InferInput("input", list(x.shape), "FP32")
            given.set_shared_memory("churn", x.nbytes)
            wanted = httpclient.InferRequestedOutput("logits")
            wanted.set_shared_memory("churn-out", 64 * 10 * 4)
            try:
                others.infer("wide", [given], outputs=[wanted], headers=auth())
                outcomes["answered"] += 1
            except InferenceServerException as e:
                if e.status() == "400" and "is not registered" in e.message():
                    outcomes["unregistered"] += 1
                else:
                    failures.append(f"{e.status()}: {e.message()}")

    churner = threading.Thread(target=churn)
    churner.start()
    loaders = [threading.Thread(target=load) for _ in range(3)]
    for t in loaders:
        t.start()
    for t in loaders:
        t.join()
    stop.set()
    churner.join()
    assert not failures, failures
    assert outcomes["answered"] > 0, outcomes
    # Every answer wrote the same logits, whether or not its region was unregistered while it ran.
    got = shm.get_contents_as_numpy(region_out, np.float32, [64, 10])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    print(f"while unregistering and registering again: {outcomes}")
    assert client.is_server_live(headers=auth())
    client.unregister_system_shared_memory(headers=auth())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_on_the_cpu_build_is_refused_naming_the_cuda_build(server, regions, protocol):
    """The CUDA extension on a build without CUDA: registering is refused first of all with what to use instead,
    none is listed, and its calls leave system regions alone (one namespace for both kinds, as in Triton)."""
    client, auth = client_for(protocol, server)
    # tritonclient.utils.cuda_shared_memory.get_raw_handle gives the handle's 64 bytes in base64.
    handle = base64.b64encode(bytes(64))
    message = refused(lambda: client.register_cuda_shared_memory("gpu", handle, 0, 64, headers=auth()))
    assert "needs inferd's CUDA build" in message and "system shared memory" in message, message
    for device in (-1, 1 << 32):  # CUDA numbers GPUs with a C int: past it is no GPU, never GPU 0 wrapped round
        message = refused(lambda: client.register_cuda_shared_memory("gpu", handle, device, 64, headers=auth()))
        assert f"device_id {device} is not a GPU" in message, message
    listed = client.get_cuda_shared_memory_status(headers=auth())
    assert (listed == [] if protocol == "http" else not listed.regions), listed
    assert "is not registered" in refused(lambda: client.get_cuda_shared_memory_status("gpu", headers=auth()))
    _, key = regions("both", 64)
    client.register_system_shared_memory("both", key, 64, headers=auth())
    message = refused(lambda: client.register_cuda_shared_memory("both", handle, 0, 64, headers=auth()))
    assert "registered already" in message, message
    assert "is not registered" in refused(lambda: client.get_cuda_shared_memory_status("both", headers=auth()))
    client.unregister_cuda_shared_memory("both", headers=auth())
    client.unregister_cuda_shared_memory(headers=auth())
    status = client.get_system_shared_memory_status("both", headers=auth())
    assert (len(status) if protocol == "http" else len(status.regions)) == 1, status
    client.unregister_system_shared_memory("both", headers=auth())


def test_the_key_applies_and_the_extension_is_off_unless_allowed(server, repository, regions):
    http, _ = server
    region, key = regions("keyed", 64)
    client = httpclient.InferenceServerClient(http)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("keyed", key, 64)
    assert e.value.status() == "401"
    with pytest.raises(InferenceServerException) as e:
        client.get_system_shared_memory_status()
    assert e.value.status() == "401"
    with start_inferd(repository) as address:
        closed = httpclient.InferenceServerClient(address)
        message = refused(lambda: closed.register_system_shared_memory("keyed", key, 64))
        assert "--allow-client-shm" in message, message
        assert closed.get_system_shared_memory_status() == []
        assert "system_shared_memory" in closed.get_server_metadata()["extensions"]


@pytest.fixture(scope="module")
def open_server(repository):
    """A server without an API key: perf_analyzer sends no header over gRPC."""
    with start_inferd(repository, "--allow-client-shm", grpc=True) as addresses:
        yield addresses


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_runs_clean_with_system_shared_memory(open_server, tmp_path, protocol):
    if not PERF_ANALYZER.exists():
        if os.environ.get("INFERD_SKIP_PERF_ANALYZER") == "1":
            pytest.skip(f"INFERD_SKIP_PERF_ANALYZER=1 and no {PERF_ANALYZER}")
        pytest.fail(f"no {PERF_ANALYZER}: run scripts/fetch-perf-analyzer.sh (or set INFERD_SKIP_PERF_ANALYZER=1)")
    http, grpc = open_server
    report = tmp_path / "report.csv"
    args = [str(PERF_ANALYZER), "-m", "digits", "-i", protocol, "-u", http if protocol == "http" else grpc,
            "--shared-memory", "system", "--output-shared-memory-size", "4096",
            "--concurrency-range", "2:2", "--measurement-interval", "1000", "--stability-percentage", "1000",
            "--input-data", "random", "-f", str(report)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    with report.open() as f:
        (row,) = csv.DictReader(f)
    assert float(row["Inferences/Second"]) > 0, row
    measured = int(re.search(r"Request count: (\d+)", output).group(1))
    assert measured > 0, output
    print(f"perf_analyzer over {protocol} with system shared memory: {row['Inferences/Second']} infer/s")
