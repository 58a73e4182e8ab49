"""What a CUDA context, a cuBLAS handle and a cuRAND generator each take of a GPU's memory, read from the driver's
free memory after each step (ctypes on NVIDIA's libraries). candle makes a cuBLAS handle and a cuRAND generator per
device, so per model instance. Run on a GPU machine, with `CUBLAS_WORKSPACE_CONFIG` set or not:

    python3 benches/cuda_handles.py [LIBDIR]

LIBDIR holds libcudart.so.13, libcublas.so.13 and libcurand.so.10 (default: the nvidia-*-cu13 wheels of the
machine's Python). Results: benches/results/gpu-cublas-workspace.txt, benches/README.md "A model's GPU memory"."""

import ctypes
import glob
import os
import sys

PER_THREAD_STREAM = ctypes.c_void_p(2)  # CU_STREAM_PER_THREAD, the stream candle's devices use
XORWOW = 100  # CURAND_RNG_PSEUDO_DEFAULT


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else glob.glob(
        "/opt/torch/.venv/lib/python3.*/site-packages/nvidia/cu13/lib")[0]
    cudart = ctypes.CDLL(os.path.join(lib, "libcudart.so.13"))
    cublas = ctypes.CDLL(os.path.join(lib, "libcublas.so.13"))
    curand = ctypes.CDLL(os.path.join(lib, "libcurand.so.10"))

    def free():
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        assert cudart.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t)) == 0
        return f.value

    last = [None]

    def step(name, status=0):
        now = free()
        taken = 0 if last[0] is None else (last[0] - now) / 2**20
        last[0] = now
        print(f"{name:36} status {status}  {taken:6.1f} MiB", flush=True)

    print(f"CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG', '(unset)')}")
    cudart.cudaFree(ctypes.c_void_p(0))
    step("context (the baseline)")
    for which in ("first", "second"):
        handle = ctypes.c_void_p()
        step(f"cublasCreate ({which})", cublas.cublasCreate_v2(ctypes.byref(handle)))
        step("cublasSetStream (per-thread)", cublas.cublasSetStream_v2(handle, PER_THREAD_STREAM))
        if which == "first":
            buffers = []
            for _ in range(3):
                p = ctypes.c_void_p()
                cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4 * 256 * 256))
                buffers.append(p)
            step("3 x 256 KiB cudaMalloc")
            one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
            status = cublas.cublasSgemm_v2(handle, 0, 0, 256, 256, 256, ctypes.byref(one), buffers[0], 256,
                                           buffers[1], 256, ctypes.byref(zero), buffers[2], 256)
            cudart.cudaDeviceSynchronize()
            step("first sgemm, 256 x 256", status)
        generator = ctypes.c_void_p()
        step(f"curandCreateGenerator ({which})", curand.curandCreateGenerator(ctypes.byref(generator), XORWOW))
        step("curandSetStream", curand.curandSetStream(generator, PER_THREAD_STREAM))
        step("curandSetPseudoRandomGeneratorSeed",
             curand.curandSetPseudoRandomGeneratorSeed(generator, ctypes.c_ulonglong(299792458)))


if __name__ == "__main__":
    main()
