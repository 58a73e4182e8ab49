"""The GPU check's CUDA shared memory (Triton's `cudasharedmemory` extension), as a Triton client uses it: GPU memory
allocated in this process with the CUDA runtime (`cudaMalloc`), its IPC handle (`cudaIpcGetMemHandle`) registered
over HTTP, inputs read from it and outputs written to it by inferd, checked against the same request's answer sent
in the body; status, the client's mistakes (400), and unregistering. In a rehearsal (the CPU build) the register
call must be refused, naming the CUDA build. Standard library only (ctypes), as gpu_check.py.

gpu_check.py runs it on its server. Alone, a short device check of this step only (a minute of GPU time, with a
server of two digits models), from an unpacked bundle:

  python3 scripts/gpu_cudashm.py --bundle inferd-gpu [RESULTS]"""

import base64
import ctypes
import os
import struct
import time

HANDLE_BYTES = 64
HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2


class Cuda:
    """The few CUDA runtime calls a client makes, from libcudart.so.13 in one of `library_path`'s folders."""

    def __init__(self, library_path):
        path = next((os.path.join(d, "libcudart.so.13") for d in library_path.split(":")
                     if os.path.exists(os.path.join(d, "libcudart.so.13"))), "libcudart.so.13")
        self.lib = ctypes.CDLL(path)
        self.call("cudaSetDevice", 0)

    def call(self, name, *args):
        status = getattr(self.lib, name)(*args)
        if status != 0:
            self.lib.cudaGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{name}: {self.lib.cudaGetErrorString(status).decode()} ({status})")

    def alloc(self, size):
        pointer = ctypes.c_void_p()
        self.call("cudaMalloc", ctypes.byref(pointer), ctypes.c_size_t(size))
        return pointer

    def free(self, pointer):
        self.call("cudaFree", pointer)

    def upload(self, pointer, data):
        self.call("cudaMemcpy", pointer, data, ctypes.c_size_t(len(data)), HOST_TO_DEVICE)

    def download(self, pointer, size):
        buffer = ctypes.create_string_buffer(size)
        self.call("cudaMemcpy", buffer, pointer, ctypes.c_size_t(size), DEVICE_TO_HOST)
        return buffer.raw

    def handle(self, pointer):
        """The allocation's IPC handle, in base64 as tritonclient's `get_raw_handle` gives it."""
        handle = ctypes.create_string_buffer(HANDLE_BYTES)
        self.call("cudaIpcGetMemHandle", handle, pointer)
        return base64.b64encode(handle.raw).decode()


def register(http, base, name, handle, size, device=0):
    body = {"raw_handle": {"b64": handle}, "device_id": device, "byte_size": size}
    return http(base, f"/v2/cudasharedmemory/region/{name}/register", body)


def infer_body(rows, in_size, out_size):
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [len(rows), 64],
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": in_size}}],
        "outputs": [{"name": "logits",
                     "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": out_size}}],
    }


def check(table, plan, http, base, library_path, pixels, models):
    """Registers an input and an output region in GPU memory, infers each of `models` (digits variants) through
    them, and compares the output each left in GPU memory with the same request's answer in the body."""
    rows = pixels
    data = struct.pack(f"<{len(rows) * 64}f", *(v for row in rows for v in row))
    in_size, out_size = len(data), len(rows) * 10 * 4
    # The server's metadata lists the extension where the build serves it: the CUDA build's, not the CPU build's.
    status, meta = http(base, "/v2")
    listed = "cuda_shared_memory" in (meta.get("extensions", []) if isinstance(meta, dict) else [])
    if plan.rehearse:
        status, answer = register(http, base, "in", base64.b64encode(bytes(HANDLE_BYTES)).decode(), in_size)
        message = answer.get("error", "") if isinstance(answer, dict) else str(answer)
        return table.add("cuda shm", "register on the CPU build",
                         status == 400 and "CUDA build" in message and not listed,
                         f"{status}: {message[:160]}; listed in /v2's extensions: {listed}")
    table.add("cuda shm", "listed in /v2's extensions", listed, f"{meta.get('extensions') if listed else meta}")
    cuda = Cuda(library_path)
    pointers = []
    try:
        source, target = cuda.alloc(in_size), cuda.alloc(out_size)
        pointers += [source, target]
        cuda.upload(source, data)
        answers = [register(http, base, "in", cuda.handle(source), in_size),
                   register(http, base, "out", cuda.handle(target), out_size)]
        if any(status != 200 for status, _ in answers):
            return table.add("cuda shm", "register", False, "; ".join(f"{s}: {str(a)[:200]}" for s, a in answers))
        status, regions = http(base, "/v2/cudasharedmemory/status")
        listed = sorted((r["name"], r["device_id"], r["byte_size"]) for r in regions) if status == 200 else regions
        want = [("in", 0, in_size), ("out", 0, out_size)]
        table.add("cuda shm", "register, status", listed == want, f"{listed}")
        for model in models:
            check_model(table, cuda, http, base, model, rows, target, (in_size, out_size))
        check_mistakes(table, cuda, http, base, in_size)
        http(base, "/v2/cudasharedmemory/unregister", {})
        status, regions = http(base, "/v2/cudasharedmemory/status")
        table.add("cuda shm", "unregister", status == 200 and regions == [], f"{status}: {regions}")
    finally:
        # The server lets go of the memory before it is freed, whatever failed (unregister answers once closed).
        http(base, "/v2/cudasharedmemory/unregister", {})
        for pointer in pointers:
            cuda.free(pointer)


