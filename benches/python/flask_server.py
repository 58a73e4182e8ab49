"""The second Python peer of benches/compare.sh: the seed's `/predict` API as a typical hand-rolled Flask app.

Flask on gunicorn, one process per core, ONNX Runtime with one intra-op thread per process (so the processes do not
fight over the cores), the body read with `request.get_json` and the answer made with `jsonify`. No batching: each
request runs alone, as a hand-rolled server does.

gunicorn's gthread worker, not its default sync one: the sync worker answers every request with `Connection: close`,
while the load generator (inferd-bench) holds one keep-alive connection per client. Against a sync worker each
client would pay a new TCP connection per request on the two cores it shares with the server, and would count the
closed connection it finds before each reconnect as a failed request (status 0). gthread keeps the connections open
(in a poller while idle, on one of the worker's threads while answering); 4 threads per process are enough, as the
work is CPU-bound and holds the GIL but for ONNX Runtime's run.

Run: MODEL=models/digits/model.onnx gunicorn -w 2 -k gthread --threads 4 -b 127.0.0.1:8000 \
         --pythonpath benches/python flask_server:app
(`--pythonpath`, like uvicorn's `--app-dir`, only finds the module; `--chdir` would also move the working directory,
and MODEL's relative path with it.)
"""

import os

import numpy as np
import onnxruntime as ort
from flask import Flask, jsonify, request

MODEL = os.environ.get("MODEL", "models/digits/model.onnx")
MODEL_NAME = os.path.basename(os.path.dirname(MODEL))

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("INTRA_OP_THREADS", "1"))
session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
input_name = session.get_inputs()[0].name
app = Flask(__name__)


@app.post("/predict")
def predict():
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or "input" not in body:
        return jsonify(error='expected a JSON body {"input": [[...], ...]}'), 400
    try:
        x = np.asarray(body["input"], dtype=np.float32)
        (y,) = session.run(None, {input_name: x})
    except Exception as e:  # a wrong shape is the client's fault
        return jsonify(error=str(e)), 400
    return jsonify(prediction=y.tolist(), model=MODEL_NAME)


@app.get("/health/ready")
def ready():
    return jsonify(status="ready")
