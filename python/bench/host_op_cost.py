#!/usr/bin/env python3
"""What a call from Python costs on the host, without a GPU: the decode shape
[1,32,1,128] fp32 (q and k, 32 heads each, positions 0, in place) on CPU tensors,
through each Python path, for each host backend.

    PYTHONPATH=build/default/python python3 python/bench/host_op_cost.py [--rounds 15] [--calls 2000]

Rows: torch.ops.rope.apply_ (the registered operator: PyTorch's dispatcher, then
rope's C++ kernel where rope/_torch_ops.so is loaded, else the Python custom_op;
the first line says which), rope.ops.rope_ (eager: that C++ kernel without the
dispatcher, rope._torch_ops.rope_), rope.ops.rope_ (DLPack) (the same call
through rope._rope, as rope_ makes it where the library is not loaded),
rope.apply (the generic DLPack entry point). The same q and
k every call, so the data stays in cache: the numbers are per-call overhead plus a
cache-hot kernel. The paths are timed in interleaved rounds (timeit, --calls calls
each) and the median over rounds is printed, so that a machine shared with other
work slows every path alike. python/bench/op_cost.py is the GPU version.
"""

import argparse
import statistics
import timeit

import torch

import rope
from rope import ops

SHAPE = (1, 32, 1, 128)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    q, k = torch.randn(*SHAPE), torch.randn(*SHAPE)
    config = rope.Config(head_dim=SHAPE[3])
    key = config.key
    print(f"torch {torch.__version__}; torch.ops.rope.apply_ from {getattr(ops, 'CPP_OPERATOR', None) or 'Python (custom_op)'}; "
          f"{list(SHAPE)} fp32, median of {args.rounds} rounds x {args.calls} calls")
    for backend in [b.name for b in rope.list_backends() if b.available and b.device == "host"]:
        calls = {
            "torch.ops.rope.apply_": lambda: torch.ops.rope.apply_(q, k, key, 0, None, None, None, 1, 0, None, "bhsd",
                                                                   False, backend, 0),
            "rope.ops.rope_": lambda: ops.rope_(q, k, config, positions=0, backend=backend),
            "rope.ops.rope_ (DLPack)": lambda: ops._launch(q, k, None, None, config._native, 0, None, None, None, 1,
                                                           0, None, "bhsd", False, backend, 0),
            "rope.apply": lambda: rope.apply(q, k, config, positions=0, backend=backend),
        }
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(1e6 * timeit.timeit(call, number=args.calls) / args.calls)
        for name, us in times.items():
            print(f"  {backend:10} {name:24} {statistics.median(us):7.2f} us  (fastest round {min(us):.2f})")


if __name__ == "__main__":
    main()
