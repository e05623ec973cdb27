"""A first-fit allocator over one growing byte arena, with explicit frees (the static memory
plan at compile time, and a symbolic program's buffer layout at run time)."""

from __future__ import annotations

import bisect

ALIGN = 64


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Arena:
    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []   # (offset, size), sorted by offset
        self.top = 0

    def alloc(self, size: int) -> int:
        size = align(max(size, 1))
        for i, (off, sz) in enumerate(self.free):
            if sz >= size:
                self.free[i:i + 1] = [(off + size, sz - size)] if sz > size else []
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            off, _ = self.free.pop()
        else:
            off = self.top
        self.top = off + size
        return off

    def release(self, off: int, size: int) -> None:
        size = align(max(size, 1))
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged



class OrderedArena:
    """``Arena`` for kernels that may run concurrently (the GPU's branches, Rammer's and IOS's
    plans): freed bytes remember the kernels that touched them since their last allocation (a
    bitset of kernel positions), and an allocation takes only bytes all of whose kernels
    precede the allocating one (``before``: the bitset of its ancestors). Reuse then adds no
    ordering that the data does not already impose."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int, int]] = []   # (offset, size, kernels), by offset
        self.top = 0

    def alloc(self, size: int, before: int) -> int:
        size = align(max(size, 1))
        free, n = self.free, len(self.free)
        for i in range(n):
            got, j = 0, i     # free[i:j]: a run of adjacent pieces all of whose kernels precede
            while j < n and got < size and not free[j][2] & ~before and (
                    j == i or free[j - 1][0] + free[j - 1][1] == free[j][0]):
                got += free[j][1]
                j += 1
            if got >= size:
                off, last = free[i][0], free[j - 1]
                rest = [(off + size, got - size, last[2])] if got > size else []
                free[i:j] = rest
                return off
            if j == n and got and free[-1][0] + free[-1][1] == self.top:
                off = free[i][0]       # the run ends the arena: grow it from there
                del free[i:]
                self.top = off + size
                return off
        off = self.top
        self.top += size
        return off

    def release(self, off: int, size: int, kernels: int) -> None:
        size = align(max(size, 1))
        bisect.insort(self.free, (off, size, kernels))
        merged: list[tuple[int, int, int]] = []
        for o, s, k in self.free:     # pieces merge only when the same kernels touched them
            if merged and merged[-1][0] + merged[-1][1] == o and merged[-1][2] == k:
                merged[-1] = (merged[-1][0], merged[-1][1] + s, k)
            else:
                merged.append((o, s, k))
        self.free = merged


def replay(events: list[tuple[int, bool]] | list[list[int]], sizes: list[int]
           ) -> tuple[list[int], int]:
    """Lay out buffer slots by replaying their (slot, alloc?) events through an arena with the
    slots' byte ``sizes``: each slot's offset, and the arena size."""
    arena = Arena()
    offsets = [0] * len(sizes)
    for slot, alloc in events:
        if alloc:
            offsets[slot] = arena.alloc(sizes[slot])
        else:
            arena.release(offsets[slot], sizes[slot])
    return offsets, arena.top
