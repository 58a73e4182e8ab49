"""Repositories in object stores: inferd serves the bundled models from Azurite (the Azure Storage emulator, its Blob
service) and from moto's S3 stand-in server, mirrored into a cache folder, and answers as from disk; poll mode takes
a new version, drops a removed one and keeps serving through a broken one, under load; bad stores and bad blobs stop
the start with the reason, leaving no half-written file."""

import datetime
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

from conftest import ROOT, free_port, launch_inferd, post, start_inferd

AZURITE = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
BENCH = os.environ.get("INFERD_BENCH_BIN", str(ROOT / "target" / "debug" / "inferd-bench"))
INFERD = os.environ.get("INFERD_BIN", str(ROOT / "target" / "debug" / "inferd"))
LIB = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"
# The emulator's account: Azure's published development account and key.
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DIGIT = [float(v % 17) for v in range(64)]


def wait_for_port(port, proc, what):
    for _ in range(600):
        assert proc.poll() is None, f"{what} exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    """Azurite's Blob service on a free loopback port: (a client for it, the environment inferd reads it with)."""
    port = free_port()
    proc = subprocess.Popen([AZURITE, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                             str(tmp_path_factory.mktemp("azurite")), "--silent", "--skipApiVersionCheck"])
    try:
        wait_for_port(port, proc, "azurite")
        url = f"http://127.0.0.1:{port}/{ACCOUNT}"
        client = BlobServiceClient(url, credential={"account_name": ACCOUNT, "account_key": KEY})
        env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{port}",
               "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": KEY}
        yield client, env
    finally:
        stop(proc)


def upload(container, prefix, folder):
    """Uploads every file under `folder` to `container` as `prefix/<its path in folder>`."""
    for path in sorted(pathlib.Path(folder).rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                container.upload_blob(f"{prefix}/{path.relative_to(folder)}", f, overwrite=True)


def new_container(azurite, name):
    client, _ = azurite
    return client.create_container(name)


def digits(address, version=None):
    route = f"http://{address}/models/digits/predict"
    status, answer = post(route, {"input": [DIGIT]})
    assert status == 200, answer
    return np.array(answer["prediction"])


def embed(address, texts):
    status, answer = post(f"http://{address}/embed", {"inputs": texts})
    assert status == 200, answer
    return np.array(answer)


def mirrored(log):
    """The start-up's report of the mirroring: its fields, as logged."""
    [line] = [line for line in log if "mirrored the remote model repository" in line]
    return dict(re.findall(r"(\w+)=(\S+)", line))


TEXTS = ["models live in blob storage", "and are served from a cache"]


@pytest.fixture(scope="module")
def from_disk(tmp_path_factory):
    """What the bundled digits and MiniLM answer when served from disk: digits' logits, MiniLM's embeddings."""
    local = tmp_path_factory.mktemp("local")
    for name in ["digits", "minilm"]:
        shutil.copytree(ROOT / "models" / name, local / name)
    with start_inferd(local, "--default-embed-model", "minilm") as address:
        return digits(address), embed(address, TEXTS)


def answers_as_from_disk(address, from_disk):
    want_digits, want_embeddings = from_disk
    np.testing.assert_array_equal(digits(address), want_digits)
    got = embed(address, TEXTS)
    cosines = (got * want_embeddings).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want_embeddings, axis=1)
    np.testing.assert_allclose(cosines, 1.0, atol=1e-6)


def test_the_bundled_models_serve_from_blob_storage_as_from_disk(azurite, from_disk, tmp_path):
    container = new_container(azurite, "bundled")
    upload(container, "repo/digits", ROOT / "models" / "digits")
    upload(container, "repo/minilm", ROOT / "models" / "minilm")
    cache = tmp_path / "cache"
    log = []
    _, env = azurite
    with start_inferd("az://bundled/repo", "--model-cache", cache, "--default-embed-model", "minilm", env=env,
                      keep_log=log) as address:
        answers_as_from_disk(address, from_disk)
    first = mirrored(log)
    assert int(first["downloaded_files"]) == int(first["files"]) > 0, first
    # A restart with the cache warm downloads nothing.
    log = []
    with start_inferd("az://bundled/repo", "--model-cache", cache, env=env, keep_log=log) as address:
        np.testing.assert_array_equal(digits(address), from_disk[0])
    again = mirrored(log)
    assert (again["downloaded_files"], again["downloaded_bytes"], again["files"]) == ("0", "0", first["files"]), again


def test_a_prefix_that_is_one_model_folder_serves_that_model_under_its_name(azurite, from_disk, tmp_path):
    container = new_container(azurite, "single")
    upload(container, "repo/digits", ROOT / "models" / "digits")
    _, env = azurite
    with start_inferd("az://single/repo/digits", "--model-cache", tmp_path / "cache", env=env) as address:
        np.testing.assert_array_equal(digits(address), from_disk[0])


