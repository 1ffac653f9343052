#!/usr/bin/env python3
"""What a call from Python costs: each Python entry at decode shape [1,32,1,128] fp32
(q and k of 32 heads, in place, positions 0), beside the least any call from Python
costs, timed in the same run; on a GPU also next to rope-bench's C++ call.

    PYTHONPATH=build/gpu/python:python/bench python3 python/bench/op_cost.py OUTDIR [--rope-bench PATH]

Runs on the CPU (host tensors, the host backends) where there is no CUDA device;
there --cpu-time times the host rows in the calling thread's CPU time, which
other processes on a shared machine do not inflate as they do the wall clock.

The method is rope-bench's (bench/timing/), done with PyTorch's own tools
(torch.utils.benchmark and torch.cuda.Event), not a timer of its own:
- the calls rotate through enough sets of q and k to span twice the GPU's L2
  (or the host's LLC), so every call reads memory (the Sets below);
- host: torch.utils.benchmark.Timer's median per call of back-to-back calls, as a
  program issues them (on CUDA it synchronises at both ends): the host's cost
  per call where it exceeds the GPU's, as it does at decode;
- queued (CUDA): a batch of calls queued while the GPU sleeps (torch.cuda._sleep),
  timed with CUDA events: the GPU's work alone; graph (CUDA): the batch captured
  once into a CUDA graph and replayed, timed the same way;
- every GPU timing is divided by a copy of the same bytes timed in the same run
  both ways, the faster of the two (% of copy);
- every row is timed once per round, rounds interleaved (the host's speed
  drifts within minutes), and the median over rounds is reported with the
  fastest and slowest round.

Rows: the Python entries (rope.ops.rope_, torch.ops.rope.apply_, rope.apply,
rope.ops.rope); torch.ops.aten.copy_ (q.copy_(k) called as torch.ops.rope.apply_
is: PyTorch's own in-place operator through the same dispatcher);
torch.ops.aten.zero_ of one element (the dispatcher's round trip, next to no work); on CUDA
torch.cuda._sleep(0), a kernel of no work launched from one Python binding, the
floor under any Python call that launches a kernel. The status column gives each
host row as a multiple of that floor (on the CPU, of torch.ops.aten.copy_).
With --rope-bench, rope-bench's C++ call of the same shape (its own timing and
ceiling). Writes OUTDIR/op_cost.csv and prints it.
"""

import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.utils.benchmark as benchmark

import rope
from rope import ops

SHAPE = (1, 32, 1, 128)
REPS = 30
COPY, FLOOR, ROPE_BENCH = "copy (ceiling)", "torch.cuda._sleep(0)", "rope-bench (C++)"
TINY = "aten.zero_ (1 element)"


