"""Triton's logging and trace extensions, read and changed while inferd runs, with tritonclient over HTTP and gRPC,
and their effect seen in the lines the server logs: the verbose level lets inferd's debug lines through, `log_format`
switches text and JSON, `log_info` stops and starts info lines; a traced request writes one `inferd::trace` line
with its timings, at the rate and count asked, server-wide or for one model. Bad values are refused whole."""

import json
import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, launch_inferd

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
            "log_format": "default"}


@pytest.fixture(scope="module")
def server():
    """inferd on digits; the lines it logs gathered in a list the tests read."""
    log = []
    proc, address, grpc_address = launch_inferd(ROOT / "models" / "digits", grpc=True, keep_log=log)
    try:
        http = httpclient.InferenceServerClient(address)
        while not http.is_model_ready("digits"):
            time.sleep(0.05)
        yield http, grpcclient.InferenceServerClient(grpc_address), log
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def infer(client, lib, n=1):
    for _ in range(n):
        x = lib.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(np.ones((1, 64), np.float32))
        client.infer("digits", [x])


def new_lines(log, after):
    """The log's lines after its first `after`."""
    return [line.rstrip("\n") for line in log[after:]]


def settle():
    """Lets the server's lines for the requests just answered reach the list."""
    time.sleep(0.2)


def test_log_settings_change_what_the_log_writes(server):
    http, grpc, log = server
    assert http.get_log_settings() == DEFAULTS
    over_grpc = grpc.get_log_settings(as_json=True)["settings"]
    assert {name: next(iter(value.values())) for name, value in over_grpc.items()} == DEFAULTS, over_grpc

    start = len(log)
    infer(http, httpclient)
    settle()
    assert not [line for line in new_lines(log, start) if "DEBUG" in line], "no debug lines at level 0"
    answered = grpc.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert answered["log_verbose_level"] == {"uint32_param": 1}, answered
    start = len(log)
    infer(http, httpclient)
    settle()
    assert [line for line in new_lines(log, start) if "DEBUG" in line and "request{id=" in line and "served" in line], \
        new_lines(log, start)

    assert http.update_log_settings({"log_format": "json"})["log_format"] == "json"
    start = len(log)
    infer(http, httpclient)
    settle()
    lines = new_lines(log, start)
    assert lines and all(json.loads(line)["level"] for line in lines), lines
    # A request begun after the switch has its span's fields in the new format: the request id on its lines.
    spans = [json.loads(line).get("span", {}) for line in lines
             if json.loads(line).get("fields", {}).get("message") == "served"]
    assert spans and all(s.get("name") == "request" and s.get("id") and s.get("path") for s in spans), lines

    http.update_log_settings({"log_format": "default", "log_verbose_level": 0})
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    http.update_log_settings({"log_info": False})
    start = len(log)
    infer(http, httpclient)
    settle()
    assert not [line for line in new_lines(log, start) if "inferd::trace" in line], "info lines stopped"
    http.update_log_settings({"log_info": True})
    start = len(log)
    infer(http, httpclient)
    settle()
    assert [line for line in new_lines(log, start) if "inferd::trace" in line], "info lines again"
    http.update_trace_settings(settings={"trace_level": None, "trace_rate": None})
    assert http.get_log_settings() == DEFAULTS


@pytest.mark.parametrize("bad", [{"log_file": "/tmp/x.log"}, {"log_format": "xml"}, {"log_colour": True},
                                 {"log_info": "yes"}])
def test_bad_log_settings_are_refused_whole(server, bad):
    http, grpc, _ = server
    with pytest.raises(InferenceServerException) as e:
        http.update_log_settings({"log_verbose_level": 3, **bad})
    assert e.value.status() == "400", e.value
    # tritonclient's gRPC client types each value by its key, so it cannot send a string as log_info.
    if bad != {"log_info": "yes"}:
        with pytest.raises(InferenceServerException) as e:
            grpc.update_log_settings({"log_verbose_level": 3, **bad})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value
    assert http.get_log_settings() == DEFAULTS


def trace_lines(log, after):
    return [line for line in new_lines(log, after) if "inferd::trace" in line]


def test_traces_follow_the_rate_and_count_server_wide_and_per_model(server):
    http, grpc, log = server
    assert http.get_trace_settings() == {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000",
                                         "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}
    answered = http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert answered["trace_level"] == ["TIMESTAMPS"] and answered["trace_rate"] == "1", answered
    start = len(log)
    infer(http, httpclient, 3)
    settle()
    lines = trace_lines(log, start)
    assert len(lines) == 3, lines
    assert all("model=\"digits\"" in line or "model=digits" in line for line in lines), lines
    assert all(re.search(r"queue_us=\d+ compute_us=\d+ total_us=\d+", line) for line in lines), lines

    # digits' own: every second request, two traces in all, its outputs' shapes too; the server's stay.
    settings = grpc.update_trace_settings("digits", {"trace_rate": "2", "trace_count": "2",
                                                     "trace_level": ["TIMESTAMPS", "TENSORS"]}, as_json=True)
    assert settings["settings"]["trace_rate"]["value"] == ["2"], settings
    assert http.get_trace_settings()["trace_rate"] == "1"
    start = len(log)
    infer(grpc, grpcclient, 6)
    settle()
    lines = trace_lines(log, start)
    assert len(lines) == 2 and all("FP32[1, 10]" in line for line in lines), lines
    assert http.get_trace_settings("digits")["trace_count"] == "0"

    # Cleared, digits follows the server's settings again.
    grpc.update_trace_settings("digits", {"trace_rate": None, "trace_count": None, "trace_level": None})
    assert http.get_trace_settings("digits") == http.get_trace_settings()
    for bad in [{"trace_level": ["LOUD"]}, {"trace_rate": "0"}, {"trace_file": "/tmp/t.json"}, {"trace_x": "1"}]:
        with pytest.raises(InferenceServerException) as e:
            http.update_trace_settings(settings=bad)
        assert e.value.status() == "400", e.value
    with pytest.raises(InferenceServerException) as e:
        http.get_trace_settings("no-such-model")
    assert e.value.status() == "404", e.value
    http.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": None})
    start = len(log)
    infer(http, httpclient, 2)
    settle()
    assert not trace_lines(log, start)
