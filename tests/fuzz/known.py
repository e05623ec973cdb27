"""Known defects: the bad outcomes the fuzzer finds today that are being fixed.

``DEFECTS`` names each defect (issue 23's list, and what the fuzzer found beside it);
``KNOWN_DEFECTS`` maps a case of the CI slice, (seed, index), to the defect it hits: the slice
test skips those cases. Empty it as the fixes land (``python -m tests.fuzz --seed S --index I``
replays one). ``SIGNATURES`` recognize a defect in any campaign's record, so that the table
of a campaign marks the bad outcomes that are already known.
"""

from __future__ import annotations

import re
from typing import Any

DEFECTS: dict[str, str] = {
    # issue 23, "known defects" being fixed
    "int-div-zero": "integer Div/Mod by zero kills the process with SIGFPE (Div) or returns "
                    "values where onnxruntime refuses (Mod, uint8 Div)",
    "cast-after-dense": "Cast after Conv/MatMul/MaxPool to int/float16/bool corrupts memory",
    "nan-vanishes": "NaN vanishes (or moves) in Relu/Clip/Max/Min/reductions/pools",
    "index-clamped": "out-of-range Gather/GatherElements/GatherND/Scatter indices are clamped "
                     "silently",
    "reducemean-int": "ReduceMean on integers returns zeros",
    "sym-broadcast-one": "symbolic broadcasting with a symbol equal to 1",
    "sym-pool-end-pad": "symbolic pools with end padding",
    "sym-add-self": "Add(t, t) in symbolic programs",
    "sym-split-keyerror": "Split with a symbolic dim raises KeyError",
    "auto-profile-div-zero": "issue item 17: schedule='auto' profiles on random feeds with "
                             "zeros in integer divisors",
    # found by the fuzzer (on the committed code, 0779dcd)
    "negative-dim-raw": "an input declared with a negative dim raises a raw ValueError "
                        "('negative dimension in shape') instead of a ModelError",
    "zero-size-resize": "Resize of a tensor with a 0-size dim raises ZeroDivisionError",
    "f16-reduce": "float16 ReduceL1 off by 5% (15.0 for 15.85; fixed: llabs)",
    # found by the fuzzer (in the working tree of 2026-11-26)
    "arity-unchecked": "a node with more inputs than its op takes (Where with 5) raises a raw "
                       "ValueError in lowering instead of a ModelError (fixed: the importer "
                       "checks onnx's schema)",
    "attr-type-unchecked": "an attribute of the wrong type (LeakyRelu alpha='garbage') raises "
                           "a raw ValueError in lowering instead of a ModelError (fixed: the "
                           "importer checks onnx's schema)",
    "vm-broadcast-unchecked": "on the VM, a symbolic dim bound to a size that does not "
                              "broadcast with a static dim (Xor(a[N], b[2]), N=3) returns "
                              "outputs instead of an InputError (fixed: VM segments keep "
                              "their nodes' run-time checks)",
    "prelu-one-thread": "PRelu (int32 and float32, [5,1,1,3], num_threads=1): element 11 is 0 "
                        "(fixed: gcc 12 masked loads; the C emitter evaluates such selects "
                        "eagerly)",
    "f16-reduce-nan": "float16 ReduceL1 (and ReduceL2 of a scalar) turns NaN into -inf "
                      "(fixed: |x| of float16 was llabs)",
    "sym-conv-kernel-unchecked": "Conv whose weight has a symbolic dim: a run-time size that "
                                 "contradicts kernel_shape is not refused (fixed: the "
                                 "type relation unifies them)",
    "attr-range-unchecked": "keepdims outside {0, 1} (2**40, 99) is taken as 1; onnxruntime "
                            "takes it as 0 (fixed: the importer refuses flags outside "
                            "{0, 1})",
    # found by the campaign of seed 11 (10,000 cases, on 2d34910), all fixed
    "vm-unknown-input": "a VM model ran with an input name the model does not have "
                        "(fixed: VMModel.run refuses unknown names)",
    "huge-tensor": "Tile by 2**62 raised a raw OverflowError, Pad by 2**31 into a pool "
                   "computed for minutes (fixed: a static program whose tensors exceed the "
                   "machine's memory is a ModelError naming the node)",
    "index-check-dropped": "Gather with a constant out-of-range index into an axis of one "
                           "element after a fused broadcast op: the read ignored the index and "
                           "its check (fixed: em_keep evaluates such checks)",
    "empty-pool": "GlobalMaxPool over a symbolic channel/spatial dim bound to 0 returned an "
                  "empty output where onnxruntime refuses (fixed: pools require non-batch "
                  "dims >= 1)",
    "empty-argmax": "ArgMax along a symbolic axis bound to 0 returned outputs where "
                    "onnxruntime refuses (fixed: a run-time check)",
    "negative-perm": "Transpose perm with negative axes: a raw IndexError in the layout pass "
                     "(fixed: refused, as onnxruntime does)",
    "masked-not-computed": "a bad index or a zero integer divisor in a position a fused "
                           "Where/Trilu discards: onnxruntime computes the whole producer and "
                           "refuses, ember does not compute discarded values (as it does not "
                           "compute dead nodes; an op's own guards, such as NLL's "
                           "ignore_index, rely on it)",
    "instancenorm-scale": "InstanceNormalization's scale against a symbolic channel dim was "
                          "not checked (fixed)",
    "reflect-pad-symbolic": "Pad reflect by more than a symbolic dim - 1 (fixed: a run-time "
                            "check, as onnxruntime refuses)",
    "oom-kill": "a Pad to 2**31 elements as a graph output: the output's pages were granted "
                "and the process killed by the kernel when they were touched (fixed: "
                "allocations beyond MemAvailable are an EmberError)",
    # found by the symbolic campaign of seed 41 rerun on 2026-11-28 (index 1754)
    "convt-zero-tap-nan": "a NaN or inf input of a ConvTranspose reached outputs it does not "
                          "feed: the sub-pixel form multiplied it by structural zero taps "
                          "(between dilated taps, past K in a phase); 0 * NaN = NaN (fixed: "
                          "such a ConvTranspose is one Conv per phase over its real taps)",
    # found by the symbolic campaign of seed 2028 (600 cases, 2026-11-28, index 150)
    "vm-segment-stale-dims": "a VM model (a Loop) whose first segment's shape analysis solved "
                             "symbols (N2 + 3 = 5 on a Concat): the segment after the loop "
                             "kept its nodes' old types and was refused ('dims computed from "
                             "data'), and the loop body, over [N2 + N3 + 6], could not bind "
                             "two names from one dim (fixed: segments re-infer their types; "
                             "an unbound linear input dim becomes one fresh symbol)",
    "convt-no-channels": "a (transposed) convolution over an input with no channels (a Slice "
                         "that leaves none) was refused: its numpy reference reshaped the "
                         "0-size operand with -1 (fixed: explicit sizes; cuda-sim campaign, "
                         "seed 2032, cases 88 and 136)",
    "empty-k-zero-rate": "a MatMul over an empty shared dim (a Slice to nothing, weights "
                         "[0, n]) with symbolic rows: the dense kernel's model divided by a "
                         "rate of zero, a raw ZeroDivisionError (fixed: K = 0 goes to the "
                         "generic nest; seed 2037, case 141)",
    "arg-empty-axis-no-output": "ArgMin/ArgMax along an empty axis of a tensor with another "
                                "0 dim (no output element) was refused (fixed: empty "
                                "output; cuda-sim campaign, seed 2041, case 166)",
    # found by the first cuda-sim campaign (seed 2031): a scope limit of issue 25, not a bug
    "gpu-static-only": "the GPU targets (cuda, cuda-sim) refuse a model whose shapes are "
                       "computed at run time (ember's VM: a Reshape to a computed shape, "
                       "NonZero), naming target='cpu'",
}

