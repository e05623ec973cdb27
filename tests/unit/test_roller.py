"""Roller: the hardware abstraction layer, rTiles, alignment rules, construction and model."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from ember.errors import EmberError
from ember.kernel.roller import align, dense, hal
from ember.kernel.roller.construct import scale_up, shrink_for_units
from ember.kernel.roller.dense import ConvGeom
from ember.kernel.roller.rtile import conv_expr, matmul_expr

CPUINFO = """processor\t: 0
model name\t: Test CPU 9000
flags\t\t: fpu sse avx avx2 fma avx512f avx512bw
"""


def _sysfs(root: Path) -> Path:
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                             (2, "Unified", "2048K"), (3, "Unified", "16M")]):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "coherency_line_size").write_text("64\n")
    return root


@pytest.fixture()
def cpu(tmp_path: Path) -> hal.DeviceSpec:
    spec = hal.detect_cpu(2, CPUINFO, _sysfs(tmp_path / "cache"))
    return hal.with_measurements(spec, 100.0, {"L1": 200.0, "L2": 100.0},
                                 {"L3": 150.0, "DRAM": 30.0})


# --------------------------------------------------------------------------- HAL
def test_detect_cpu_reads_flags_and_caches(tmp_path: Path) -> None:
    spec = hal.detect_cpu(4, CPUINFO, _sysfs(tmp_path / "c"))
    assert (spec.lanes, spec.vector_regs, spec.units) == (16, 32, 4)
    assert spec.name == "Test CPU 9000"
    assert spec.layer("L1").capacity == 48 << 10          # the data cache, not instructions
    assert spec.layer("L2").capacity == 2 << 20
    assert spec.layer("L3").shared and not spec.layer("L2").shared
    assert spec.vector_split == 1
    # AVX2: kernels still compute in 16-lane vectors, each two of the 16 AVX registers
    avx2 = hal.detect_cpu(1, CPUINFO.replace("avx512f avx512bw", ""), tmp_path / "none")
    assert (avx2.lanes, avx2.vector_regs, avx2.vector_split) == (16, 16, 2)
    assert avx2.peak_gflops == spec.peak_gflops / 2       # nominal: half the FMA width
    assert avx2.layer("L1").capacity == 32 << 10          # defaults without sysfs


def test_register_tiles_fit_the_register_file() -> None:
    """R x V accumulators and V weight vectors, each ``split`` registers, and a broadcast: on
    AVX2 (16 registers, 2 per vector) 6 x 16 is the tallest one-vector tile, 2 x 32 the
    widest two-vector one; AVX-512 (32 registers) holds far more."""
    assert dense.max_rows(1, 16, 2) == 6 and dense.fits_registers(6, 1, 16, 2)
    assert not dense.fits_registers(7, 1, 16, 2)
    assert dense.max_rows(2, 16, 2) == 2 and not dense.fits_registers(3, 2, 16, 2)
    assert dense.max_rows(1, 32) == 26 and dense.max_rows(4, 32) == 5
    for v in range(1, 5):
        for regs, split in ((16, 2), (32, 1)):
            r = dense.max_rows(v, regs, split)
            assert r == 0 or (dense.fits_registers(r, v, regs, split)
                              and not dense.fits_registers(r + 1, v, regs, split))


def test_measurements_and_bandwidth(cpu: hal.DeviceSpec) -> None:
    assert cpu.peak_gflops == 100.0 and cpu.peak(2) == 200.0
    assert cpu.bandwidth("L2") == 200.0                   # private: per unit x units
    assert cpu.bandwidth("DRAM") == 30.0                  # shared: the machine's
    assert cpu.source == "measured"


def test_spec_file_overrides(cpu: hal.DeviceSpec, tmp_path: Path) -> None:
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"units": 8, "layers": [{"name": "L2", "capacity": 4096}]}))
    spec = hal.load_spec(p, cpu)
    assert spec.units == 8 and spec.layer("L2").capacity == 4096
    assert spec.layer("L1") == cpu.layer("L1")
    p.write_text(json.dumps({"cores": 3}))
    with pytest.raises(EmberError, match="unknown fields"):
        hal.load_spec(p, cpu)
    p.write_text("{not json")
    with pytest.raises(EmberError, match="cannot read device spec"):
        hal.load_spec(p, cpu)


def test_gpu_specs() -> None:
    for name in ("V100", "A100", "H100"):
        g = hal.GPU_SPECS[name]
        assert g.kind == "gpu" and g.lanes == 32 and g.banks == 32
        assert g.tensor_core is not None and g.layer("smem").capacity > 64 << 10
    assert hal.GPU_SPECS["H100"].units == 132


def test_fingerprint_ignores_noise(cpu: hal.DeviceSpec) -> None:
    other = hal.with_measurements(cpu, 100.2, {"L1": 200.3, "L2": 100.1},
                                  {"L3": 150.2, "DRAM": 30.1})
    assert other.fingerprint() == cpu.fingerprint()


# --------------------------------------------------------------------------- rTiles
def test_conv_footprint_counts_window_overlap() -> None:
    e = conv_expr(1, 16, 16, 8, 14, 14, 32, 3, 3)
    t = {"n": 1, "g": 1, "oh": 4, "ow": 4, "oc": 16, "kh": 3, "kw": 3, "ic": 8}
    fp = e.footprints(t)
    assert fp["X"] == 6 * 6 * 8                 # (4-1)+(3-1)+1 rows and columns
    assert fp["W"] == 3 * 3 * 8 * 16
    assert fp["Y"] == 4 * 4 * 16
    strided = conv_expr(1, 16, 16, 8, 7, 7, 32, 3, 3, sh=2, sw=2)
    assert strided.footprints(t)["X"] == 9 * 9 * 8


def test_axis_fusion_expands_rows() -> None:
    e = conv_expr(2, 7, 7, 8, 7, 7, 16, 1, 1).fuse("p", ("n", "oh", "ow"))
    assert e.axes["p"] == 98
    assert e.expand({"p": 5})["ow"] == 5 and e.expand({"p": 5})["oh"] == 1
    full = e.expand({"p": 10})
    assert (full["ow"], full["oh"], full["n"]) == (7, 2, 1)
    assert e.expand({"p": 98})["n"] == 2


def test_traffic_is_tiles_times_footprint() -> None:
    e = matmul_expr(64, 64, 64)
    t = {"b": 1, "m": 16, "n": 32, "k": 64}
    assert e.tiles(t) == 4 * 2
    assert e.traffic(t, {"A", "B"}) == 8 * (16 * 64 + 64 * 32) * 4


# --------------------------------------------------------------------------- alignment
def test_rules(cpu: hal.DeviceSpec) -> None:
    e = ConvGeom(1, 8, 8, 96, 8, 8, 40, 3, 3, 1, 1, 1, 1, 1).expr()
    rules = align.default_rules(cpu)
    assert e.vector_axis == "oc"
    assert align.next_aligned_sizes(e, "oc", 0, cpu, rules, limit=8) == [48]   # covers 40
    ic = align.aligned_sizes(e, "ic", cpu, rules)
    assert ic and all(s % 16 == 0 or s == 96 for s in ic)   # whole cache lines
    assert align.ShapeRule(0.1).admits(e, "p", 32, cpu)
    assert not align.ShapeRule(0.1).admits(e, "p", 60, cpu)      # pads 64 to 120
    gpu = hal.GPU_SPECS["A100"]
    assert not align.BankRule().admits(e, "ic", 48, gpu)
    assert align.BankRule().admits(e, "ic", 48, cpu)


@dataclass(frozen=True)
class PowersOfTwo:
    name: str = "pow2"

    def admits(self, expr, axis, size, spec) -> bool:  # noqa: ANN001
        return size & (size - 1) == 0 or size >= expr.axes[axis]

    def step(self, expr, axis, spec) -> int:  # noqa: ANN001
        return 1


def test_new_rule_plugs_into_construction(cpu: hal.DeviceSpec) -> None:
    g = ConvGeom(1, 1, 300, 256, 1, 300, 256, 1, 1, 1, 1, 1, 1, 1)
    rules = [*align.default_rules(cpu), PowersOfTwo()]
    for c in dense.construct(g, cpu, 2, 8, rules):
        assert c.KC & (c.KC - 1) == 0 or c.KC == g.ICg


# --------------------------------------------------------------------------- construction
GEOMS = [
    ConvGeom(1, 1, 1024, 1024, 1, 1024, 1024, 1, 1, 1, 1, 1, 1, 1),       # MatMul 1024^3
    ConvGeom(1, 1, 1, 4096, 1, 1, 4096, 1, 1, 1, 1, 1, 1, 1),             # GEMV
    ConvGeom(1, 58, 58, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1),             # ResNet 3x3
    ConvGeom(1, 7, 7, 512, 7, 7, 2048, 1, 1, 1, 1, 1, 1, 1),              # 7x7 plane
    ConvGeom(1, 17, 17, 128, 8, 8, 256, 3, 3, 2, 2, 1, 1, 32),            # grouped, strided
    ConvGeom(1, 3, 3, 3, 1, 1, 5, 3, 3, 1, 1, 1, 1, 1),                   # tiny
]


@pytest.mark.parametrize("g", GEOMS, ids=lambda g: f"P{g.P}xOC{g.OC}xK{g.ICg}g{g.G}")
def test_construction_is_aligned_and_fills_units(cpu: hal.DeviceSpec, g: ConvGeom) -> None:
    cands = dense.construct(g, cpu, 2, 8)
    assert 1 <= len(cands) <= 8
    preds = [c.predicted for c in cands]
    assert preds == sorted(preds) and all(p > 0 for p in preds)
    for c in cands:
        assert c.R * c.V + c.V + 1 <= cpu.vector_regs          # accumulators fit registers
        assert c.NT % c.NB == 0 and 1 <= c.R <= g.P
        assert c.KC <= g.ICg and (c.KC % 16 == 0 or c.KC == g.ICg)
        tasks = g.G * -(-g.OCg // c.NT) * -(-g.P // c.PT)
        work = g.P * g.OC
        assert tasks >= 2 or work <= c.R * c.NB * 2               # small ops: shrunk


def test_model_prefers_more_units_and_penalizes_imbalance(cpu: hal.DeviceSpec) -> None:
    g = GEOMS[0]
    c = dense.construct(g, cpu, 2, 1)[0]
    assert dense.predict(g, c, cpu, 2) < dense.predict(g, c, cpu, 1)
    one_task = dense.DenseTile(c.R, c.V, c.KC, g.P, -(-g.OCg // c.NB) * c.NB, "p")
    assert dense.predict(g, one_task, cpu, 2) > dense.predict(g, c, cpu, 2)


def test_scale_up_stops_at_capacity(cpu: hal.DeviceSpec) -> None:
    e = matmul_expr(512, 512, 512)
    rules = align.default_rules(cpu)
    cap = 64 << 10
    tiles = scale_up(e, {"b": 1, "m": 4, "n": 16, "k": 16}, ["m", "n", "k"],
                     lambda t: e.bytes(t) <= cap, lambda t: e.traffic(t, {"A", "B"}),
                     lambda t: e.bytes(t), cpu, rules)
    assert tiles
    for t in tiles:
        assert e.bytes(t) <= cap
        # cannot grow any axis to its next aligned size and still fit
        for a in ("m", "n", "k"):
            nxt = align.next_aligned_sizes(e, a, t[a], cpu, rules, limit=1)
            assert not nxt or e.bytes({**t, a: nxt[0]}) > cap


def test_shrink_for_units() -> None:
    e = matmul_expr(8, 64, 64)
    tiles = shrink_for_units(e, {"b": 1, "m": 8, "n": 64, "k": 64}, ["m", "n"], 4,
                             {"b": 1, "m": 2, "n": 16, "k": 64})
    assert e.tiles(tiles[-1]) >= 8 and math.prod(tiles[0].values()) > 0
