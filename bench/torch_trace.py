"""What ``torch.compile`` spends before any backend compiles: Dynamo's trace of the zoo's
PyTorch definition, then Dynamo with ``aot_autograd`` (the decompositions ember's backend
uses), each after a Dynamo reset, in one process. Those seconds are shared by inductor and
ember's ``torch.compile`` backend alike (issue 29's compile-time bound counts them).

    python bench/torch_trace.py resnet50 bert_base [--threads 2]
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["resnet50", "bert_base"])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import torch
    from torch._dynamo.backends.common import aot_autograd

    from ember import zoo
    from ember.bench.onnx_torch import OnnxTorch
    from ember.frontend.torch.importer import decompositions

    torch.set_num_threads(a.threads)
    backends = {"dynamo": lambda gm, ex: gm.forward,
                "dynamo+aot": aot_autograd(fw_compiler=lambda gm, ex: gm,
                                           decompositions=decompositions(torch))}
    print(f"{'model':14} " + " ".join(f"{k:>12}" for k in backends) + "   (seconds, first call)")
    for name in a.models:
        module = OnnxTorch(zoo.build(name, batch=1)).eval()
        xs = tuple(torch.from_numpy(v) for v in zoo.random_inputs(name, 1).values())
        row = []
        for backend in backends.values():
            torch._dynamo.reset()
            t = time.perf_counter()
            with torch.no_grad():
                torch.compile(module, backend=backend)(*xs)
            row.append(time.perf_counter() - t)
        print(f"{name:14} " + " ".join(f"{s:12.2f}" for s in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