def check_model(table, cuda, http, base, model, rows, target, sizes):
    in_size, out_size = sizes
    cuda.upload(target, bytes(out_size))
    status, answer = http(base, f"/v2/models/{model}/infer", infer_body(rows, in_size, out_size))
    if status != 200:
        return table.add("cuda shm", model, False, f"{status}: {str(answer)[:200]}")
    got = struct.unpack(f"<{out_size // 4}f", cuda.download(target, out_size))
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [len(rows), 64],
                        "data": [v for row in rows for v in row]}]}
    status, plain = http(base, f"/v2/models/{model}/infer", body)
    if status != 200:
        return table.add("cuda shm", model, False, f"the same request in the body: {status}: {str(plain)[:200]}")
    want = plain["outputs"][0]["data"]
    scale = max(abs(v) for v in want) or 1.0
    error = max(abs(g - w) for g, w in zip(got, want)) / scale
    # An output in shared memory is answered named, typed and shaped, without data or parameters, as Triton does.
    output = answer["outputs"][0]
    in_memory = "data" not in output and [int(d) for d in output["shape"]] == [len(rows), 10]
    # The time of a request through GPU memory and through the body, 20 of each (a figure, not a limit).
    times = {}
    for way, request in (("cuda shm", infer_body(rows, in_size, out_size)), ("json", body)):
        started = time.monotonic()
        for _ in range(20):
            http(base, f"/v2/models/{model}/infer", request)
        times[way] = (time.monotonic() - started) / 20 * 1000
    table.add("cuda shm", f"{model}: inputs and outputs in GPU memory", error <= 1e-6 and in_memory,
              f"{len(rows)} rows; largest difference from the body's answer {error:.1e} of the largest output; "
              f"{times['cuda shm']:.2f} ms a request, {times['json']:.2f} ms in JSON")


def check_mistakes(table, cuda, http, base, in_size):
    """A handle that is none, a region larger than its allocation, a GPU that is not there: each a 400."""
    small = cuda.alloc(256)
    try:
        cases = [("zeros", base64.b64encode(bytes(HANDLE_BYTES)).decode(), 256, 0),
                 ("larger than the allocation", cuda.handle(small), 1 << 26, 0),
                 ("no such GPU", cuda.handle(small), 256, 97),
                 ("a GPU past CUDA's ordinals", cuda.handle(small), 256, 1 << 32),
                 ("a handle of 3 bytes", base64.b64encode(b"abc").decode(), 256, 0)]
        problems = []
        for what, handle, size, device in cases:
            status, answer = register(http, base, "bad", handle, size, device)
            if status != 400:
                problems.append(f"{what}: {status} {str(answer)[:120]}")
        status, _ = http(base, "/v2/cudasharedmemory/region/bad/status")
        if status != 400:
            problems.append(f"a refused region is listed: {status}")
        table.add("cuda shm", "a client's mistakes are 400", not problems,
                  "; ".join(problems) or f"{len(cases)} refused, none registered")
    finally:
        http(base, "/v2/cudasharedmemory/region/bad/unregister", {})
        cuda.free(small)


def main():
    import argparse
    import json
    import shutil

    import gpu_check
    from gpu_machine import find_libraries

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="the unpacked bundle")
    parser.add_argument("results", nargs="?", default="/tmp/inferd-gpu-cudashm", help="folder for logs and the table")
    args = parser.parse_args()
    bundle, results = os.path.abspath(args.bundle), os.path.abspath(args.results)
    os.makedirs(results, exist_ok=True)
    table = gpu_check.Table()
    library_path = find_libraries(table)
    if library_path is None:
        print(table.markdown())
        return 1
    repo = os.path.join(results, "repository")
    shutil.rmtree(repo, ignore_errors=True)
    models = ["digits-cpu", "digits-gpu-fp32"]
    for name, device in zip(models, ("cpu", "cuda:0")):
        gpu_check.variant(os.path.join(bundle, "models", "digits-candle"), os.path.join(repo, name), device, "fp32")
    env = dict(os.environ, LD_LIBRARY_PATH=library_path)
    server = gpu_check.Server(bundle, repo, env, results, None)
    try:
        problem = server.wait_loaded(120)
        table.add("server", "inferd serve", not problem, problem or f"{len(models)} models ready")
        if not problem:
            pixels = json.load(open(os.path.join(bundle, "data", "digits_heldout.json")))["pixels"]
            check(table, gpu_check.Plan(False), gpu_check.http, server.base, library_path, pixels, models)
    finally:
        server.stop()
    print("\n" + table.markdown())
    with open(os.path.join(results, "table.md"), "w") as f:
        f.write(table.markdown() + "\n")
    return 1 if table.failed() else 0


if __name__ == "__main__":
    raise SystemExit(main())
