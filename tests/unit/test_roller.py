"""Roller: the hardware abstraction layer, rTiles, alignment rules, construction and model."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

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


@pytest.fixture(autouse=True)
def _cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every construction here is cold: no memo of an earlier test, an empty disk cache."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "ember-cache"))
    dense.forget()


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


# --------------------------------------------------------------------------- recorded choices
PINNED = Path(__file__).resolve().parents[1] / "specs" / "avx512_2core.json"


def _spec(name: str, regs: int, split: int, peak: float, l1: tuple[int, int], l2: int,
          l3: int, bw: tuple[float, ...]) -> hal.DeviceSpec:
    layers = (hal.MemLayer("reg", 2048, 64, bw[0]),
              hal.MemLayer("L1", l1[0], 64, bw[1], ways=l1[1]),
              hal.MemLayer("L2", l2, 64, bw[2], ways=16),
              hal.MemLayer("L3", l3, 64, bw[3], shared=True, ways=16),
              hal.MemLayer("DRAM", 1 << 40, 64, bw[4], shared=True))
    return hal.DeviceSpec(name, "cpu", 2, 16, regs, peak, layers, vector_split=split,
                          measured={"fma_gflops_1": peak})


def _specs() -> dict[str, hal.DeviceSpec]:
    """The pinned AVX-512 spec, a Xeon-like one (2 MB L2 per core: every scale-up longer)
    and an AVX2 one (16 registers, two per 16-lane vector): ``bench/roller_construct.py``'s."""
    return {
        "avx512": hal.load_spec(PINNED),
        "xeon": _spec("xeon-like", 32, 1, 120.0, (48 << 10, 12), 2 << 20, 60 << 20,
                      (720.0, 280.0, 120.0, 80.0, 20.0)),
        "avx2": _spec("avx2", 16, 2, 60.0, (32 << 10, 8), 512 << 10, 32 << 20,
                      (360.0, 200.0, 100.0, 70.0, 20.0)),
    }


def _conv(hw: int, c: int, oc: int, k: int) -> ConvGeom:
    p, out = k // 2, hw
    return ConvGeom(1, hw + 2 * p, hw + 2 * p, c, out, out, oc, k, k, 1, 1, 1, 1, 1, p, p, p, p)


def _matmul(m: int, k: int, n: int) -> list[ConvGeom]:
    """A static MatMul's geometries as ``conv.choose_tiling`` hands them to the spread."""
    g = ConvGeom(1, 1, m, k, 1, m, n, 1, 1, 1, 1, 1, 1, 1)
    return [replace(g, W=p, OW=p) for p in (g.P,) + dense.SPREAD]


SIGNATURES: dict[str, list[ConvGeom] | ConvGeom] = {
    "mm128x768x768": _matmul(128, 768, 768),
    "mm128x3072x768": _matmul(128, 3072, 768),
    "mm1x768x3072": _matmul(1, 768, 3072),
    "conv3x3_56": _conv(56, 64, 64, 3),
    "conv1x1_7": _conv(7, 512, 2048, 1),
    "grouped": ConvGeom(1, 17, 17, 128, 8, 8, 256, 3, 3, 2, 2, 1, 1, 32),
}

# (R, V, KC, PT, NT, order, pack) of the choice (K = 1, 2 units), as constructed before the
# construction was made fast (issue 24): the speed-up changed no choice
RECORDED = {
    "avx512": {"mm128x768x768": (5, 4, 256, 15, 64, "p", False),
               "mm128x3072x768": (5, 4, 240, 15, 64, "p", False),
               "mm1x768x3072": (14, 1, 768, 14, 128, "p", False),
               "conv3x3_56": (14, 1, 64, 238, 32, "p", False),
               "conv1x1_7": (14, 1, 512, 49, 80, "p", False),
               "grouped": (14, 1, 4, 64, 16, "p", False)},
    "xeon": {"mm128x768x768": (5, 4, 384, 15, 64, "p", False),
             "mm128x3072x768": (5, 4, 240, 15, 64, "p", False),
             "mm1x768x3072": (12, 2, 768, 16, 128, "p", False),
             "conv3x3_56": (14, 1, 64, 196, 64, "p", False),
             "conv1x1_7": (12, 2, 512, 49, 64, "p", False),
             "grouped": (14, 1, 4, 64, 16, "p", False)},
    "avx2": {"mm128x768x768": (6, 1, 192, 16, 32, "p", False),
             "mm128x3072x768": (2, 2, 128, 4, 32, "p", False),
             "mm1x768x3072": (6, 1, 384, 8, 128, "p", False),
             "conv3x3_56": (6, 1, 64, 90, 64, "p", False),
             "conv1x1_7": (6, 1, 256, 49, 128, "p", False),
             "grouped": (6, 1, 4, 64, 16, "p", False)},
}
# the top 8 of BERT's 768x768 MatMul on the Xeon-like spec, in order
RECORDED_TOP8 = [(5, 4, 384, 15, 64, "n", False), (5, 4, 384, 15, 64, "p", False),
                 (14, 1, 384, 14, 96, "n", False), (14, 1, 384, 14, 96, "p", False),
                 (8, 3, 384, 16, 48, "n", False), (8, 3, 384, 16, 48, "p", False),
                 (12, 2, 384, 32, 32, "n", False), (12, 2, 384, 32, 32, "p", False)]


