"""``Im2ColNHWC`` (the int8 products' windows, ``ir/ops/quant.py``) as runs of bytes copied.

For one output pixel and one window row ``kh``, the taps ``kw = 0..KW-1`` of an undilated
window are KW consecutive input pixels: in NHWC, ``KW * C`` contiguous bytes, which are also
contiguous in the output. Each is one ``memcpy`` (the generic nest copied C bytes a tap, the
tap's position worked out per copy: ResNet-18's 7x7 stem over 3 channels, 7 x 3 = 21 bytes a
row of taps, took 1.5 ms); a row that falls in the padding is the zero point; a run cut by the
left or right border is copied tap by tap. An rTask is a row of output pixels (n, oh).
"""

from __future__ import annotations

import hashlib

from ember.ir.graph import Graph
from ember.ir.ops.layout import conv_pads
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.schedule import numel
from ember.loops.ir import Bin, Buffer, Eval, For, ForKind, Var
from ember.loops.transform import format_stmt
from ember.lower.computes import static_shape


def applicable(body: Graph) -> bool:
    """A group that is one Im2ColNHWC of static shapes."""
    m = body.nodes[0]
    return (len(body.nodes) == 1 and m.op == "Im2ColNHWC" and m.output.type.is_static
            and m.output.type.dtype.name == "uint8")


def _source(fn: str, shape: tuple[int, ...], out: tuple[int, ...], attrs: dict) -> str:
    """The C function copying the windows of output row ``task`` (n, oh)."""
    _, h, w, c = shape
    _, oh, ow, kh, kw, _ = out
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl, _, _ = conv_pads(attrs)
    zp = int(attrs["pad_value"]) & 0xFF
    row = kw * c
    return f"""
static void {fn}(int64_t task, uint8_t *out, const uint8_t *x) {{
  const int64_t n = task / {oh}, y = task % {oh};
  uint8_t *dst = out + task * (int64_t){ow * kh * row};
  const uint8_t *img = x + n * (int64_t){h * w * c};
  for (int64_t ox = 0; ox < {ow}; ++ox) {{
    const int64_t ix0 = ox * {sw} - {pl};
    for (int64_t i = 0; i < {kh}; ++i, dst += {row}) {{
      const int64_t iy = y * {sh} - {pt} + i * {dh};
      if (iy < 0 || iy >= {h}) {{ memset(dst, {zp}, {row}); continue; }}
      const uint8_t *src = img + iy * (int64_t){w * c};
      if ({int(dw == 1)} && ix0 >= 0 && ix0 + {kw} <= {w}) {{
        memcpy(dst, src + ix0 * {c}, {row});
        continue;
      }}
      for (int64_t j = 0; j < {kw}; ++j) {{
        const int64_t ix = ix0 + j * {dw};
        if (ix < 0 || ix >= {w}) memset(dst + j * {c}, {zp}, {c});
        else memcpy(dst + j * {c}, src + ix * {c}, {c});
      }}
    }}
  }}
}}
"""


def build_im2col(name: str, body: Graph) -> Kernel:
    m = body.nodes[0]
    x = m.inputs[0]
    assert x is not None
    shape, out = static_shape(x.type), static_shape(m.output.type)
    fn = "em_im2col_" + hashlib.sha1(repr((shape, out, sorted(m.attrs.items())))
                                     .encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", numel(out), "uint8")
    x_buf = Buffer(f"{name}_x", numel(shape), "uint8")
    task = Var("task")
    stmt = For(task, T0, Bin("-", T1, T0), Eval(fn, (task, out_buf, x_buf)), ForKind.SERIAL)
    doc = (f"{body.name}: windows of {out[3]}x{out[4]} taps x {out[5]} channels, "
           f"{out[4] * out[5]}-byte runs copied")
    return Kernel(name, stmt, int(out[0]) * int(out[1]),
                  [(out_buf, OUTPUT), (x_buf, body.inputs.index(x))],
                  {fn: _source(fn, tuple(int(d) for d in shape),  # type: ignore[arg-type]
                               tuple(int(d) for d in out), m.attrs)},  # type: ignore[arg-type]
                  0, doc, format_stmt(stmt))