# (seed, index) of the CI slice (seed 1, indices 0-499) -> the defect it hits. The 44 cases
# the committed code 0779dcd failed (int-div-zero 15, nan-vanishes 7, index-clamped 4,
# reducemean-int 1, sym-broadcast-one 5, sym-split-keyerror 2, negative-dim-raw 8,
# zero-size-resize 1, f16-reduce 1) pass since the reliability fixes: the slice runs them all.
KNOWN_DEFECTS: dict[tuple[int, int], str] = {}


# defect -> (outcome regex, ops of which one must be in the graph, message regex)
SIGNATURES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "int-div-zero": (r"crash:SIGFPE|mismatch", ("Div", "Mod"),
                     r"died of SIGFPE|refused the inputs.*(Div|Mod) node"),
    "nan-vanishes": (r"mismatch", ("Relu", "Clip", "Max", "Min", "ReduceMax", "ReduceMin",
                                   "MaxPool", "AveragePool", "GlobalMaxPool"),
                     r"NaN positions differ .*ember -?[0-9.e+]+, onnxruntime nan"),
    "index-clamped": (r"mismatch", ("Gather", "GatherElements", "GatherND", "ScatterND",
                                    "ScatterElements"),
                      r"refused the inputs.*(out of|bound|Gather|Scatter)"),
    "reducemean-int": (r"mismatch", ("ReduceMean",), r"np\.int"),
    "sym-split-keyerror": (r"raw-exception:KeyError", ("Split",), ""),
    "negative-dim-raw": (r"raw-exception:ValueError", (), r"negative dimension"),
    "arity-unchecked": (r"raw-exception:ValueError", (), r"too many values to unpack"),
    "attr-type-unchecked": (r"raw-exception:ValueError", (), r"could not convert string"),
    "vm-broadcast-unchecked": (r"mismatch", (), r"(?i)refused the inputs.*broadcast"),
    "f16-reduce-nan": (r"mismatch", ("ReduceL1", "ReduceL2"),
                       r"NaN positions differ .*ember -?inf, onnxruntime nan"),
    "sym-conv-kernel-unchecked": (r"mismatch", ("Conv",), r"kernel_shape is not compatible"),
    "convt-zero-tap-nan": (r"mismatch", ("ConvTranspose",),
                           r"NaN positions differ .*ember nan, onnxruntime -?[0-9]"),
    "vm-segment-stale-dims": (r"ember-error:(UnsupportedOpError|InputError)", ("Loop",),
                              r"computed from data|must be \(+d\d+\+d\d+"),
    "gpu-static-only": (r"ember-error:EmberError", (),
                        r"target 'cuda(-sim)?': models with shapes computed at run time"),
}


def known_defect(rec: dict[str, Any]) -> str | None:
    """The defect a record hits: listed in ``KNOWN_DEFECTS``, or matching a signature."""
    key = KNOWN_DEFECTS.get((rec["seed"], rec["index"]))
    if key:
        return key
    for name, (outcome, ops, message) in SIGNATURES.items():
        if re.match(outcome, rec["outcome"]) and (not ops or set(ops) & set(rec["ops"])) \
                and re.search(message, rec.get("message", "")):
            return name
    return None
