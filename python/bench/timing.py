"""GPU timing for the Python benchmarks, done the way rope-bench does it (bench/main.cpp).

- One "set" is a q and a k, contiguous in one buffer; calls rotate through
  enough sets to span twice the GPU's L2 cache, so every call reads memory.
- events: CUDA events around back-to-back calls on the current stream; the
  per-call time includes whatever the host needs to issue a call, when the host
  is slower than the GPU (decode shapes).
- graph: the same calls captured once into a CUDA graph and replayed; the
  per-call time of the GPU work alone, what an application using graphs sees.
- The ceiling: a device-to-device copy of the same bytes (one set's q and k),
  timed both ways in the same run; results are given as a % of the faster of
  the two (ceiling_us), as rope-bench does. A copy captured into a CUDA graph
  is a memcpy node, which runs far below the memory's speed on large buffers
  (775 us against 505 us back to back for 2 GiB on the H200): divided by it
  alone, graph rows would read 150% of a copy.
Medians over repetitions, after a warm-up on every set.
"""

import statistics

import torch


class Sets:
    """``count`` sets of (q, k) on the GPU, each set one contiguous buffer, random values in [-1, 1):
    enough to span twice the L2, or ``count`` if given (1: the same tensors every call, hot in the L2)."""

    def __init__(self, q_shape, k_shape, dtype, l2_bytes=None, count=None):
        q_elements, k_elements = _numel(q_shape), _numel(k_shape)
        set_bytes = (q_elements + k_elements) * torch.empty((), dtype=dtype).element_size()
        l2_bytes = l2_bytes or getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        self.count = count or max(2, -(-2 * l2_bytes // set_bytes))
        self.bytes_per_call = 2 * set_bytes  # q and k read once and written once
        g = torch.Generator(device="cuda").manual_seed(0)
        self.buffers = [torch.rand(q_elements + k_elements, generator=g, device="cuda").mul_(2).sub_(1).to(dtype)
                        for _ in range(self.count)]
        self.q = [b[:q_elements].view(q_shape) for b in self.buffers]
        self.k = [b[q_elements:].view(k_shape) for b in self.buffers]
        self.copies = [torch.empty_like(b) for b in self.buffers]

    def copy(self, i):
        """The ceiling's call: one device-to-device copy of set i's bytes."""
        self.copies[i].copy_(self.buffers[i])


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def events_us(call, count, reps=30, calls=None):
    """Median microseconds per call of back-to-back ``call(i)`` (i cycling over ``count`` sets), CUDA events."""
    calls = calls or max(count, 64)
    for i in range(count):  # warm-up on every set
        call(i)
    torch.cuda.synchronize()
    times = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        for c in range(calls):
            call(c % count)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / calls)
    return statistics.median(times)


def graph_us(call, count, reps=30, calls=None):
    """Median microseconds per call when ``calls`` calls are replayed from one CUDA graph."""
    calls = calls or max(count, 64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as PyTorch asks
        for i in range(count):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in range(calls):
            call(c % count)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / calls)
    return statistics.median(times)


TIMINGS = {"events": events_us, "graph": graph_us}


def ceiling_us(sets, reps=30, calls=None):
    """The copy of one set's bytes timed each way, and the ceiling: the fastest of them.

    Returns (ceiling in microseconds, {timing: copy microseconds}).
    """
    copies = {timing: measure(sets.copy, sets.count, reps, calls) for timing, measure in TIMINGS.items()}
    return min(copies.values()), copies
