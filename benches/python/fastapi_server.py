"""The baseline inferd is compared with: the strongest simple Python design for the seed's `/predict` API.

FastAPI on uvicorn (uvloop + httptools), one process per core, ONNX Runtime with one intra-op thread per process
(so the processes do not fight over the cores), a synchronous endpoint that FastAPI runs in its thread pool (ONNX
Runtime releases the GIL), and a declared response model, which FastAPI serializes through Pydantic's Rust core (its
recommended fast path). No batching: each request runs alone, as a hand-rolled server does.

Run: MODEL=models/digits/model.onnx uvicorn --workers 2 --loop uvloop --http httptools \
         --app-dir benches/python fastapi_server:app --port 8000
"""

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

MODEL = os.environ.get("MODEL", "models/digits/model.onnx")

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("INTRA_OP_THREADS", "1"))
session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
input_name = session.get_inputs()[0].name
app = FastAPI()


class PredictRequest(BaseModel):
    input: list[list[float]]


class PredictResponse(BaseModel):
    prediction: list[list[float]]
    model: str


@app.post("/predict")
def predict(request: PredictRequest) -> PredictResponse:
    try:
        x = np.asarray(request.input, dtype=np.float32)
        (y,) = session.run(None, {input_name: x})
    except Exception as e:  # a wrong shape is the client's fault
        raise HTTPException(status_code=400, detail=str(e)) from e
    return PredictResponse(prediction=y.tolist(), model=os.path.basename(os.path.dirname(MODEL)))


@app.get("/health/ready")
def ready():
    return {"status": "ready"}
