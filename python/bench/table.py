#!/usr/bin/env python3
"""rope's operators against HuggingFace's apply_rotary_pos_emb, in PyTorch eager and
under torch.compile, from one run: [8,32,4096,128] and [1,32,1,128], fp32 and bf16,
in microseconds and in % of a device copy of the same bytes (q and k) measured in
the same run.

    PYTHONPATH=build/gpu/python:python/bench python3 python/bench/table.py OUTDIR [--no-compile]

Runs offline with what a GPU machine with PyTorch and transformers has. Rows:
  rope.ops.rope_ (in place)    rope's operator from eager PyTorch
  torch.ops.rope.apply_        the same operator called through PyTorch's dispatcher (as torch.compile calls it)
  rope.ops.rope (functional)   new output tensors, as HF's function returns
  HF eager                     modeling_llama.apply_rotary_pos_emb(q, k, cos, sin), cos/sin precomputed
                               (a model computes them once per forward, for all layers)
  HF torch.compile             the same function compiled (Inductor fuses it into one kernel)
Each timed as op_cost.py times the GPU (queued behind a GPU sleep, and replayed from a CUDA
graph). HF's call also reads cos and sin: the copy ceiling counts q and k only, as for rope.
Writes OUTDIR/python_table.csv.
"""

import argparse
import csv
import os
import sys

import torch
from transformers.models.llama import modeling_llama

import rope
from op_cost import Sets, gpu_us
from rope import ops

SHAPES = [(8, 32, 4096, 128), (1, 32, 1, 128)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def methods(sets, shape, dtype, compile_hf):
    config = rope.Config(head_dim=shape[3], base=500000.0)
    key, q, k = config.key, sets.q, sets.k
    batch, _, seq, dim = shape
    angles = torch.arange(seq, device="cuda", dtype=torch.float32)[:, None] * \
        (500000.0 ** (-torch.arange(0, dim, 2, device="cuda") / dim))[None]
    emb = torch.cat([angles, angles], dim=-1)[None].expand(batch, seq, dim)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)  # [batch, seq, dim], as HF's rotary embedding returns
    hf = modeling_llama.apply_rotary_pos_emb
    table = {
        "copy (ceiling)": sets.copy,
        "rope.ops.rope_ (in place)": lambda i: ops.rope_(q[i], k[i], config),
        "torch.ops.rope.apply_": lambda i: torch.ops.rope.apply_(q[i], k[i], key, 0, None, None, None, 1, 0, None,
                                                                 "bhsd", False, "", 0),
        "rope.ops.rope (functional)": lambda i: ops.rope(q[i], k[i], config),
        "HF eager": lambda i: hf(q[i], k[i], cos, sin),
    }
    if compile_hf:
        compiled = torch.compile(hf, fullgraph=True, dynamic=False)
        table["HF torch.compile"] = lambda i: compiled(q[i], k[i], cos, sin)
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile (saves its compile time)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77
    rows = []
    for shape in SHAPES:
        for dtype_name, dtype in DTYPES.items():
            sets = Sets(torch.Size(shape), torch.Size(shape), dtype, "cuda")
            calls = sets.count if shape[2] > 1 else None  # One pass: the graph pool holds every call's outputs.
            table = methods(sets, shape, dtype, not args.no_compile)
            results = {}
            for timing in ("queued", "graph"):
                for name, call in table.items():
                    try:
                        results[(timing, name)] = gpu_us(call, sets.count, graph=timing == "graph", calls=calls)
                    except Exception as error:  # Reported in its row; the table goes on.
                        results[(timing, name)] = f"failed: {type(error).__name__}: {error}"[:200]
            # The ceiling: the faster of the copy's two timings, as rope-bench's.
            ceiling = min(us for (_, name), us in results.items() if name == "copy (ceiling)" and
                          isinstance(us, float))
            for (timing, name), us in results.items():
                row = dict(shape=",".join(map(str, shape)), dtype=dtype_name, timing=timing, what=name, status=us)
                if isinstance(us, float):
                    row.update(median_us=f"{us:.2f}", pct_of_copy=f"{100 * ceiling / us:.1f}", status="ok")
                rows.append(row)
                print(f"{row['shape']:<16} {dtype_name:<5} {timing:<7} {name:<28} {row.get('median_us', ''):>10} us "
                      f"{row.get('pct_of_copy', ''):>6}% of copy {'' if row['status'] == 'ok' else row['status']}",
                      flush=True)
            del sets
            torch.cuda.empty_cache()
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, "python_table.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["shape", "dtype", "timing", "what", "median_us", "pct_of_copy", "status"],
                                restval="")
        writer.writeheader()
        writer.writerows(rows)
    print(f"device: {torch.cuda.get_device_name()}; written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
