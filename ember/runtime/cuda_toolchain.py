"""The CUDA toolchain: CUDA C to device images, with nvcc or NVRTC, behind the kernel cache.

``compile_cuda(source, archs)`` returns a ``CudaImages``: one cubin per architecture
(``sm_80``, ``sm_90``...) and the PTX of the oldest, which the driver JIT-compiles for any newer
GPU; and each kernel's resources as ptxas reports them (registers, spill stores and loads,
shared memory, stack), so a kernel that spills is seen at compile time. A GPU is never needed.

nvcc is used where it is on PATH (one process per architecture, in parallel; ``-Xptxas -v``
gives the resources). Otherwise NVRTC: ``libnvrtc`` from the ``nvidia-cuda-nvrtc`` wheel
(``pip install 'ember[cuda]'``) or a CUDA installation, through ctypes. Results are cached in
the kernel cache by the source and the architectures (the compiler that made them is recorded
inside, not part of the key: images made by nvcc serve a machine with NVRTC alone).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ember.errors import CompileError
from ember.runtime.cache import kernels_dir, note_write, touch, write_atomic
from ember.runtime.cuda_images import CudaImages

FORMAT = 1


def check_archs(archs: tuple[str, ...]) -> tuple[str, ...]:
    bad = [a for a in archs if not re.fullmatch(r"sm_\d+a?", a)]
    if not archs or bad:
        raise CompileError(f"CUDA architectures {list(archs)}: use names such as sm_80, sm_90")
    return tuple(sorted(set(archs), key=lambda a: int(re.sub(r"\D", "", a))))


def compile_cuda(source: str, archs: tuple[str, ...]) -> CudaImages:
    archs = check_archs(archs)
    # keyed by what the images are a function of, not by which compiler made them: a cache
    # filled by nvcc serves a machine that has NVRTC only
    key = hashlib.sha256(json.dumps([FORMAT, source, archs]).encode()).hexdigest()[:40]
    path = kernels_dir() / f"{key}.cuda"
    if path.exists() and touch(path):
        try:
            return _unpack(path.read_bytes())
        except (OSError, ValueError, KeyError):
            pass
    tool = _tool()
    if tool.startswith("nvcc"):
        images = _nvcc(source, archs)
    else:
        images = _nvrtc(source, archs)
    images.compiler = tool
    data = _pack(images)
    write_atomic(path, data)
    note_write(len(data))
    return images


def _pack(images: CudaImages) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in images.to_members().items():
            zf.writestr(name, data)
    return buf.getvalue()


def _unpack(data: bytes) -> CudaImages:
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    return CudaImages.from_members(members)


@functools.lru_cache(maxsize=1)
def _tool() -> str:
    """The compiler's identity: ``nvcc <version>`` or ``nvrtc <version>``."""
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
            m = re.search(r"release ([\d.]+), V([\d.]+)", out)
            return f"nvcc {m.group(2) if m else out.strip().splitlines()[-1]}"
        except (OSError, subprocess.SubprocessError):
            pass
    lib = _libnvrtc()
    if lib is None:
        raise CompileError("no CUDA compiler: neither nvcc on PATH nor libnvrtc was found; "
                           "install ember's CUDA extra (pip install 'ember[cuda]', which "
                           "brings nvidia-cuda-nvrtc) or a CUDA toolkit")
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"nvrtc {major.value}.{minor.value}"


# ------------------------------------------------------------------ nvcc
_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, dict[str, dict[str, int]]]:
    """``ptxas -v``'s report as {arch: {kernel: {registers, spill_stores, spill_loads, smem,
    stack}}}."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    cur: dict[str, int] | None = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = out.setdefault(m.group(2), {}).setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = _SPILL.search(line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                       spill_loads=int(m.group(3)))
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out


def _run(cmd: list[str], what: str) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"nvcc failed to run for {what}: {e}") from e
    if r.returncode != 0:
        raise CompileError(f"nvcc failed for {what} (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return r.stderr + r.stdout


def _nvcc(source: str, archs: tuple[str, ...]) -> CudaImages:
    nvcc = shutil.which("nvcc") or "nvcc"
    with tempfile.TemporaryDirectory(prefix="ember-cuda-") as tmp:
        src = Path(tmp) / "program.cu"
        src.write_text(source)

        def cubin(arch: str) -> tuple[str, bytes, str]:
            out = Path(tmp) / f"{arch}.cubin"
            log = _run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", "-w",
                        "-o", str(out), str(src)], arch)
            return arch, out.read_bytes(), log

        def ptx() -> bytes:
            out = Path(tmp) / "kernels.ptx"
            _run([nvcc, "-ptx", f"-arch=compute_{archs[0][3:]}", "-O3", "-w", "-o", str(out),
                  str(src)], "PTX")
            return out.read_bytes()

        with ThreadPoolExecutor(max_workers=min(len(archs) + 1, os.cpu_count() or 1)) as pool:
            jobs = [pool.submit(cubin, a) for a in archs]
            ptx_job = pool.submit(ptx)
            results = [j.result() for j in jobs]
            ptx_bytes = ptx_job.result()
    resources: dict[str, dict[str, dict[str, int]]] = {}
    for _, _, log in results:
        resources.update(parse_ptxas(log))
    return CudaImages({a: b for a, b, _ in results}, ptx_bytes, archs[0], resources)


# ------------------------------------------------------------------ NVRTC
def _nvrtc_candidates() -> list[str]:
    found = []
    for base in sys.path:
        found += glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*"))
        found += glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libnvrtc.so*"))
    for root in ("/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"):
        found += glob.glob(os.path.join(root, "libnvrtc.so*"))
    return [f for f in found if "builtins" not in f and "alt" not in f]


@functools.lru_cache(maxsize=1)
def _libnvrtc() -> ctypes.CDLL | None:
    for path in [*_nvrtc_candidates(), "libnvrtc.so"]:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    return None


def _nvrtc(source: str, archs: tuple[str, ...]) -> CudaImages:
    lib = _libnvrtc()
    assert lib is not None
    cubins = {a: _nvrtc_one(lib, source, [f"--gpu-architecture={a}"], "nvrtcGetCUBIN")
              for a in archs}
    ptx = _nvrtc_one(lib, source, [f"--gpu-architecture=compute_{archs[0][3:]}"],
                     "nvrtcGetPTX")
    return CudaImages(cubins, ptx, archs[0], {})


def _nvrtc_one(lib: ctypes.CDLL, source: str, opts: list[str], getter: str) -> bytes:
    prog = ctypes.c_void_p()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise CompileError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(rc).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"ember.cu", 0, None,
                                 None), "create")
    try:
        args = [o.encode() for o in [*opts, "-default-device", "--std=c++17"]]
        arr = (ctypes.c_char_p * len(args))(*args)
        rc = lib.nvrtcCompileProgram(prog, len(args), arr)
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CompileError(f"NVRTC failed to compile ember's CUDA:\n"
                               f"{log.value.decode(errors='replace')[-4000:]}")
        size = ctypes.c_size_t()
        check(getattr(lib, getter + "Size")(prog, ctypes.byref(size)), getter)
        out = ctypes.create_string_buffer(size.value)
        check(getattr(lib, getter)(prog, out), getter)
        return out.raw[:size.value]
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
