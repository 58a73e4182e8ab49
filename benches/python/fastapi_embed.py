"""The text-embedding peer inferd is compared with: what a user hand-rolls to serve a sentence-transformers ONNX
export, with TEI's `/embed` API.

FastAPI on uvicorn (uvloop + httptools), one process per core, each with the `tokenizers` tokenizer and an ONNX
Runtime session of one intra-op thread (so the processes do not fight over the cores); a synchronous endpoint
that FastAPI runs in its thread pool (the tokenizer and ONNX Runtime release the GIL); mean pooling and
normalisation in numpy. No batching across requests: each request runs alone, padded to its own longest text.

With uvicorn's --workers 1 and INTRA_OP_THREADS=0 it is the same server with default settings (one process, ONNX Runtime's own
thread count).

Run: MODEL=models/minilm-int8/model.onnx TOKENIZER=models/minilm/tokenizer.json uvicorn --workers 2 \
         --loop uvloop --http httptools --app-dir benches/python fastapi_embed:app --port 8000
"""

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from tokenizers import Tokenizer

MODEL = os.environ.get("MODEL", "models/minilm-int8/model.onnx")
MAX_SEQ_LEN = int(os.environ.get("MAX_SEQ_LEN", "256"))

options = ort.SessionOptions()
# 0: ONNX Runtime's default (a thread per core), as an untuned server has it.
options.intra_op_num_threads = int(os.environ.get("INTRA_OP_THREADS", "1"))
session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
input_names = {i.name for i in session.get_inputs()}
tokenizer = Tokenizer.from_file(os.environ.get("TOKENIZER", "models/minilm/tokenizer.json"))
tokenizer.enable_truncation(MAX_SEQ_LEN)
tokenizer.enable_padding()  # to the longest of the request
app = FastAPI()


class EmbedRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


@app.post("/embed")
def embed(request: EmbedRequest) -> list[list[float]]:
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    if not texts or any(not t for t in texts):
        raise HTTPException(status_code=400, detail="empty input")
    encodings = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = session.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in input_names})
    weights = mask[:, :, None].astype(np.float32)
    pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    if request.normalize:
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return pooled.tolist()


@app.get("/health/ready")
def ready():
    return {"status": "ready"}
