"""Compiled loops: an ONNX ``Loop`` (or ``Scan``) whose body is one program runs its trips in C.

The VM runs a loop trip by trip, paying its own dispatch and a native call per trip (tens of
microseconds in Python). When a body is one static program whose interface is exactly
``(iteration, cond, *carried, *captures) -> (cond, *carried, *scan)`` (``ember.compiler.vm_control``
builds it so), this driver runs the whole loop in one native call::

    int ember_loop(run_fn body, void *workspace, int64_t trip, int has_trip, uint8_t cond,
                   int n_carried, const int64_t *carried_bytes, void *const *init,
                   void *const *buf_a, void *const *buf_b, void *const *final,
                   int n_caps, void *const *caps,
                   int n_scan, const int64_t *scan_bytes, void *const *scan_out,
                   int64_t *trips_done);

Trip i reads its carried values from the initial tensors (i = 0) or from the buffers trip i-1
wrote, and writes them to ``buf_a`` / ``buf_b`` alternately (never the buffer it reads); scan
value k of trip i goes to row i of ``scan_out[k]`` (rows of ``scan_bytes[k]``), so the caller
allocates ``trip`` rows (an upper bound: the condition may end the loop earlier, Nimble's
upper-bound mode) and keeps the first ``trips_done``. The final carried values are copied to
``final``. The body's own entry (``ember_run``) is called by address, in the library that
holds it, with that program's workspace.

``ember_scan`` does the same for a ``Scan`` over axis 0: trip t passes row t of each scan
input (t counted from the end when reversed) straight from the input's memory and writes row
t of each scan output in place; the trip count is the scan inputs' length.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.runtime.module import address, aligned_empty
from ember.runtime.natives import native_function
from ember.support import dtypes

SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef int (*run_fn)(void *const *, void *const *, void *);

int ember_loop(run_fn body, void *workspace, int64_t trip, int has_trip, uint8_t cond,
               int n_carried, const int64_t *carried_bytes, void *const *init,
               void *const *buf_a, void *const *buf_b, void *const *final,
               int n_caps, void *const *caps,
               int n_scan, const int64_t *scan_bytes, void *const *scan_out,
               int64_t *trips_done) {
    void *ins[2 + n_carried + n_caps];
    void *outs[1 + n_carried + n_scan];
    int64_t it = 0;
    uint8_t cin = cond, cout = 0;
    ins[0] = &it;
    ins[1] = &cin;
    for (int k = 0; k < n_carried; ++k) ins[2 + k] = init[k];
    for (int k = 0; k < n_caps; ++k) ins[2 + n_carried + k] = caps[k];
    outs[0] = &cout;
    int64_t i = 0;
    while ((!has_trip || i < trip) && cin) {
        it = i;
        for (int k = 0; k < n_carried; ++k) outs[1 + k] = (i & 1) ? buf_b[k] : buf_a[k];
        for (int k = 0; k < n_scan; ++k)
            outs[1 + n_carried + k] = (char *)scan_out[k] + i * scan_bytes[k];
        int rc = body(ins, outs, workspace);
        if (rc != 0) { *trips_done = i; return rc; }
        for (int k = 0; k < n_carried; ++k) ins[2 + k] = outs[1 + k];
        cin = cout;
        ++i;
    }
    for (int k = 0; k < n_carried; ++k) memcpy(final[k], ins[2 + k], (size_t)carried_bytes[k]);
    *trips_done = i;
    return 0;
}

/* Scan: trip t reads row t (or trips-1-t, reversed) of each scan input and writes row t (or
   trips-1-t) of each scan output; the states ping-pong like a loop's carried values. */
int ember_scan(run_fn body, void *workspace, int64_t trips,
               int n_state, const int64_t *state_bytes, void *const *init,
               void *const *buf_a, void *const *buf_b, void *const *final,
               int n_x, const int64_t *x_row_bytes, void *const *xs, const int64_t *x_rev,
               int n_caps, void *const *caps,
               int n_scan, const int64_t *scan_bytes, void *const *scan_out,
               const int64_t *out_rev) {
    void *ins[n_state + n_x + n_caps + 1];
    void *outs[n_state + n_scan + 1];
    for (int k = 0; k < n_state; ++k) ins[k] = init[k];
    for (int k = 0; k < n_caps; ++k) ins[n_state + n_x + k] = caps[k];
    for (int64_t t = 0; t < trips; ++t) {
        for (int j = 0; j < n_x; ++j)
            ins[n_state + j] = (char *)xs[j] + (x_rev[j] ? trips - 1 - t : t) * x_row_bytes[j];
        for (int k = 0; k < n_state; ++k) outs[k] = (t & 1) ? buf_b[k] : buf_a[k];
        for (int j = 0; j < n_scan; ++j)
            outs[n_state + j] = (char *)scan_out[j] +
                                (out_rev[j] ? trips - 1 - t : t) * scan_bytes[j];
        int rc = body(ins, outs, workspace);
        if (rc != 0) return rc;
        for (int k = 0; k < n_state; ++k) ins[k] = outs[k];
    }
    for (int k = 0; k < n_state; ++k) memcpy(final[k], ins[k], (size_t)state_bytes[k]);
    return 0;
}
"""

_VOIDPP = ctypes.POINTER(ctypes.c_void_p)
_I64P = ctypes.POINTER(ctypes.c_int64)
_LOOP_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint8,
              ctypes.c_int, _I64P, _VOIDPP, _VOIDPP, _VOIDPP, _VOIDPP, ctypes.c_int, _VOIDPP,
              ctypes.c_int, _I64P, _VOIDPP, _I64P]
