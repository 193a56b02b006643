"""A model of TensorFlow's BFC allocator: what a sequence of allocations
counts when each is placed in a whole allocator chunk.

TensorFlow's best-fit-with-coalescing allocator (`bfc_allocator.cc`, the
allocator of GPUs and, under oneDNN, of CPU allocations of 256 KiB and
more) rounds a request up to 256 bytes, takes the smallest free chunk that
fits (the lowest address among equal sizes), and splits it only when the
chunk is at least twice the request or would waste 128 MiB or more;
otherwise the whole chunk is handed out and counted as in use. A freed
chunk merges with free neighbours of its region. With `allow_growth`
(oneDNN's CPU allocator, a GPU with memory growth) memory comes in regions:
the first of 2 MiB, each next one twice the last, or the request's size
rounded up to a power-of-two multiple of it when larger (then not doubled
again for the next).
"""

from __future__ import annotations

import bisect

_ROUND = 256
_MAX_WASTE = 128 << 20  # a split is also made when it saves this much
_FIRST_REGION = 2 << 20


def rounded(nbytes: int) -> int:
    """`nbytes` rounded up to the allocator's 256-byte unit."""
    return max(_ROUND, -(-nbytes // _ROUND) * _ROUND)


class BFCModel:
    """Replays allocations and frees; `peak` is the most bytes in use,
    counting each allocation's whole chunk, as the allocator's statistics
    (`bytes_in_use`, `peak_bytes_in_use`) count them."""

    def __init__(self, first_region: int = _FIRST_REGION):
        self._region = first_region
        self._end = 0  # address where the next region starts
        self._free = []  # sorted (size, address) of free chunks
        self._chunks = {}  # address -> [size, free?, region start]
        self._regions = {}  # region start -> region end
        self._held = {}  # key -> address
        self._exact = {}  # key -> bytes held outside the chunks
        self.in_use = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.in_use

    def allocate(self, key, nbytes: int) -> int:
        """Places `nbytes` for `key`; returns the chunk's size."""
        want = rounded(nbytes)
        i = bisect.bisect_left(self._free, (want, -1))
        if i == len(self._free):
            self._extend(want)
            i = bisect.bisect_left(self._free, (want, -1))
        size, addr = self._free.pop(i)
        chunk = self._chunks[addr]
        if size >= 2 * want or size - want >= _MAX_WASTE:
            rest = addr + want
            self._chunks[rest] = [size - want, True, chunk[2]]
            bisect.insort(self._free, (size - want, rest))
            chunk[0] = size = want
        chunk[1] = False
        self._held[key] = addr
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        return size

    def hold_exact(self, key, nbytes: int) -> None:
        """Counts `nbytes` for `key` outside the chunks (many small
        allocations, each about its own size)."""
        self._exact[key] = nbytes = rounded(nbytes)
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)

    def free(self, key) -> None:
        """Frees `key`'s chunk and merges it with free neighbours."""
        if key in self._exact:
            self.in_use -= self._exact.pop(key)
            return
        addr = self._held.pop(key)
        chunk = self._chunks[addr]
        self.in_use -= chunk[0]
        chunk[1] = True
        start = addr
        nxt = addr + chunk[0]
        if nxt < self._regions[chunk[2]] and self._chunks[nxt][1]:
            self._free.remove((self._chunks[nxt][0], nxt))
            chunk[0] += self._chunks.pop(nxt)[0]
        prev = self._previous(addr, chunk[2])
        if prev is not None and self._chunks[prev][1]:
            self._free.remove((self._chunks[prev][0], prev))
            self._chunks[prev][0] += self._chunks.pop(addr)[0]
            start = prev
        bisect.insort(self._free, (self._chunks[start][0], start))

    def _previous(self, addr, region):
        if addr == region:
            return None
        # Chunks tile their region: walk from the region's start.
        a = region
        while a + self._chunks[a][0] != addr:
            a += self._chunks[a][0]
        return a

    def _extend(self, want: int) -> None:
        grew = False
        while want > self._region:
            self._region *= 2
            grew = True
        start = self._end
        self._end += self._region
        self._regions[start] = self._end
        self._chunks[start] = [self._region, True, start]
        bisect.insort(self._free, (self._region, start))
        if not grew:
            self._region *= 2


def chunk_overhead(persistent, step_events, micro_batches, update) -> int:
    """Bytes the whole chunks add to the peak of a training step.

    The modelled process: `persistent` (bytes of each weight, optimizer
    slot and accumulator, in the order they are created) are allocated, then
    two steps run (a first one, then the one measured): each runs
    `micro_batches` times the step's `step_events` (`(key, bytes)` an
    allocation, `(key, None)` a free; what is left held at the end, the
    gradients, is freed after the micro-batch, the last one's after the
    update) and then the optimizer's update, which allocates and frees
    `update` (a list per weight of the sizes of its temporaries, alive
    together). Returns the peak of the second step counted in whole chunks
    minus its peak counted in requested bytes (never below 0).
    """
    bfc = BFCModel()
    exact = {"in_use": 0, "peak": 0}

    def alloc(key, n):
        if isinstance(key[-1], tuple) and key[-1][0] == "list":
            bfc.hold_exact(key, n)  # a TensorList: many small elements
        else:
            bfc.allocate(key, n)
        exact["in_use"] += rounded(n)
        exact["peak"] = max(exact["peak"], exact["in_use"])
        held[key] = rounded(n)

    def free(key):
        bfc.free(key)
        exact["in_use"] -= held.pop(key)

    held = {}
    for i, n in enumerate(persistent):
        if n:
            alloc(("persistent", i), n)
    for step in range(2):
        bfc.reset_peak()
        exact["peak"] = exact["in_use"]
        for micro in range(micro_batches):
            mine = set()
            for key, n in step_events:
                key = (step, micro, key)
                if n is None:
                    if key in held:
                        free(key)
                        mine.discard(key)
                elif n:
                    alloc(key, n)
                    mine.add(key)
            if micro == micro_batches - 1:
                for w, sizes in enumerate(update):
                    temps = [(step, "update", w, j) for j in range(len(sizes))]
                    for key, n in zip(temps, sizes):
                        if n:
                            alloc(key, n)
                    for key in temps:
                        if key in held:
                            free(key)
            for key in sorted(mine, key=str):
                free(key)
    return max(0, bfc.peak - exact["peak"])
