"""Runs a built image as its config says and checks it from outside; scripts/image-check.sh calls it.

    image_check.py cpu|cuda CONFIG_JSON SIZE_BYTES CONTAINER -- RUNNER...

CONFIG_JSON is the image's config (buildah inspect: Docker's, for its HEALTHCHECK); RUNNER is the command that runs a
program in CONTAINER, a container of the image (`buildah run [options]`), to which this appends the user, working
folder and environment the config names, the container, then the config's entrypoint and CMD. The container shares this machine's network, so the image's own ports (from its
environment) are checked on 127.0.0.1.

cpu: ready within the start period, every bundled model loaded; /predict with the held-out digits against their
reference logits; /embed with all-MiniLM-L6-v2 (candle, and the int8 export on ONNX Runtime) against the float64
reference (tests/python/reference.py); the gRPC port open; /metrics counting what was asked; the process's uid not 0
and the config's; every log line JSON; SIGTERM with a request in flight: readiness fails within a second, that
request (answered after the SIGTERM) and one sent during the drain delay are answered, the process exits 0.
cuda: with no GPU (a driver library that finds none, mounted where the NVIDIA runtime would put the driver's), the
binary starts, /health says no GPU is visible and why it is not ready, and SIGTERM still exits 0.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from gpu_check import http  # noqa: E402  (scripts/, beside this file: the same JSON request, one place)


def metrics_text(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        return r.status, r.read().decode()


class Container:
    """The image's entrypoint and CMD, run with its user, working folder and environment."""

    def __init__(self, config, runner, container):
        self.config = config
        env = dict(e.split("=", 1) for e in config.get("Env", []))
        self.port = int(env.get("INFERD_PORT", "8080"))
        self.grpc_port = int(env.get("INFERD_GRPC_PORT", "8001"))
        self.base = f"http://127.0.0.1:{self.port}"
        for port in (self.port, self.grpc_port):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    sys.exit(f"image-check: port {port}, which the image serves on, is taken on this machine")
        cmd = list(runner)
        if config.get("User"):
            cmd += ["--user", config["User"]]
        if config.get("WorkingDir"):
            cmd += ["--workingdir", config["WorkingDir"]]
        for e in config.get("Env", []):
            cmd += ["--env", e]
        cmd += [container, "--"] + (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
        print("image-check: running", " ".join(cmd), file=sys.stderr)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.pid = None

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self, last=40):
        return "\n".join(self.lines[-last:])

    def server_pid(self, name):
        """The container's own process: the runner's descendant whose program is the entrypoint's."""
        if self.pid:
            return self.pid
        children = {}
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            pid, ppid = int(text.split()[0]), int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            try:
                argv0 = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if os.path.basename(argv0) == name:
                self.pid = pid
                return pid
            todo += children.get(pid, [])
        raise AssertionError(f"no process {name} under the runner ({self.proc.pid})")

    def wait_until(self, what, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the container exited ({self.proc.returncode}) before {what}:\n{self.output()}")
            try:
                if predicate():
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"not {what} after {timeout} s:\n{self.output()}")

    def stop(self, name):
        pid = self.server_pid(name)
        os.kill(pid, signal.SIGTERM)
        return pid

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start(config, runner, name, tries=3):
    """Starts the container; buildah's run now and then fails to seal the copy of itself it runs from (EBUSY from
    the kernel), before anything of the image has run: that, and only that, is tried again."""
    for attempt in range(tries):
        container = Container(config, runner, name)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and container.proc.poll() is None:
            try:
                http(container.base, "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        container.reader.join(1 if container.proc.poll() is not None else 0)
        if container.proc.poll() is None or "sealing memfd" not in container.output() or attempt == tries - 1:
            return container
        print(f"image-check: buildah could not start the container, again: {container.output(2)}", file=sys.stderr)
    raise AssertionError("unreachable")


def start_period(config):
    """The HEALTHCHECK's start period, in seconds: how long the image says it may take to become healthy."""
    health = config.get("Healthcheck") or {}
    return max(60, int(health.get("StartPeriod", 0)) // 1_000_000_000)


def check_uid(container, config, name):
    status = pathlib.Path(f"/proc/{container.server_pid(name)}/status").read_text()
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    want = config["User"].split(":")[0]
    assert all(u == want for u in uids) and want != "0", (uids, config["User"])
    return uids[0]


def check_logs_are_json(container):
    lines = [line for line in container.lines if line.strip()]
    assert lines, "the server logged nothing"
    bad = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            bad.append(line)
    assert not bad, f"log lines that are not JSON (INFERD_LOG_FORMAT=json): {bad[:5]}"
    return len(lines)


def check_cpu(container, config, size, report):
    name = os.path.basename((config.get("Entrypoint") or config["Cmd"])[0])
    began = container.started
    container.wait_until("ready", lambda: http(container.base, "/health/ready")[0] == 200, start_period(config))
    report("ready after", f"{time.monotonic() - began:.1f} s")
    # Every bundled model loaded: a file the image's user cannot read fails its model, not the readiness.
    container.wait_until("done loading", lambda: http(container.base, "/health")[1]["status"] != "starting", 120)
    health = http(container.base, "/health")[1]
    assert health["status"] == "healthy", json.dumps(health, indent=1)
    report("models", f"{len(health['models'])} loaded, /health says healthy")
    report("uid", check_uid(container, config, name))

    data = json.loads((ROOT / "tests" / "data" / "digits_heldout.json").read_text())
    status, got = http(container.base, "/models/digits/predict", {"input": data["pixels"]})
    assert status == 200, got
    logits = np.asarray(got["prediction"], dtype=np.float64)
    reference = np.asarray(data["reference_logits"])  # the first rows' logits, from the model's training
    np.testing.assert_allclose(logits[:len(reference)], reference, atol=1e-3)
    accuracy = float((logits.argmax(1) == np.asarray(data["labels"])).mean())
    assert accuracy > 0.9, accuracy
    report("digits", f"{len(data['pixels'])} held-out rows, accuracy {accuracy:.3f}, logits as the reference")

    # The sentences and the tokenizer of the tests' text checks (tests/python/test_text.py), and their reference.
    from reference import Reference
    from test_text import MODEL, SENTENCES, tokenizer
    bert, encode = Reference(MODEL), tokenizer().encode
    want = np.stack([bert.embed(np.array(e.ids), np.array(e.type_ids)) for e in map(encode, SENTENCES)])
    # candle's BERT and the int8 ONNX export on ONNX Runtime. (TEI's /embed names no model: the image's repository
    # has two that embed, so the manifests set INFERD_DEFAULT_EMBED_MODEL, as scripts/serve.sh does.)
    # The bounds are test_text.py's: int8 weights move the vectors a little.
    for path, bound in (("/models/minilm/embed", 0.9999), ("/models/minilm-int8/embed", 0.99)):
        status, got = http(container.base, path, {"inputs": SENTENCES})
        assert status == 200, (path, got)
        got = np.asarray(got, dtype=np.float64)
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert got.shape == want.shape and cos.min() >= bound, (path, cos)
        report(f"embed {path}", f"{len(SENTENCES)} sentences, cosine to the float64 reference >= {cos.min():.5f}")

    with socket.create_connection(("127.0.0.1", container.grpc_port), timeout=5):
        report("gRPC", f"port {container.grpc_port} open")

    status, text = metrics_text(container.base)
    assert status == 200
    counted = [line for line in text.splitlines()
               if line.startswith("inferd_requests_total{") and 'model="digits"' in line]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) >= 1, counted or text[:2000]
    report("metrics", f"{len(text.splitlines())} lines, inferd_requests_total counts the digits request")

    # SIGTERM with a request in flight: a batch that takes seconds on the CPU, still unanswered when the signal goes.
    answers, answered = {}, {}
    batch = {"inputs": [" ".join(SENTENCES)] * 64}

    def in_flight():
        try:
            answers["in flight"] = http(container.base, "/models/minilm/embed", batch, timeout=120)
        except OSError as e:
            answers["in flight"] = (None, repr(e))
        answered["at"] = time.monotonic()

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive(), "the batch meant to be in flight at SIGTERM was answered before it"
    stopped = time.monotonic()
    container.stop(name)
    container.wait_until("unready after SIGTERM", lambda: http(container.base, "/health/ready")[0] == 503, 1)
    answers["during the drain delay"] = http(container.base, "/models/digits/predict", {"input": data["pixels"][:2]})
    thread.join(120)
    for what, (status, body) in answers.items():
        assert status == 200, (what, status, body)
    assert len(answers["in flight"][1]) == 64 and answered["at"] > stopped
    try:
        code = container.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 60 s after SIGTERM:\n{container.output()}")
    container.reader.join(5)
    assert code == 0, f"exit status {code} after SIGTERM:\n{container.output()}"
    report("SIGTERM", f"in-flight and drain-delay requests answered, exit 0 after {time.monotonic() - stopped:.1f} s")
    report("logs", f"{check_logs_are_json(container)} lines, all JSON")
    report("image size", f"{size / 1e6:.1f} MB")


def check_cuda(container, config, size, report):
    name = os.path.basename((config.get("Entrypoint") or config["Cmd"])[0])
    began = container.started
    container.wait_until("done loading", lambda: http(container.base, "/health")[1]["status"] != "starting",
                         start_period(config))
    status, health = http(container.base, "/health")
    report("health after", f"{time.monotonic() - began:.1f} s: status {health['status']}")
    assert not health["gpu_available"] and not health["gpus"], health
    assert "GPU" in (health.get("reason") or ""), health
    report("no GPU", health["reason"])
    ready = http(container.base, "/health/ready")
    assert ready[0] == 503, ready
    report("uid", check_uid(container, config, name))
    container.stop(name)
    code = container.proc.wait(timeout=60)
    container.reader.join(5)
    assert code == 0, f"exit status {code} after SIGTERM:\n{container.output()}"
    report("SIGTERM", "exit 0")
    report("logs", f"{check_logs_are_json(container)} lines, all JSON")
    report("image size", f"{size / 1e6:.1f} MB")


def main():
    flavour, config_path, size, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    assert sys.argv[5] == "--", sys.argv
    runner = sys.argv[6:]
    config = json.loads(pathlib.Path(config_path).read_text())
    rows = []

    def report(what, value):
        rows.append((what, str(value)))
        print(f"image-check: {flavour}: {what}: {value}", file=sys.stderr)

    container = start(config, runner, name)
    try:
        (check_cpu if flavour == "cpu" else check_cuda)(container, config, size, report)
    except BaseException:
        print(f"image-check: the container's last output:\n{container.output()}", file=sys.stderr)
        raise
    finally:
        container.kill()
    print(f"| {flavour} image | |\n| --- | --- |")
    for what, value in rows:
        print(f"| {what} | {value} |")


if __name__ == "__main__":
    main()
