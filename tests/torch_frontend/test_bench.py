"""``ember bench --frontend torch`` on the smallest zoo model: every engine's output agrees with
eager, the torch frontend compiles to the ONNX frontend's kernels, and the table has the ratios.
(No timing is asserted.)"""

from ember.bench import torch_frontend


def test_small_cnn_through_both_frontends():
    row = torch_frontend.bench_model("small_cnn", ["eager", "ember-onnx", "ember-torch"],
                                     threads=1, min_time=0.05)
    assert row["same_kernels"] is True
    assert max(row["max_abs_diff"].values()) < 1e-4
    text = torch_frontend.table([row])
    assert "torch/onnx frontend" in text and "same kernels: True" in text
