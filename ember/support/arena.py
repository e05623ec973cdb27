"""A first-fit allocator over one growing byte arena, with explicit frees (the static memory
plan at compile time, and a symbolic program's buffer layout at run time)."""

from __future__ import annotations

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