def test_the_bundled_models_serve_from_s3_as_from_disk(from_disk, tmp_path):
    import boto3

    port = free_port()
    moto = subprocess.Popen([str(ROOT / ".venv" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, moto, "moto")
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true"}
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT"], region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
        s3.create_bucket(Bucket="models")
        for name in ["digits", "minilm"]:
            folder = ROOT / "models" / name
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                s3.upload_file(str(path), "models", f"repo/{name}/{path.relative_to(folder)}")
        with start_inferd("s3://models/repo", "--model-cache", tmp_path / "cache", "--default-embed-model", "minilm",
                          env=env) as address:
            answers_as_from_disk(address, from_disk)
    finally:
        stop(moto)


def test_poll_mode_reads_a_local_repository_too(tmp_path):
    repo = tmp_path / "repo"
    (repo / "digits" / "1").mkdir(parents=True)
    shutil.copy(ROOT / "models" / "digits" / "model.toml", repo / "digits")
    shutil.copy(ROOT / "models" / "digits" / "model.onnx", repo / "digits" / "1")
    with start_inferd(repo, "--model-control", "poll", "--poll-interval", "0.2") as address:
        (repo / "digits" / "2").mkdir()
        shutil.copy(ROOT / "models" / "digits" / "model.onnx", repo / "digits" / "2")
        # The default policy serves the newest version: 2 comes in, 1 drains out.
        wait_until("version 2 serves", lambda: index(address).get(("digits", "2"), {}).get("state") == "READY")
        assert index(address)[("digits", "1")]["state"] == "UNAVAILABLE"
        assert digits(address).shape == (1, 10)
        status, answer = load(address, "digits")
        assert status == 400 and "model control is `poll`" in json.loads(answer)["error"], answer


def peak_rss(proc):
    """The process's peak resident memory, in bytes."""
    status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def test_a_large_blob_streams_to_disk(azurite, tmp_path):
    """A 200 MB file downloads without being held: the server's peak memory grows far less than the file."""
    size = 200 << 20
    for name, extra in [("small", False), ("large", True)]:
        container = new_container(azurite, name)
        upload(container, "repo/digits", ROOT / "models" / "digits")
        if extra:
            container.upload_blob("repo/digits/extra.bin", b"\x5a" * size, max_concurrency=4)
    _, env = azurite
    peaks = {}
    for name in ["small", "large"]:
        log = []
        proc, address, _ = launch_inferd(f"az://{name}/repo", "--model-cache", tmp_path / name, env=env, keep_log=log)
        try:
            digits(address)
            peaks[name] = peak_rss(proc)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        report = mirrored(log)
        assert int(report["downloaded_bytes"]) > (size if name == "large" else 0), report
    assert (tmp_path / "large" / "repository" / "digits" / "extra.bin").stat().st_size == size
    growth = peaks["large"] - peaks["small"]
    print(f"peak RSS: {peaks['small'] >> 20} MiB without the 200 MiB file, {peaks['large'] >> 20} MiB with it")
    assert growth < 64 << 20, peaks


def index(address):
    request = urllib.request.Request(f"http://{address}/v2/repository/index", b"{}", method="POST")
    with urllib.request.urlopen(request) as r:
        return {(e["name"], e.get("version", "")): e for e in json.loads(r.read())}


def health(address):
    try:
        with urllib.request.urlopen(f"http://{address}/health") as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def wait_until(what, check, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return time.time()
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def test_poll_mode_takes_new_versions_and_keeps_serving_through_a_broken_one_under_load(azurite, tmp_path):
    container = new_container(azurite, "polled")
    toml = 'version_policy = "all"\n' + (ROOT / "models" / "digits" / "model.toml").read_text()
    onnx = (ROOT / "models" / "digits" / "model.onnx").read_bytes()
    container.upload_blob("repo/digits/model.toml", toml.encode())
    container.upload_blob("repo/digits/1/model.onnx", onnx)
    _, env = azurite
    with start_inferd("az://polled/repo", "--model-cache", tmp_path / "cache", "--model-control", "poll",
                      "--poll-interval", "0.5", env=env) as address:
        bench = subprocess.Popen(
            [BENCH, "http", "--url", f"http://{address}", "--model", "digits", "--concurrency", "32", "--warmup", "0",
             "--duration", "20", "--quiet", "--out", str(tmp_path), "--name", "load"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = time.time()
        time.sleep(1)
        took = {}
        uploaded = time.time()
        container.upload_blob("repo/digits/2/model.onnx", onnx)
        took["v2 serving"] = wait_until(
            "version 2 serves", lambda: index(address).get(("digits", "2"), {}).get("state") == "READY") - uploaded
        deleted = time.time()
        container.delete_blob("repo/digits/1/model.onnx")
        took["v1 unloaded"] = wait_until(
            "version 1 is unloaded", lambda: index(address)[("digits", "1")]["state"] == "UNAVAILABLE") - deleted
        broken = time.time()
        container.upload_blob("repo/digits/3/model.onnx", b"not an ONNX graph")
        took["v3 refused"] = wait_until(
            "version 3 failed", lambda: index(address).get(("digits", "3"), {}).get("state") == "UNAVAILABLE") - broken
        done = time.time()
        print("poll 0.5 s, after the change:", ", ".join(f"{k} in {v:.2f} s" for k, v in took.items()))
        entries = index(address)
        assert entries[("digits", "2")]["state"] == "READY", entries
        assert "version 3 failed to load" in entries[("digits", "3")]["reason"], entries
        status = health(address)
        assert "version 3 failed to load" in status["repository_error"], status
        [three] = [m for m in status["models"] if m["version"] == 3]
        assert three["state"] == "unloaded" and "failed to load" in three["error"], three
        assert digits(address).shape == (1, 10)
        assert bench.wait(timeout=60) == 0, bench.stderr.read()
        assert done - started < 20, "the changes were made while the load ran"
        [report] = json.loads((tmp_path / "load.json").read_text())
        assert report["requests_ok"] > 100 and report["errors"] == {}, report
        print(f"under c=32: {report['requests_ok']} requests, {report['throughput_rps']:.0f} req/s, no error")

        # The store gone: what serves serves on, and /health says why.
        container.delete_container()
        wait_until("the poll fails", lambda: "cannot mirror" in (health(address).get("repository_error") or ""))
        assert digits(address).shape == (1, 10)


def load(address, model):
    """Triton's load of `model`: the status, and the answer's text."""
    request = urllib.request.Request(f"http://{address}/v2/repository/models/{model}/load", b"{}", method="POST")
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_explicit_model_control_mirrors_the_store_again_before_it_loads(azurite, tmp_path):
    container = new_container(azurite, "explicit")
    onnx = (ROOT / "models" / "digits" / "model.onnx").read_bytes()
    container.upload_blob("repo/digits/model.toml", (ROOT / "models" / "digits" / "model.toml").read_bytes())
    container.upload_blob("repo/digits/1/model.onnx", onnx)
    _, env = azurite
    with start_inferd("az://explicit/repo", "--model-cache", tmp_path / "cache", "--model-control", "explicit",
                      env=env) as address:
        assert ("digits", "1") in index(address)
        container.upload_blob("repo/digits/2/model.onnx", onnx)
        status, answer = load(address, "digits")
        assert status == 200, answer
        entries = index(address)
        assert entries[("digits", "2")]["state"] == "READY" and ("digits", "1") not in entries, entries
        # The store gone: the load fails with the reason, and what serves serves on.
        container.delete_container()
        status, answer = load(address, "digits")
        assert status == 503 and "cannot mirror az://explicit/repo" in json.loads(answer)["error"], answer
        assert index(address)[("digits", "2")]["state"] == "READY"


def refused(*args, env=None):
    """inferd started with `args`: its exit status and what it wrote, once it has stopped (or been stopped)."""
    proc = subprocess.run([INFERD, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
                           "--onnxruntime-lib", str(LIB), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stderr


def cache_files(cache):
    return sorted(str(p.relative_to(cache)) for p in pathlib.Path(cache).rglob("*") if p.is_file())


def test_bad_stores_and_bad_blobs_stop_the_start_with_the_reason(azurite, tmp_path):
    container = new_container(azurite, "bad")
    upload(container, "repo/digits", ROOT / "models" / "digits")
    _, env = azurite
    cache = tmp_path / "cache"
    wrong_key = {**env, "AZURE_STORAGE_ACCOUNT_KEY": "d3Jvbmc="}
    for location, extra, want in [
        ("az://bad/repo", wrong_key, "AuthorizationFailure"),
        ("az://missing/repo", env, "ContainerNotFound"),
    ]:
        code, log = refused("--models", location, "--model-cache", cache, env=extra)
        assert code != 0 and f"cannot list the model repository {location}: " in log and want in log, log
    code, log = refused("--models", "az://bad/repo", "--model-cache", cache, "--max-repository-bytes", "1000",
                        env=env)
    size = sum(p.stat().st_size for p in (ROOT / "models" / "digits").iterdir())
    assert code != 0 and f"holds {size} bytes in 2 files, more than --max-repository-bytes 1000" in log, log
    assert [f for f in cache_files(cache) if not f.startswith("manifest")] == [], "nothing downloaded"

    # A blob whose name climbs out of the repository (Azure's client cannot name one: it is put through a SAS, its
    # dots escaped) is refused by name, and nothing is written for it.
    client, _ = azurite
    sas = generate_container_sas(ACCOUNT, "bad", account_key=KEY, permission=ContainerSasPermissions(write=True),
                                 expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    put = urllib.request.Request(f"{client.url.rstrip('/')}/bad/repo/digits/%2E%2E/%2E%2E/escape?{sas}", b"x",
                                 method="PUT", headers={"x-ms-blob-type": "BlockBlob"})
    with urllib.request.urlopen(put) as r:
        assert r.status == 201
    assert "repo/digits/../../escape" in [b.name for b in container.list_blobs()]
    code, log = refused("--models", "az://bad/repo", "--model-cache", cache, env=env)
    assert code != 0 and "cannot list the model repository az://bad/repo" in log, log
    assert "repo/digits/../../escape" in log, log
    assert not any("escape" in f for f in cache_files(tmp_path)), cache_files(tmp_path)
    assert not (cache / "partial").exists()
