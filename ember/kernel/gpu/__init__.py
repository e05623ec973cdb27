"""GPU schedules: kernels over the loop IR with block and thread bindings, shared-memory tiles
and barriers (``base.GpuKernel``). ``codegen/cuda.py`` renders them as CUDA C; ``sim.py``
rewrites them as CPU kernels (thread loops serial, barriers as phase splits) for ``cuda-sim``.
"""
