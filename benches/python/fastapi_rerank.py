"""The reranking peer inferd is compared with: what a user hand-rolls to serve a cross-encoder's ONNX export, with
TEI's `/rerank` API.

FastAPI on uvicorn (uvloop + httptools), one process per core, each with the `tokenizers` tokenizer and an ONNX
Runtime session of one intra-op thread (so the processes do not fight over the cores); a synchronous endpoint
that FastAPI runs in its thread pool (the tokenizer and ONNX Runtime release the GIL). Each request's (query,
passage) pairs run as one batch, padded to its longest pair; no batching across requests. Scores are the sigmoid
of the logit, best first, as TEI answers.

With uvicorn's --workers 1 and INTRA_OP_THREADS=0 it is the same server with default settings (one process, ONNX Runtime's own
thread count).

Run: MODEL=.cache/bench-models/reranker-bench/model.onnx TOKENIZER=.cache/bench-models/reranker-bench/tokenizer.json \
         uvicorn --workers 2 --loop uvloop --http httptools --app-dir benches/python fastapi_rerank:app --port 8000
"""

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from tokenizers import Tokenizer

MODEL = os.environ["MODEL"]
MAX_SEQ_LEN = int(os.environ.get("MAX_SEQ_LEN", "512"))

options = ort.SessionOptions()
# 0: ONNX Runtime's default (a thread per core), as an untuned server has it.
options.intra_op_num_threads = int(os.environ.get("INTRA_OP_THREADS", "1"))
session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
input_names = {i.name for i in session.get_inputs()}
tokenizer = Tokenizer.from_file(os.environ["TOKENIZER"])
tokenizer.enable_truncation(MAX_SEQ_LEN, strategy="only_second")
tokenizer.enable_padding()  # to the longest pair of the request
app = FastAPI()


class RerankRequest(BaseModel):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False


@app.post("/rerank")
def rerank(request: RerankRequest) -> list[dict]:
    if not request.query or not request.texts or any(not t for t in request.texts):
        raise HTTPException(status_code=400, detail="empty input")
    encodings = tokenizer.encode_batch([(request.query, t) for t in request.texts])
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.array([e.type_ids for e in encodings])}
    (logits,) = session.run(["logits"], {k: v for k, v in feeds.items() if k in input_names})
    scores = logits[:, 0] if request.raw_scores else 1.0 / (1.0 + np.exp(-logits[:, 0]))
    ranks = [{"index": int(i), "score": float(scores[i])} for i in np.argsort(-scores)]
    if request.return_text:
        for rank in ranks:
            rank["text"] = request.texts[rank["index"]]
    return ranks


@app.get("/health/ready")
def ready():
    return {"status": "ready"}
