"""Random valid ONNX graphs of 1-8 nodes over ember's op set.

Pre: a seeded ``numpy.random.Generator``. Post (``random_graph``): a ``Generated`` whose model
passes ``onnx.checker.check_model(full_check=True)`` and onnx's strict shape inference; its
inputs carry ``InputSpec`` domains for the feeds; some input dims may be symbolic
(``dim_param``: equal names only where the drawn sizes are equal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from tests.fuzz import ops_control, ops_extra, ops_math, ops_nn, ops_signal, ops_tensor
from tests.fuzz.builder import NAMES, Builder, InputSpec, Reject

RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    **ops_math.RULES, **ops_nn.RULES, **ops_tensor.RULES, **ops_control.RULES,
    **ops_extra.RULES, **ops_signal.RULES}
OPSETS = (13, 17, 18, 21, 23, 26)
OPSET_WEIGHTS = (0.12, 0.45, 0.18, 0.1, 0.08, 0.07)
MAX_OUTPUTS = 4


@dataclass
class Generated:
    """A generated model and how to feed it."""

    model: onnx.ModelProto
    specs: list[InputSpec]
    opset: int
    ops: list[str]
    symbolic: bool

    def describe(self) -> str:
        return describe(self.model)


def random_graph(rng: np.random.Generator, max_nodes: int = 8, symbolic: float = 0.25,
                 ops: Callable[[str], bool] | None = None, first: Sequence[str] = ()
                 ) -> Generated:
    """A random valid graph; ``ops`` filters the op table (by op name); ``first``: the first
    node is one of these ops (when one of them fits)."""
    for _ in range(20):
        g = _attempt(rng, max_nodes, symbolic, ops, first)
        if g is not None:
            return g
    raise RuntimeError("no valid graph in 20 attempts")  # pragma: no cover - generator bug


def _attempt(rng: np.random.Generator, max_nodes: int, symbolic: float,
             ops: Callable[[str], bool] | None, first: Sequence[str]) -> Generated | None:
    opset = int(rng.choice(OPSETS, p=OPSET_WEIGHTS))
    b = Builder(rng, opset)
    table = [(op, w) for op, (w, _) in RULES.items() if ops is None or ops(op)]
    names = [op for op, _ in table]
    weights = np.array([w for _, w in table])
    want = int(rng.integers(1, max_nodes + 1))
    for k in range(want * 6):
        if len(b.nodes) >= want:
            break
        if first and not b.nodes and k < 6:
            op = first[int(rng.integers(len(first)))]
        else:
            op = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        mark = b.mark()
        try:
            RULES[op][1](b)
        except (Reject, ValueError, IndexError, ZeroDivisionError):
            b.rollback(mark)   # the draw does not fit the values at hand (e.g. a 0-size dim)
    if not b.nodes:
        return None
    is_sym = bool(rng.random() < symbolic)
    if is_sym:
        _symbolize(b)
    inputs = [_input_info(s) for s in b.inputs]
    outputs = _outputs(b, inputs)
    if not outputs:
        return None
    model = b.model(outputs, inputs)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:  # noqa: BLE001 - the rules missed an invalid case: draw again
        return None
    return Generated(model, b.inputs, opset, [n.op_type for n in b.nodes],
                     is_sym and any(s.sym for s in b.inputs))


def _outputs(b: Builder, inputs: list[onnx.ValueInfoProto]) -> list[onnx.ValueInfoProto]:
    """Every node output nothing consumes, the last node's, and sometimes an intermediate;
    typed as onnx infers them from the declared (maybe symbolic) inputs; those whose shape
    it cannot infer are left out."""
    used = {i for n in b.nodes for i in n.input}
    produced = [o for n in b.nodes for o in n.output if o]
    picks = [o for o in produced if o not in used]
    picks += [o for o in produced if o in used and b.chance(0.1)]
    picks = list(dict.fromkeys([b.nodes[-1].output[0]] + picks))[:MAX_OUTPUTS]
    model = b.model([helper.make_empty_tensor_value_info(n) for n in picks], inputs)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001
        return []
    infos = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    out = []
    for name in picks:
        vi = infos.get(name)
        if vi is not None and vi.type.tensor_type.elem_type and \
                vi.type.tensor_type.HasField("shape"):
            out.append(vi)
    return out


def _symbolize(b: Builder) -> None:
    """Make some input dims symbolic; a shared name only for equal sizes."""
    k = 0
    for spec in b.inputs:
        if not spec.shape or not b.chance(0.6):
            continue
        for axis, size in enumerate(spec.shape):
            if b.chance(0.5):
                k += 1
                spec.sym[axis] = f"N{size}" if b.chance(0.6) else f"d{k}"


def _input_info(spec: InputSpec) -> onnx.ValueInfoProto:
    shape = [spec.sym.get(a, d) for a, d in enumerate(spec.shape)]
    return helper.make_tensor_value_info(spec.name, spec.dtype, shape)


def describe(model: onnx.ModelProto, limit: int = 400) -> str:
    """One line: opset, typed inputs, the nodes in order, the outputs."""
    def ty(vi: onnx.ValueInfoProto) -> str:
        t = vi.type.tensor_type
        dims = ",".join(d.dim_param or str(d.dim_value) for d in t.shape.dim)
        return f"{vi.name}:{NAMES.get(t.elem_type, t.elem_type)}[{dims}]"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), "?")
    nodes = "; ".join(f"{n.op_type}({','.join(n.input)})" for n in model.graph.node)
    text = (f"opset {opset}; in {' '.join(ty(i) for i in model.graph.input)}; {nodes}; "
            f"out {','.join(o.name for o in model.graph.output)}")
    return text if len(text) <= limit else text[: limit - 3] + "..."
