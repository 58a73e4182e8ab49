"""Schemathesis against inferd's own OpenAPI document: every documented operation, with bodies generated from its
schema (valid and invalid, shrunk on failure), against the real server: none may answer 5xx."""

import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def test_no_generated_request_gets_a_server_error(server_url, tmp_path):
    schemathesis = pathlib.Path(sys.executable).parent / "schemathesis"
    run = subprocess.run(
        [str(schemathesis), "--config-file", str(HERE / "schemathesis.toml"), "--no-color", "run",
         f"http://{server_url}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "25",
         "--workers", "2", "--seed", "7", "--report", "junit", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    summary = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert run.returncode == 0 and summary, run.stdout[-4000:] + run.stderr[-2000:]
    generated, passed = map(int, summary.groups())
    assert generated == passed and generated > 500, summary.group(0)
    tested = re.search(r"Tested: (\d+)", run.stdout)
    selected = re.search(r"Selected: (\d+)/(\d+)", run.stdout)
    assert tested and selected and tested.group(1) == selected.group(2), run.stdout[-2000:]
