#!/usr/bin/env python3
"""What a call from Python costs: the PyTorch operator at decode shape [1,32,1,128],
next to rope-bench's C++ call, timed the same way in the same run.

    PYTHONPATH=build/gpu/python python3 python/bench/op_cost.py OUTDIR [--rope-bench build/gpu/bench/rope-bench]

Rows (fp32, neox, in place, k with 32 heads as rope-bench's default, positions 0):
  rope-bench            the C++ Backend::run of a prebuilt plan (bench/main.cpp)
  rope.ops.rope_        the Python function in eager code: the operator's C++ kernel called
                        without the dispatcher (rope._torch_ops.rope_, python/torch_ops/eager.cpp)
  rope.ops.rope_ (DLPack) the same call the way rope_ makes it where rope/_torch_ops.so is not
                        loaded: through rope._rope and DLPack capsules (rope.ops._launch)
  torch.ops.rope.apply_ the registered operator: PyTorch's C++ dispatcher, then rope's C++
                        kernel (python/torch_ops/); its status says so, or that the
                        library was not loaded and the Python custom_op was timed instead
  torch.ops.aten.copy_  PyTorch's own in-place operator called the same way (q.copy_(k) through
                        torch.ops.aten.copy_.default: the same Python binding, dispatcher and
                        dispatch keys, one small kernel launch): the floor PyTorch sets for any
                        operator called like torch.ops.rope.apply_ (q's values are overwritten,
                        which the timing of the other rows does not depend on)
  torch.cuda._sleep(0)  the least a kernel launch from Python costs in PyTorch: one Python
                        binding that launches a kernel of no work on the current stream, no
                        dispatcher, no tensors (a private PyTorch function, in its tests for
                        years): the floor under any Python call that launches a kernel
  rope.apply            the generic DLPack entry point (NumPy/CuPy/PyTorch alike)
  rope.ops.rope         the functional, differentiable operator (allocates its outputs)
each with events timing (back-to-back calls: includes the host's cost per call
when it exceeds the GPU's) and graph timing (CUDA-graph replay: the GPU's work
alone), plus the copy ceiling (% of copy: against the faster of its two medians;
rope-bench's rows against rope-bench's own ceiling).

Those rows rotate through enough sets of q and k to span twice the L2 (3840 at
decode), so that every call reads memory. At decode the events timing is bound by
the host, and rotating also makes each Python call touch a Python tensor object and
a TensorImpl the host has not touched for 3839 calls, which rope-bench's loop over
raw pointers does not. So the events rows are repeated on one set (sets 1: the
same tensors every call, q and k hot in the L2; rope-bench with --llc-mb 0.001),
which tells that cost apart from the rest. (On the H200 at 7863098 it was not what
separates the two: on one set rope-bench got faster and the Python call did not;
bench/results/h200.md.)

Every row is timed once per round, rounds interleaved (--rounds, default 3; the
one-set rows --one-set-rounds, default 7): the median over rounds and the fastest
and slowest round. Last, the gap the goal is about, rope.ops.rope_ - rope-bench
(C++), on the rotating sets and on one set: each round's difference (the two timed
one after the other), then the median, fastest and slowest of those. Writes
OUTDIR/op_cost.csv and prints it.
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys

import torch

import rope
from rope import ops
from timing import TIMINGS, Sets

SHAPE = (1, 32, 1, 128)


def python_calls(sets):
    """The Python rows' calls on the sets (call(i) uses set i)."""
    config = rope.Config(head_dim=SHAPE[3])
    key = config.key
    return {
        "rope.ops.rope_": lambda i: ops.rope_(sets.q[i], sets.k[i], config, positions=0),
        "rope.ops.rope_ (DLPack)": lambda i: ops._launch(sets.q[i], sets.k[i], None, None, config._native, 0, None,
                                                         None, None, 1, 0, None, "bhsd", False, "", 0),
        "torch.ops.rope.apply_": lambda i: torch.ops.rope.apply_(sets.q[i], sets.k[i], key, 0, None, None, None,
                                                                 1, 0, None, "bhsd", False, "cuda-optimized", 0),
        "torch.ops.aten.copy_": lambda i: torch.ops.aten.copy_.default(sets.q[i], sets.k[i]),
        LAUNCH_FLOOR: lambda i: torch.cuda._sleep(0),
        "rope.apply": lambda i: rope.apply(sets.q[i], sets.k[i], config, positions=0),
        "rope.ops.rope": lambda i: ops.rope(sets.q[i], sets.k[i], config, positions=0),
        COPY: sets.copy,
    }


COPY = "copy (ceiling)"
ROPE_BENCH = "rope-bench (C++)"
LAUNCH_FLOOR = "torch.cuda._sleep(0)"
ONE_SET_ROWS = ("rope.ops.rope_", "torch.ops.rope.apply_", "torch.ops.aten.copy_", LAUNCH_FLOOR)
GAP = "rope.ops.rope_ - rope-bench (C++)"


def time_rows(jobs, samples, failures):
    """Times each (name, timing, call, count) job once, appending microseconds to samples[(name, timing, count)]."""
    for name, timing, call, count in jobs:
        key = (name, timing, count)
        try:
            us = TIMINGS[timing](call, count)
        except Exception as error:  # one row's failure (e.g. a capture PyTorch refuses) is reported, not fatal
            failures[key] = f"failed: {type(error).__name__}: {error}"[:200]
            continue
        samples.setdefault(key, []).append(us)


