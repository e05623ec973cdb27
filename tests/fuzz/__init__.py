"""Differential fuzzing of ember against onnxruntime (issue 23, "What to build": fuzzing).

Usage, from the repository root::

    make fuzz N=2000 SEED=1                  # a campaign; JSON summary in bench/results/fuzz.json
    .venv/bin/python -m tests.fuzz -n 300 --seed 4 --show    # print every case as it ends
    .venv/bin/python -m tests.fuzz --seed 1 --index 219      # replay one case (seed, index)
    .venv/bin/python -m tests.fuzz --family feeds --ops 'Gather|Scatter' -n 100
    .venv/bin/python -m pytest tests/fuzz                    # the CI slice and the harness's tests

A case is reproducible from (seed, index) (``cases.make_case``). Its family is one of:

- ``graph``: a random valid ONNX graph of 1-8 nodes (``graphs``, rules in ``ops_math``,
  ``ops_nn``, ``ops_tensor``, ``ops_control``: element-wise ops, integer Div/Mod, Where, Cast,
  MatMul/Gemm/Conv/ConvTranspose/pools, reductions, Softmax/LayerNorm, shape and index ops,
  Resize, TopK, CumSum, If/Loop...), ranks 0-4, float32 mostly, float16, int32, int64, uint8,
  bool where the op allows, sometimes symbolic input dims; feeds are random normals with
  NaN/Inf/+-3e38 (INT_MIN/-1 for integers) sprinkled;
- ``feeds``: a valid graph fed bad or edge run-time inputs (``feeds.MUTATIONS``): zeros in
  integer divisors, INT_MIN / -1, out-of-range indices, wrong shapes/ranks/dtypes/names, a
  symbolic dim resized to 1, 0 or more, strided arrays, float16 extremes;
- ``mutant``: a valid graph's protobuf damaged (``mutate``): byte flips, truncations, splices,
  wrong dtypes, dangling names, negative dims, missing or mistyped attributes, duplicate
  outputs, unknown ops, cycles, bad opset, inconsistent initializers, huge shape constants.

Each case runs in a child process forked from a clean fork server, with a time limit
(``runner``): ember first (``ember.compile``, mostly ``schedule="sequential"``, 10%
``"auto"``), then onnxruntime (the judge; run with every intermediate value as an output),
then onnx's reference evaluator where the two disagree, then ``onnx.checker``. The outcome
(``judge``) is ``pass``, ``mismatch``, ``explained`` (a disagreement ``judge.EXPLAINED``
accounts for, with its reason), ``ember-error:<Class>``, ``raw-exception:<Type>``,
``crash:<SIGNAL>``, ``hang`` or ``ort-rejects``. The summary (``report``) counts outcomes and
named errors and lists every crash, hang, mismatch, raw exception and internal error
(VerifyError, CompileError) with its seed, index, graph, message and reproducer
(``model.onnx``, ``inputs.npz``, ``case.json`` under ``--repro``, default ``bench/out/fuzz``).
``known`` lists the defects being fixed and the slice cases that hit them.
"""
