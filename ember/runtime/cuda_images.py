"""The device images of a CUDA model: a cubin per architecture, PTX for the others, and
ptxas's resource report; what ``cuda_toolchain`` makes and ``cuda_model`` loads (loading
needs no compiler)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CudaImages:
    cubins: dict[str, bytes]                 # arch ("sm_90") -> cubin
    ptx: bytes                               # for architectures without a cubin (JIT)
    ptx_arch: str
    resources: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    compiler: str = ""                       # arch -> kernel symbol -> figures

    def to_members(self) -> dict[str, bytes]:
        out = {f"cuda/{a}.cubin": b for a, b in self.cubins.items()}
        out["cuda/kernels.ptx"] = self.ptx
        out["cuda/images.json"] = json.dumps({"ptx_arch": self.ptx_arch,
                                              "resources": self.resources,
                                              "compiler": self.compiler}).encode()
        return out

    @classmethod
    def from_members(cls, members: dict[str, bytes]) -> CudaImages:
        info = json.loads(members["cuda/images.json"])
        cubins = {Path(k).stem: v for k, v in members.items() if k.endswith(".cubin")}
        return cls(cubins, members["cuda/kernels.ptx"], info["ptx_arch"], info["resources"],
                   info.get("compiler", ""))