class Sets:
    """``count`` sets of (q, k), each one contiguous buffer, random values in [-1, 1); by default enough
    to span twice the GPU's L2 (64 MiB on the host), as rope-bench's sets do."""

    def __init__(self, q_shape, k_shape, dtype, device, count=None):
        q_elements, k_elements = q_shape.numel(), k_shape.numel()
        set_bytes = (q_elements + k_elements) * dtype.itemsize
        cache = torch.cuda.get_device_properties(device).L2_cache_size if device == "cuda" else 64 << 20
        self.count = count or max(2, -(-2 * cache // set_bytes))
        g = torch.Generator(device=device).manual_seed(0)
        self.buffers = [(torch.rand(q_elements + k_elements, generator=g, device=device) * 2 - 1).to(dtype)
                        for _ in range(self.count)]
        self.q = [b[:q_elements].view(q_shape) for b in self.buffers]
        self.k = [b[q_elements:].view(k_shape) for b in self.buffers]
        self.copies = [torch.empty_like(b) for b in self.buffers]
        self.one = [b[:1] for b in self.copies]  # One element each, for the dispatcher's round trip.

    def copy(self, i):
        """The ceiling's call: one copy of set i's bytes."""
        self.copies[i].copy_(self.buffers[i])


def host_us(call, count, clock=None):
    """Median microseconds per call of back-to-back call(i), i cycling over the sets (torch.utils.benchmark),
    by the wall clock or by ``clock``."""
    timer = benchmark.Timer("call(next(sets))", globals={"call": call, "sets": itertools.cycle(range(count))},
                            **({"timer": clock} if clock else {}))
    return timer.blocked_autorange(min_run_time=0.2).median * 1e6


def gpu_us(call, count, graph, calls=None):
    """Median microseconds per call of a batch of calls on the GPU, CUDA events around it: queued behind a
    GPU sleep (graph False; at most 512 calls, which the launch queue holds while the GPU sleeps, each batch
    going on over the sets where the last one stopped) or replayed from a CUDA graph (whole passes over the
    sets); either way a set's next visit comes after every other set's."""
    calls = calls or (-(-64 // count) * count if graph else min(512, -(-64 // count) * count))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # Warm-up on every set, off the capture, as PyTorch asks.
        for i in range(count):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    visits = itertools.count()
    batch = lambda: [call(next(visits) % count) for _ in range(calls)]  # noqa: E731
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            batch()
        batch = captured.replay
    batch()
    # The sleep outlasts the host's queueing of a batch: twice its time at a clock of up to 2 GHz.
    sleep_cycles = int(2 * 2e9 * benchmark.Timer("batch()", globals={"batch": batch}).timeit(1).median)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPS):
        if not graph:
            torch.cuda._sleep(sleep_cycles)
        start.record()
        batch()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / calls)
    return statistics.median(times)


def python_calls(sets, device):
    """Each row's call on the sets (call(i) uses set i)."""
    config = rope.Config(head_dim=SHAPE[3])
    key, q, k = config.key, sets.q, sets.k
    calls = {
        "rope.ops.rope_": lambda i: ops.rope_(q[i], k[i], config, positions=0),
        "torch.ops.rope.apply_": lambda i: torch.ops.rope.apply_(q[i], k[i], key, 0, None, None, None, 1, 0, None,
                                                                 "bhsd", False, "", 0),
        "rope.apply": lambda i: rope.apply(q[i], k[i], config, positions=0),
        "rope.ops.rope": lambda i: ops.rope(q[i], k[i], config, positions=0),
        "torch.ops.aten.copy_": lambda i: torch.ops.aten.copy_.default(q[i], k[i]),
        TINY: lambda i: torch.ops.aten.zero_.default(sets.one[i]),
        COPY: sets.copy,
    }
    if device == "cuda":
        calls[FLOOR] = lambda i: torch.cuda._sleep(0)
    return calls


def rope_bench_rows(rope_bench):
    """rope-bench's C++ call of SHAPE, events and graph: {(name, timing): (median us, % of its copy)}."""
    rows = {}
    for flags, timing in (([], "events"), (["--graph"], "graph")):
        command = [rope_bench, "--backend", "cuda-optimized", "--shape", ",".join(map(str, SHAPE)), "--kv-heads",
                   str(SHAPE[1]), "--dtype", "fp32", "--reps", str(REPS), "--format", "csv", *flags]
        result = subprocess.run(command, capture_output=True, text=True)
        records = list(csv.DictReader(line for line in result.stdout.splitlines() if line.strip()))
        if result.returncode == 0 and records and records[0]["status"] == "ok":
            rows[(ROPE_BENCH, timing)] = (float(records[0]["median_us"]), float(records[0]["pct_of_copy"]))
        else:
            print(f"rope-bench {timing} failed: {result.stderr[-300:]}", file=sys.stderr)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--rope-bench", help="path of rope-bench, for the C++ rows (CUDA)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each timing every row once")
    parser.add_argument("--cpu-time", action="store_true",
                        help="host rows in the calling thread's CPU time (time.thread_time), not the wall clock's: "
                             "for a CPU run on a machine other processes share (with OMP_NUM_THREADS=1)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sets = Sets(torch.Size(SHAPE), torch.Size(SHAPE), torch.float32, device)
    calls = python_calls(sets, device)
    timings = {"host": lambda call: host_us(call, sets.count, time.thread_time if args.cpu_time else None)}
    if device == "cuda":
        timings.update(queued=lambda call: gpu_us(call, sets.count, graph=False),
                       graph=lambda call: gpu_us(call, sets.count, graph=True))
    samples, failures = {}, {}
    for _ in range(args.rounds):
        for timing, measure in timings.items():
            for name, call in calls.items():
                if timing != "host" and name in (FLOOR, TINY):
                    continue  # No bytes moved: no GPU row.
                try:
                    samples.setdefault((name, timing), []).append(measure(call))
                except Exception as error:  # One row's failure (a capture PyTorch refuses) is reported, not fatal.
                    failures[(name, timing)] = f"failed: {type(error).__name__}: {error}"[:200]

    floor = statistics.median(samples.get((FLOOR if device == "cuda" else "torch.ops.aten.copy_", "host"), [0]))
    ceiling = min((statistics.median(samples[(COPY, t)]) for t in ("queued", "graph") if (COPY, t) in samples),
                  default=None)
    rows = []
    for (name, timing), us in samples.items():
        median = statistics.median(us)
        pct = f"{100 * ceiling / median:.1f}" if ceiling and timing != "host" else ""
        status = f"{median / floor:.2f} x the floor" if timing == "host" and floor else "ok"
        if timing == "host" and args.cpu_time:
            status += " (thread CPU time)"
        rows.append(dict(what=name, timing=timing, median_us=f"{median:.2f}", pct_of_copy=pct, sets=sets.count,
                         rounds=len(us), us_min=f"{min(us):.2f}", us_max=f"{max(us):.2f}",
                         status=failures.get((name, timing), status)))
    rows += [dict(what=name, timing=timing, status=why) for (name, timing), why in failures.items()
             if (name, timing) not in samples]
    if args.rope_bench and device == "cuda":
        for (name, timing), (us, pct) in rope_bench_rows(args.rope_bench).items():
            rows.append(dict(what=name, timing=timing, median_us=f"{us:.2f}", pct_of_copy=f"{pct:.1f}",
                             sets=sets.count, rounds=1, status="ok (rope-bench's own timing and ceiling)"))
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, "op_cost.csv")
    columns = ["what", "timing", "median_us", "pct_of_copy", "sets", "rounds", "us_min", "us_max", "status"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"decode {list(SHAPE)} fp32 on {where}; operators from {ops.CPP_OPERATOR or 'Python (custom_op)'}; "
          f"medians of {args.rounds} interleaved rounds{', host rows in thread CPU time' if args.cpu_time else ''}:")
    for row in rows:
        print(f"  {row['what']:<22} {row['timing']:<7} {row.get('median_us', ''):>8} us "
              f"({row.get('us_min', '')}-{row.get('us_max', '')})  {row.get('pct_of_copy', '') or '-':>6} % of copy  "
              f"{row['status']}")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
