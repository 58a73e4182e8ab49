"""What gpu_check.py asks of the GPU machine itself: running its commands, nvidia-smi's readings, NVIDIA's libraries
found and linked, the GPU test executables, and ONNX Runtime's GPU build where the machine's Python has one.
Standard library only, as gpu_check.py (which imports it from beside itself, in the bundle and in scripts/)."""

import glob
import os
import re
import site
import subprocess
import threading
import time

# Libraries the GPU build loads: the driver's two, then the toolkit's (NVIDIA's wheels).
DRIVER_LIBS = ["libcuda.so.1", "libnvidia-ml.so.1"]
TOOLKIT_LIBS = ["libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcudart.so.13", "libnvrtc.so.13"]


def run(cmd, timeout, env=None, log=None):
    """Runs a command; returns (exit status, output). A command past its timeout is killed: status 124."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        out, status = p.stdout.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out, status = (e.stdout or b"").decode(errors="replace") + f"\n(killed after {timeout} s)", 124
    except OSError as e:
        out, status = str(e), 127
    if log:
        with open(log, "w") as f:
            f.write(out)
    return status, out


def smi(query):
    """One row of `nvidia-smi --query-gpu` for GPU 0, as a dict."""
    status, out = run(["nvidia-smi", "-i", "0", f"--query-gpu={query}", "--format=csv,noheader,nounits"], 30)
    if status != 0:
        raise RuntimeError(f"nvidia-smi: {out.strip()}")
    return dict(zip(query.split(","), (v.strip() for v in out.strip().splitlines()[0].split(","))))


def library_dirs():
    """Folders that may hold NVIDIA's libraries, best first; never a `stubs` folder."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    packages = list(site.getsitepackages()) + [site.getusersitepackages()]
    for sp in packages:
        dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "cu13", "lib")))
        dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    dirs += ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/local/cuda/lib64",
             "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d) and "stubs" not in d.split(os.sep)]


def find_libraries(table):
    """Finds each library; returns the LD_LIBRARY_PATH that makes them all load, or None."""
    dirs = library_dirs()
    status, cache = run(["ldconfig", "-p"], 30)
    found, chosen = {}, []
    for lib in DRIVER_LIBS + TOOLKIT_LIBS:
        where = next((d for d in dirs if os.path.exists(os.path.join(d, lib))), None)
        if where is None and status == 0:
            m = re.search(rf"\s{re.escape(lib)} \(.*\) => (\S+)", cache)
            where = os.path.dirname(m.group(1)) if m else None
        found[lib] = where
        if where and where not in chosen:
            chosen.append(where)
    missing = [lib for lib, where in found.items() if where is None]
    figure = "; ".join(f"{lib} in {where}" for lib, where in found.items() if where)
    if missing:
        figure = f"missing: {', '.join(missing)}; " + figure
    table.add("libraries", "driver, cuBLAS, cuRAND, CUDA runtime, NVRTC", not missing, figure)
    if missing:
        return None
    return ":".join(chosen + [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d])


def check_links(table, bundle, env):
    """`ldd -r`: every needed library and symbol of the binaries resolves, and none to a link stub."""
    ok = True
    for name in ("inferd", "inferd-bench"):
        status, out = run(["ldd", "-r", os.path.join(bundle, "bin", name)], 60, env=env)
        problems = [l.strip() for l in out.splitlines()
                    if "not found" in l or "undefined symbol" in l or "/stubs/" in l]
        resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", out, re.M))
        cuda = [f"{lib} from {resolved[lib]}" for lib in DRIVER_LIBS + TOOLKIT_LIBS if lib in resolved]
        good = status == 0 and not problems and "libcuda.so.1" in resolved
        ok &= table.add("links", name, good, "; ".join(problems[:4]) if problems else "; ".join(cuda))
    return ok


def run_tests(table, bundle, env, results):
    for exe in sorted(glob.glob(os.path.join(bundle, "tests", "*"))):
        name = os.path.basename(exe)
        started = time.monotonic()
        # One at a time: a test that holds most of the GPU's memory must not meet another's allocations.
        status, out = run([exe, "--test-threads=1", "--nocapture"], 600, env=dict(env, RUST_BACKTRACE="1"),
                          log=os.path.join(results, f"test-{name}.log"))
        counts = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed", out)
        passed = sum(int(p) for p, _ in counts)
        failed = sum(int(f) for _, f in counts)
        failures = re.findall(r"^failures:\n((?:    \S+\n)+)", out, re.M)
        figure = f"{passed} passed, {failed} failed in {time.monotonic() - started:.0f} s"
        if failures:
            figure += ": " + ", ".join(failures[-1].split())
        # What the tests measured on the GPU, e.g. the wide network's error in each precision.
        measured = re.findall(r"^wide network, (\w+) on cuda:\d+: largest error (\S+)", out, re.M)
        if measured:
            figure += "; wide network's largest error: " + ", ".join(f"{p} {e}" for p, e in measured)
        table.add("tests", name, status == 0 and passed > 0 and failed == 0, figure)


def cpu_seconds(pid):
    """The CPU time process `pid` has used (user and system, every thread), in seconds; None where it has gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_gpu_mib(pid):
    """The GPU memory nvidia-smi says process `pid` holds, in MiB; None where it lists none for it."""
    status, out = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 30)
    for line in out.strip().splitlines() if status == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


class Sampler:
    """GPU 0's busy percentage from nvidia-smi (NVML) every 200 ms, stamped with this process's clock."""

    def __init__(self):
        self.samples = []
        self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits", "-lms", "200"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.strip())))
            except ValueError:
                pass

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def between(self, start, end):
        return [v for t, v in self.samples if start <= t <= end]


def onnxruntime_gpu():
    """A libonnxruntime >= 1.31 with its CUDA provider beside it, from the machine's Python, or None."""
    for sp in list(site.getsitepackages()) + [site.getusersitepackages()]:
        capi = os.path.join(sp, "onnxruntime", "capi")
        if not os.path.exists(os.path.join(capi, "libonnxruntime_providers_cuda.so")):
            continue
        for lib in sorted(glob.glob(os.path.join(capi, "libonnxruntime.so.1.*"))):
            minor = re.search(r"\.so\.1\.(\d+)", lib)
            if minor and int(minor.group(1)) >= 31:
                return lib
    return None
