"""The GPU bundle opened for a probe on the GPU machine (benches/gpu_*.py): unpacked into a temporary folder, its
check (gpu_check.py) imported for its helpers, and the environment in which its binaries find NVIDIA's libraries."""
import os
import sys
import tarfile
import tempfile


def open_bundle(archive):
    """Returns (the unpacked bundle's folder, its gpu_check module, the environment for its binaries)."""
    unpacked = tempfile.mkdtemp()
    tarfile.open(archive).extractall(unpacked, filter="tar")
    bundle = os.path.join(unpacked, "inferd-gpu")
    sys.path.insert(0, bundle)
    import gpu_check

    library_path = gpu_check.find_libraries(gpu_check.Table())
    if library_path is None:
        sys.exit("the GPU's libraries are missing (the line above says which)")
    return bundle, gpu_check, dict(os.environ, LD_LIBRARY_PATH=library_path)