_SCAN_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, _I64P, _VOIDPP,
              _VOIDPP, _VOIDPP, _VOIDPP, ctypes.c_int, _I64P, _VOIDPP, _I64P, ctypes.c_int,
              _VOIDPP, ctypes.c_int, _I64P, _VOIDPP, _I64P]


def _ptrs(arrays: Sequence[np.ndarray]) -> Any:
    return (ctypes.c_void_p * max(len(arrays), 1))(*(address(a) for a in arrays))


def _i64(values: Sequence[int]) -> Any:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def _nbytes(spec: dict[str, Any]) -> int:
    return int(np.prod(spec["shape"], dtype=np.int64)) * dtypes.dtype(spec["dtype"]).itemsize


class _NativeLoop:
    """What both drivers keep per body: the program, its states' byte sizes and the two
    ping-pong buffers of each state (allocated, and their pointers taken, once)."""

    def __init__(self, body: Any, state_bytes: list[int]) -> None:
        self.body = body
        self.symbolic = body.symbolic   # binds its dims from the input shapes on each run
        self.state_bytes = state_bytes
        self._states = _i64(state_bytes)
        self._bufs = [[aligned_empty(max(b, 1)) for b in state_bytes] for _ in range(2)]
        self._buf_ptrs = [_ptrs(side) for side in self._bufs]


class CompiledLoop(_NativeLoop):
    """Runs ``body`` (a ``CompiledModel`` with the loop-body interface, whose carried values
    and scan values have static shapes; a symbolic program binds its dims from the captures
    once per loop) as a loop."""

    def __init__(self, body: Any, n_carried: int, n_caps: int, n_scan: int) -> None:
        specs, outs = body.meta["inputs"], body.meta["outputs"]
        if len(specs) != 2 + n_carried + n_caps or len(outs) != 1 + n_carried + n_scan:
            raise EmberError("the body program does not have the loop-body interface")
        super().__init__(body, [_nbytes(s) for s in outs[1:1 + n_carried]])
        self.n_carried, self.n_caps, self.n_scan = n_carried, n_caps, n_scan
        self._scan = _i64([_nbytes(s) for s in outs[1 + n_carried:]])
        self._loop = native_function(SOURCE, "ember_loop", ctypes.c_int, _LOOP_ARGS)

    def run(self, trip: int | None, cond: bool, init: Sequence[np.ndarray],
            caps: Sequence[np.ndarray], final: Sequence[np.ndarray],
            scan_out: Sequence[np.ndarray]) -> int:
        """Run the loop; returns the number of trips done (rows of ``scan_out`` written)."""
        done = ctypes.c_int64(0)
        shapes = [(), (), *(a.shape for a in init), *(a.shape for a in caps)] \
            if self.symbolic else ()
        with self.body.bound(shapes) as (entry, workspace):
            rc = self._loop(
                entry, workspace, int(trip or 0), trip is not None, int(bool(cond)),
                self.n_carried, self._states, _ptrs(init), *self._buf_ptrs, _ptrs(final),
                self.n_caps, _ptrs(caps), self.n_scan, self._scan, _ptrs(scan_out),
                ctypes.byref(done))
        if rc != 0:
            raise self.body.fault_error(rc, f"in the loop body, trip {done.value}")
        return int(done.value)


class CompiledScan(_NativeLoop):
    """Runs ``body`` (states, slices, captures -> states, scan values; states and slices of
    static shapes) over axis 0 of its scan inputs, writing axis 0 of its scan outputs."""

    def __init__(self, body: Any, n_state: int, n_x: int, n_caps: int, n_scan: int,
                 x_rev: Sequence[int], out_rev: Sequence[int]) -> None:
        specs, outs = body.meta["inputs"], body.meta["outputs"]
        if len(specs) != n_state + n_x + n_caps or len(outs) != n_state + n_scan:
            raise EmberError("the body program does not have the scan-body interface")
        super().__init__(body, [_nbytes(s) for s in outs[:n_state]])
        self.n_state, self.n_x, self.n_caps, self.n_scan = n_state, n_x, n_caps, n_scan
        self._x_rows = _i64([_nbytes(s) for s in specs[n_state:n_state + n_x]])
        self._scan = _i64([_nbytes(s) for s in outs[n_state:]])
        self._x_rev, self._out_rev = _i64(list(x_rev)), _i64(list(out_rev))
        self._loop = native_function(SOURCE, "ember_scan", ctypes.c_int, _SCAN_ARGS)

    def run(self, xs: Sequence[np.ndarray], init: Sequence[np.ndarray],
            caps: Sequence[np.ndarray], final: Sequence[np.ndarray],
            scan_out: Sequence[np.ndarray]) -> None:
        trips = int(xs[0].shape[0]) if xs else 0
        xs = [np.require(x, requirements="C") for x in xs]
        shapes = [*(a.shape for a in init), *(x.shape[1:] for x in xs),
                  *(a.shape for a in caps)] if self.symbolic else ()
        with self.body.bound(shapes) as (entry, workspace):
            rc = self._loop(
                entry, workspace, trips, self.n_state, self._states, _ptrs(init),
                *self._buf_ptrs, _ptrs(final), self.n_x, self._x_rows, _ptrs(xs), self._x_rev,
                self.n_caps, _ptrs(caps), self.n_scan, self._scan, _ptrs(scan_out),
                self._out_rev)
        if rc != 0:
            raise self.body.fault_error(rc, "in the scan body")