def _construct(sig: list[ConvGeom] | ConvGeom, spec: hal.DeviceSpec, units: int = 2,
               topk: int = 1) -> list[dense.DenseTile]:
    if isinstance(sig, list):
        return dense.construct_spread(sig, spec, units, topk, pack=True)
    return dense.construct(sig, spec, units, topk)


def _fields(t: dense.DenseTile) -> tuple:
    return (t.R, t.V, t.KC, t.PT, t.NT, t.order, t.pack)


@pytest.mark.parametrize("name", ["avx512", "xeon", "avx2"])
def test_construction_chooses_as_recorded(name: str) -> None:
    spec = _specs()[name]
    for label, sig in SIGNATURES.items():
        (got,) = _construct(sig, spec)
        assert _fields(got) == RECORDED[name][label], label


def test_construction_top8_as_recorded() -> None:
    got = _construct(SIGNATURES["mm128x768x768"], _specs()["xeon"], topk=8)
    assert [_fields(t) for t in got] == RECORDED_TOP8


# --------------------------------------------------------------------------- construction cache
def test_warm_construction_reads_the_disk_cache(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process (the memo forgotten) constructs nothing: the spread and a conv's
    candidates come back from ``cache_dir()/roller-construct``, equal to the cold ones, their
    predicted times included; another spec is another key."""
    spec = _specs()["avx512"]
    sigs = [_matmul(64, 96, 80), _conv(14, 32, 48, 3)]
    cold = [_construct(s, spec, topk=8) for s in sigs]
    files = sorted((tmp_path / "ember-cache" / "roller-construct").glob("*.json"))
    assert len(files) == 2 and not list(files[0].parent.glob("*.tmp"))

    def boom(*args: object) -> None:
        raise AssertionError("constructed again")

    monkeypatch.setattr(dense, "_construct_spread", boom)
    monkeypatch.setattr(dense, "_construct", boom)
    dense.forget()
    warm = [_construct(s, spec, topk=8) for s in sigs]
    assert warm == cold
    assert [[t.predicted for t in c] for c in warm] == [[t.predicted for t in c] for c in cold]
    other = replace(spec, layers=tuple(replace(lay, capacity=lay.capacity * 2)
                                       if lay.name == "L2" else lay for lay in spec.layers))
    with pytest.raises(AssertionError, match="constructed again"):
        _construct(sigs[0], other, topk=8)


@pytest.mark.parametrize("junk", ["{not json", "[]", '{"key": 1, "value": []}', ""])
def test_corrupt_cache_entry_is_rebuilt(tmp_path: Path, junk: str) -> None:
    spec = _specs()["avx2"]
    g = _conv(14, 32, 48, 3)
    cold = _construct(g, spec, topk=4)
    (path,) = (tmp_path / "ember-cache" / "roller-construct").glob("*.json")
    entry = json.loads(path.read_text())
    path.write_text(junk)
    dense.forget()
    assert _construct(g, spec, topk=4) == cold
    assert json.loads(path.read_text()) == entry          # rewritten whole
    # a stored value of the right key but not tiles: rebuilt too
    path.write_text(json.dumps({**entry, "value": [{"R": "five"}]}))
    dense.forget()
    assert _construct(g, spec, topk=4) == cold


def test_memo_hands_out_copies() -> None:
    spec = _specs()["avx512"]
    g = _conv(14, 32, 48, 3)
    first = dense.construct(g, spec, 2, 4)
    first.clear()
    assert dense.construct(g, spec, 2, 4)


def test_warm_compile_constructs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model compiled again (a new process: the memo forgotten; the same cache directory)
    takes its MatMul's and its convolution's rPrograms from the disk cache."""
    import ember
    from tests.modelkit import make_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 24, 9, 9)).astype(np.float32)
    w = rng.standard_normal((32, 24, 3, 3)).astype(np.float32) * 0.2
    m = rng.standard_normal((9, 40)).astype(np.float32) * 0.2
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("MatMul", ["c", "m"], ["y"])],
                       {"x": x}, {"w": w, "m": m}, ["y"])
    want = ember.compile(model, num_threads=2)(x=x)

    def boom(*args: object) -> None:
        raise AssertionError("constructed again")

    monkeypatch.setattr(dense, "_construct_spread", boom)
    monkeypatch.setattr(dense, "_construct_once", boom)
    dense.forget()
    np.testing.assert_array_equal(ember.compile(model, num_threads=2)(x=x), want)