def rope_bench_run(rope_bench, timing, count, samples, percents, failures):
    """One rope-bench run of the C++ call on ``count`` sets (1: --llc-mb 0.001, sets that span twice one KiB):
    its median under samples[(ROPE_BENCH, timing, count)], its % of its own ceiling under percents."""
    flags = (["--graph"] if timing == "graph" else []) + (["--llc-mb", "0.001"] if count == 1 else [])
    command = [rope_bench, "--backend", "cuda-optimized", "--shape", ",".join(map(str, SHAPE)), "--kv-heads",
               str(SHAPE[1]), "--dtype", "fp32", "--reps", "30", "--format", "csv", *flags]
    result = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    records = list(csv.DictReader(lines)) if result.returncode == 0 else []
    key = (ROPE_BENCH, timing, count)
    if not records or records[0]["status"] != "ok" or int(records[0]["sets"]) != count:
        failures[key] = (f"failed: {result.stderr[-200:]}" if not records else
                         f"failed: status {records[0]['status']}, sets {records[0]['sets']} (expected {count})")
        return
    samples.setdefault(key, []).append(float(records[0]["median_us"]))
    percents.setdefault(key, []).append(float(records[0]["pct_of_copy"]))


def gap_row(samples, count):
    """rope.ops.rope_ minus rope-bench's C++ call, events, on ``count`` sets: the difference of each round
    (both timed in it, one after the other), then their median, fastest and slowest; None unless every round
    timed both."""
    ours, theirs = samples.get(("rope.ops.rope_", "events", count)), samples.get((ROPE_BENCH, "events", count))
    if not ours or not theirs or len(ours) != len(theirs):
        return None
    gaps = [a - b for a, b in zip(ours, theirs)]
    return dict(what=GAP, timing="events", median_us=f"{statistics.median(gaps):.2f}", sets=count,
                rounds=len(gaps), us_min=f"{min(gaps):.2f}", us_max=f"{max(gaps):.2f}",
                status="ok (the median of the rounds' differences)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--rope-bench", help="path of rope-bench, for the C++ rows")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each timing every row once (rope-bench first): medians over rounds")
    parser.add_argument("--one-set-rounds", type=int, default=7, help="rounds of the one-set rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77
    sets = Sets(SHAPE, SHAPE, torch.float32)
    one_set = Sets(SHAPE, SHAPE, torch.float32, count=1)
    calls = python_calls(sets)
    one_set_calls = python_calls(one_set)
    samples, percents, failures = {}, {}, {}
    # Interleaved: the host's speed drifts by a microsecond or more within minutes, and a
    # row timed minutes after another would carry that drift into their difference.
    rotating = [(name, timing, call, sets.count) for timing in TIMINGS for name, call in calls.items()]
    for _ in range(args.rounds):
        for timing in TIMINGS if args.rope_bench else ():
            rope_bench_run(args.rope_bench, timing, sets.count, samples, percents, failures)
        time_rows(rotating, samples, failures)
    # One set: rope-bench's call, then the Python rows right after it, in rounds of their own (a
    # round of these takes a few seconds, so there can be more of them).
    hot = [(name, "events", one_set_calls[name], 1) for name in ONE_SET_ROWS]
    for _ in range(args.one_set_rounds):
        if args.rope_bench:
            rope_bench_run(args.rope_bench, "events", 1, samples, percents, failures)
        time_rows(hot, samples, failures)

    median = {key: statistics.median(times) for key, times in samples.items()}
    copies = [median[(COPY, timing, sets.count)] for timing in TIMINGS if (COPY, timing, sets.count) in median]
    ceiling = min(copies) if copies else None
    # The operator timed must be the C++ one (rope/_torch_ops.so); a row says so when it is not.
    operator = "ok" if ops.CPP_OPERATOR else "ok (Python custom_op: rope/_torch_ops.so not loaded)"
    bench = [ROPE_BENCH] if args.rope_bench else []
    keys = [(name, timing, sets.count) for timing in TIMINGS for name in bench + list(calls)]
    keys += [(name, "events", 1) for name in bench + list(ONE_SET_ROWS)]
    rows = []
    for key in keys:
        name, timing, count = key
        if key not in median:
            rows.append(dict(what=name, timing=timing, sets=count, status=failures.get(key, "failed")))
            continue
        # One set: q and k hot in the L2, no copy ceiling applies (the rows measure the host's cost per call);
        # the launch floor moves no bytes.
        pct = (None if count == 1 or name == LAUNCH_FLOOR else statistics.median(percents[key]) if name == ROPE_BENCH
               else 100 * ceiling / median[key] if ceiling else None)
        status = operator if name == "torch.ops.rope.apply_" else "ok"
        if key in failures:
            status = f"{len(samples[key])} rounds; {failures[key]}"
        rows.append(dict(what=name, timing=timing, median_us=f"{median[key]:.2f}",
                         pct_of_copy="" if pct is None else f"{pct:.1f}", sets=count, rounds=len(samples[key]),
                         us_min=f"{min(samples[key]):.2f}", us_max=f"{max(samples[key]):.2f}", status=status))
    rows += [row for row in (gap_row(samples, sets.count), gap_row(samples, 1)) if row]
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, "op_cost.csv")
    columns = ["what", "timing", "median_us", "pct_of_copy", "sets", "rounds", "us_min", "us_max", "status"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({c: row.get(c, "") for c in columns} for row in rows)
    print(f"decode [1,32,1,128] fp32, {torch.cuda.get_device_name()}; torch.ops.rope.apply_ from "
          f"{ops.CPP_OPERATOR or 'Python (custom_op)'}; medians of interleaved rounds:")
    for row in rows:
        print(f"  {row['what']:<24} {row['timing']:<7} {row['sets']:>5} sets {row.get('median_us', ''):>8} us  "
              f"({row.get('us_min', '')}-{row.get('us_max', '')})  {row.get('pct_of_copy', ''):>6}% of copy  "
              f"{row.get('status', '')}")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
