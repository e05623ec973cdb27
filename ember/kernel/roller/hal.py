"""Roller's hardware abstraction layer: a device as memory layers over execution units.

A ``DeviceSpec`` is what the construction and the performance model see (Roller §3.2): a stack
of memory layers from the fastest (registers) to the slowest (DRAM / HBM), each with a capacity,
a transaction length and a bandwidth, and ``units`` execution units (CPU cores, GPU SMs) each
with a peak fp32 rate. Nothing else about the machine reaches the construction, so the CUDA
backend reuses it unchanged with a GPU spec.

For the CPU, registers and caches are detected (``/proc/cpuinfo`` flags, ``/sys`` cache
descriptors); peak compute and the bandwidth of each layer come from the one-time machine probe
(``ember.runtime.probe``), handed in by the driver through ``with_measurements`` (this layer
does not import the runtime). A JSON spec file overrides any field (``load_spec``; the driver
reads ``EMBER_DEVICE_SPEC``). The GPU specs are datasheet figures, kept for the CUDA backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ember.errors import EmberError


@dataclass(frozen=True)
class MemLayer:
    name: str            # "reg", "L1", "L2", "L3", "DRAM"; GPUs: "reg", "smem", "L2", "HBM"
    capacity: int        # bytes: per unit for private layers, whole device for shared ones
    transaction: int     # bytes moved per access: cache line, memory transaction
    bandwidth: float     # GB/s: per unit for private layers, whole device for shared ones
    shared: bool = False  # one instance shared by all units (L3, DRAM, GPU L2)
    ways: int = 0        # set associativity of a cache (0: unknown, taken as fully associative)


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    kind: str                       # "cpu" | "gpu"
    units: int                      # cores / SMs
    lanes: int                      # fp32 lanes of one SIMD instruction / threads of a warp
    vector_regs: int                # architectural vector registers (GPU: 32-bit regs / thread)
    peak_gflops: float              # fp32 FMA peak of one unit
    layers: tuple[MemLayer, ...]    # fastest first
    banks: int = 0                  # shared-memory banks (GPU)
    tensor_core: tuple[int, int, int] | None = None   # MMA shape (m, n, k), fp16 in / fp32 acc
    # CPU: hardware registers one of ``lanes``' vectors takes (ember's CPU kernels are written
    # in 16-lane vectors; AVX2 holds one in two 256-bit registers, SSE in four)
    vector_split: int = 1
    measured: dict[str, float] = field(default_factory=dict)   # micro-benchmarked figures
    source: str = "detected"

    def layer(self, name: str) -> MemLayer:
        for lay in self.layers:
            if lay.name == name:
                return lay
        raise KeyError(f"device {self.name!r} has no memory layer {name!r}")

    def bandwidth(self, name: str, units: int | None = None) -> float:
        """GB/s that ``units`` units (default all) draw from layer ``name`` together."""
        lay = self.layer(name)
        return lay.bandwidth if lay.shared else lay.bandwidth * (units or self.units)

    def peak(self, units: int | None = None) -> float:
        return self.peak_gflops * (units or self.units)

    def fingerprint(self) -> str:
        """What a kernel choice depends on: a stable text of every field but ``source``."""
        d = asdict(self)
        d.pop("source")
        d["measured"] = {k: _sig2(v) for k, v in sorted(self.measured.items())}
        d["layers"] = [{**lay, "bandwidth": _sig2(lay["bandwidth"])} for lay in d["layers"]]
        d["peak_gflops"] = _sig2(self.peak_gflops)
        return json.dumps(d, sort_keys=True)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _sig2(v: float) -> float:
    """Two significant digits: measured figures differ by noise between probes."""
    return float(f"{v:.2g}")


# --------------------------------------------------------------------------- CPU detection
CODE_LANES = 16    # fp32 lanes of the vectors ember's CPU kernels are written in (em_v16)


def _cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _sys_caches(root: Path) -> dict[str, tuple[int, int, int]]:
    """``{"L1": (bytes, line, ways), ...}`` of data/unified caches, from sysfs."""
    out: dict[str, tuple[int, int, int]] = {}
    for idx in sorted(root.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
            line = int((idx / "coherency_line_size").read_text().strip() or 64)
            ways_file = idx / "ways_of_associativity"
            ways = int(ways_file.read_text().strip() or 0) if ways_file.exists() else 0
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        out[f"L{level}"] = (int(size.rstrip("KMG")) * mult, line, ways)
    return out


def detect_cpu(units: int | None = None, cpuinfo: str | None = None,
               cache_root: Path | None = None) -> DeviceSpec:
    """The CPU as detected, with nominal (not yet measured) peak and bandwidths."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags = _cpu_flags(cpuinfo)
    # ember's CPU kernels compute in 16-lane (64-byte) vectors; the hardware's are as wide
    # (AVX-512), or the compiler splits each into two (AVX/AVX2) or four (SSE, NEON)
    if "avx512f" in flags:
        hw_lanes, regs = 16, 32
    elif "avx2" in flags or "avx" in flags:
        hw_lanes, regs = 8, 16
    else:
        hw_lanes, regs = 4, 16 if "sse2" in flags else 32
    lanes = CODE_LANES
    caches = _sys_caches(cache_root or Path("/sys/devices/system/cpu/cpu0/cache"))
    l1 = caches.get("L1", (32 << 10, 64, 8))
    l2 = caches.get("L2", (512 << 10, 64, 8))
    l3 = caches.get("L3", (8 << 20, 64, 16))
    if units is None:
        units = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    peak = hw_lanes * 2 * 2 * 3.0   # two FMA pipes at a nominal 3 GHz until measured
    layers = (
        MemLayer("reg", regs * lanes * 4, lanes * 4, peak * 6),
        MemLayer("L1", l1[0], l1[1], 180.0, ways=l1[2]),
        MemLayer("L2", l2[0], l2[1], 110.0, ways=l2[2]),
        MemLayer("L3", l3[0], l3[1], 90.0 * units, shared=True, ways=l3[2]),
        MemLayer("DRAM", 1 << 40, 64, 20.0, shared=True),
    )
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines()
                  if ln.startswith("model name")), "cpu")
    return DeviceSpec(model, "cpu", units, lanes, regs, peak, layers,
                      vector_split=lanes // hw_lanes)


def with_measurements(spec: DeviceSpec, fma_gflops_1: float,
                      read_gbs_1: Mapping[str, float], read_gbs_all: Mapping[str, float],
                      extra: Mapping[str, float] | None = None) -> DeviceSpec:
    """``spec`` with the probe's figures: per-unit FMA peak, per-unit bandwidth of private
    layers (one thread reading), whole-machine bandwidth of shared layers (all threads)."""
    layers = []
    for lay in spec.layers:
        if lay.name == "reg":
            layers.append(replace(lay, bandwidth=fma_gflops_1 * 6))
            continue
        bw = (read_gbs_all if lay.shared else read_gbs_1).get(lay.name)
        layers.append(replace(lay, bandwidth=bw) if bw else lay)
    measured = {"fma_gflops_1": fma_gflops_1, **dict(extra or {})}
    return replace(spec, peak_gflops=fma_gflops_1, layers=tuple(layers), measured=measured,
                   source="measured")


def load_spec(path: str | os.PathLike[str], base: DeviceSpec | None = None) -> DeviceSpec:
    """A spec from JSON: a whole spec, or overrides of ``base``'s fields (``layers`` entries
    override the layer of the same name)."""
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise EmberError(f"cannot read device spec {path}: {e}; give a JSON object with "
                         f"DeviceSpec fields (see ember/kernel/roller/hal.py)") from e
    if base is None:
        if data.get("name") in GPU_SPECS:
            base = GPU_SPECS[data["name"]]
        else:
            base = detect_cpu()
    layers = {lay.name: lay for lay in base.layers}
    for entry in data.pop("layers", []):
        old = layers.get(entry["name"])
        layers[entry["name"]] = replace(old, **entry) if old else MemLayer(**entry)
    unknown = set(data) - set(DeviceSpec.__dataclass_fields__)
    if unknown:
        raise EmberError(f"device spec {path}: unknown fields {sorted(unknown)}")
    if "tensor_core" in data and data["tensor_core"] is not None:
        data["tensor_core"] = tuple(data["tensor_core"])
    return replace(base, layers=tuple(layers.values()), source=str(path), **data)


# --------------------------------------------------------------------------- GPU datasheets
def _gpu(name: str, sms: int, smem_kb: int, l2_mb: int, hbm_gbs: float, fp32_tflops: float,
         mma: tuple[int, int, int], clock_ghz: float) -> DeviceSpec:
    per_sm = fp32_tflops * 1000 / sms
    layers = (
        MemLayer("reg", 64 << 10 << 2, 4, per_sm * 6),     # 64 K 32-bit registers per SM
        MemLayer("smem", smem_kb << 10, 128, 128 * clock_ghz),  # 32 banks x 4 B per clock
        MemLayer("L2", l2_mb << 20, 32, hbm_gbs * 2.5, shared=True),
        MemLayer("HBM", 1 << 40, 32, hbm_gbs, shared=True),
    )
    return DeviceSpec(name, "gpu", sms, 32, 255, per_sm, layers, banks=32, tensor_core=mma,
                      source="datasheet")


GPU_SPECS: dict[str, DeviceSpec] = {
    "V100": _gpu("V100", 80, 96, 6, 900.0, 15.7, (16, 16, 16), 1.53),
    "A100": _gpu("A100", 108, 164, 40, 1555.0, 19.5, (16, 8, 16), 1.41),
    "H100": _gpu("H100", 132, 228, 50, 3350.0, 67.0, (16, 8, 16), 1.98),
    "H200": _gpu("H200", 132, 228, 50, 4800.0, 67.0, (16, 8, 16), 1.98),
}