# --------------------------------------------------------------------------- the 8-lane tail
def test_a_block_with_a_half_empty_last_vector_computes_it_in_8_lanes() -> None:
    """With AVX-512 the last vector of a block holding at most 8 valid channels is an 8-lane
    accumulator (fed by the low half of each broadcast), loaded and stored only up to
    ``nvalid``; without AVX-512 the upper half's FMAs are skipped."""
    from ember.kernel.microkernel import emit_microkernel

    src = emit_microkernel(4, 2)
    tail = src[src.index("#ifdef EM_TAIL8"):]
    tail = tail[:tail.index("return;")]
    assert "if (nvalid <= 24) {" in tail
    assert "em_v8a a3_1_t = {0};" in tail and "em_v16a a3_0 = {0};" in tail
    assert "a3_1_t += EM_LO8(b) * w1_t;" in tail and "a3_0 += b * w0;" in tail
    assert "a3_1_t = EM_LO8(em_load_part(c + 3 * ldc + 16, nvalid - 16));" in tail
    assert "em_store_part(c + 3 * ldc + 16, a3_1, nvalid - 16);" in tail
    split = src[src.index("#ifdef EM_SPLIT8"):src.index("#ifdef EM_TAIL8")]
    assert "a3_1_1 +=" not in split[:split.index("return;")]


def test_the_model_counts_the_tail_at_its_measured_cost(cpu: hal.DeviceSpec) -> None:
    tail = replace(cpu, measured={**cpu.measured, "uk_tail8": 9.6})
    assert dense.padded_channels(24, 32, cpu) == 32            # not measured: a whole vector
    assert dense.padded_channels(24, 32, tail) == pytest.approx(25.6)
    assert dense.padded_channels(32, 32, tail) == 32           # no tail
    assert dense.padded_channels(40, 16, tail) == pytest.approx(48 - 6.4)
    assert dense.padded_channels(28, 16, tail) == 32           # 12 valid: a whole vector
    g = ConvGeom(N=1, H=40, W=40, C=96, OH=40, OW=40, OC=24, KH=3, KW=3, SH=1, SW=1, DH=1,
                 DW=1, G=1, pad_t=1, pad_l=1, pad_b=1, pad_r=1)
    t = dense.DenseTile(R=6, V=2, KC=96, PT=96, NT=32, order="p")
    assert dense.predict(g, t, tail, 2) < dense.predict(g, t, cpu, 2)


def test_gpu_gemm_model_charges_what_a_tile_issues_besides_its_fmas() -> None:
    """Roller's GPU GEMM model counts a block's shared loads and tile copies with its FMAs: a
    one-warp 8x64 tile with 2x8 threads issues about twice its FMAs (it had been ranked
    first for a 3136x64x576 conv on FMAs alone, and is no longer); 16-byte copies cost a
    quarter; and the large square product gets the classic 128x128 block of 256 threads with
    8x8 each."""
    from ember.kernel.roller import gemm_gpu as gg

    small = gg.GemmTile(8, 64, 32, 2, 8)
    gather = gg.Copies(gg.GATHER, gg.PLAIN.b)
    vec = gg.Copies(gg.GATHER / 4, gg.PLAIN.b / 4)
    assert gg.issued_per_fma(small, gather) > 1.9
    assert 1.0 < gg.issued_per_fma(small, vec) < gg.issued_per_fma(small, gather)
    big = gg.GemmTile(128, 128, 16, 8, 8)
    assert gg.issued_per_fma(big, gg.PLAIN) < 1.4
    h100 = hal.GPU_SPECS["H100"]
    best = gg.construct(4096, 4096, 4096, 1, h100, copies=gg.Copies(1.5, 1.5))[0]
    assert (best.BM, best.BN, best.TM, best.TN, best.threads) == (128, 128, 8, 8, 256)
    conv = gg.construct(3136, 64, 576, 1, h100, copies=vec)[0]
    assert conv.threads >= 64     # no longer the one-warp tile
