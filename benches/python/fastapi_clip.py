"""The CLIP peer inferd is compared with: what a user hand-rolls to embed pictures with transformers' CLIP.

FastAPI on uvicorn (uvloop + httptools), one process per core, each with torch on one thread; a synchronous endpoint
(run in FastAPI's thread pool) that takes the picture as the body, decodes it with Pillow, makes the pixels with the
model's own image processor (transformers' CLIPImageProcessor, from preprocessor_config.json), runs the vision tower
and its projection, and answers as inferd does: the unit-length embedding. Each request runs alone: no batching
across requests.

Run: MODEL=.cache/bench-clip/clip \
         uvicorn --workers 2 --loop uvloop --http httptools --app-dir benches/python fastapi_clip:app --port 8000
"""

import io
import os

import torch
from fastapi import FastAPI, HTTPException, Request
from PIL import Image, ImageOps
from starlette.concurrency import run_in_threadpool
from transformers import CLIPImageProcessor, CLIPModel

MODEL = os.environ["MODEL"]
torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))
model = CLIPModel.from_pretrained(MODEL).eval()
processor = CLIPImageProcessor.from_pretrained(MODEL)
app = FastAPI()


def embed_sync(body: bytes) -> dict:
    try:
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(body))).convert("RGB")
    except Exception as e:  # Pillow raises many kinds for a bad picture
        raise HTTPException(status_code=400, detail=f"not a picture: {e}") from e
    pixels = processor(images=img, return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        out = model.get_image_features(pixel_values=pixels)
    vector = out if isinstance(out, torch.Tensor) else out.pooler_output
    vector = torch.nn.functional.normalize(vector, dim=-1)[0]
    return {"predictions": [{"width": img.width, "height": img.height, "outputs": {"embedding": vector.tolist()}}]}


@app.post("/models/{model}/predict")
async def predict(model: str, request: Request) -> dict:
    body = await request.body()
    # The work is synchronous and releases the GIL in Pillow and torch: run it off the event loop.
    return await run_in_threadpool(embed_sync, body)


@app.get("/health/ready")
def ready():
    return {"status": "ready"}
