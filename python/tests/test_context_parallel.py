"""Context parallelism on a real process group: 2 and 4 processes (torch.distributed, gloo,
CPU, localhost) each rotate their load-balanced shard (chunks r and 2n-1-r of every
sequence) with cp=(n, r); the shards, gathered, must equal the single-process rotation
of the whole tensors bit for bit: padded (bhsd, bshd; float32 and bfloat16, partial
rotary with yarn) and packed sequences (uneven lengths, an empty one, their own starts).
A rank that ignored cp would rotate at local positions and fail the comparison.
And the script of docs/python.md's "Context parallelism" section, run as written."""

import datetime
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch was built without torch.distributed's gloo backend", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import rope  # noqa: E402
from rope import ops  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEADLINE_S = 180  # for all processes of one test: a hung collective fails the test instead of CI


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard(x, n, r, dim):
    """Rank r's load-balanced shard of x along dim: chunks r and 2n-1-r of 2n."""
    chunks = x.chunk(2 * n, dim=dim)
    return torch.cat([chunks[r], chunks[2 * n - 1 - r]], dim=dim)


def unshard(parts, n, dim):
    """The whole tensor from every rank's shard (parts[r] from rank r)."""
    chunks = [None] * (2 * n)
    for r, part in enumerate(parts):
        chunks[r], chunks[2 * n - 1 - r] = part.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)


def gather(x, n):
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous())
    return parts


def random(shape, seed, dtype):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1).to(dtype)


CONFIG = dict(head_dim=64, scaling={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5})


def padded_case(rank, n, dtype, layout):
    """q and k [batch, heads, seq, dim] (or bshd), positions 37.. on every sequence."""
    config = rope.Config(**CONFIG)
    seq_dim = 2 if layout == "bhsd" else 1
    shape = lambda heads: (2, heads, 48, 64) if layout == "bhsd" else (2, 48, heads, 64)  # noqa: E731
    q, k = random(shape(4), 10, dtype), random(shape(2), 11, dtype)
    q_local, k_local = ops.rope(shard(q, n, rank, seq_dim), shard(k, n, rank, seq_dim), config, positions=37,
                                layout=layout, cp=(n, rank))
    got_q, got_k = (unshard(gather(t, n), n, seq_dim) for t in (q_local, k_local))
    want_q, want_k = ops.rope(q, k, config, positions=37, layout=layout)
    assert torch.equal(got_q, want_q), f"padded {layout} {dtype}: q"
    assert torch.equal(got_k, want_k), f"padded {layout} {dtype}: k"


LENGTHS = [24, 64, 0, 8]  # each a multiple of 2n for n = 2 and 4; an empty sequence too
STARTS = [0, 500, 7, 3000]


def packed_case(rank, n):
    """Packed [tokens, heads, dim]: this rank's shard of each sequence, its cu_seqlens the global ones / n."""
    config = rope.Config(**CONFIG)
    total = sum(LENGTHS)
    q, k = random((total, 4, 64), 20, torch.float32), random((total, 2, 64), 21, torch.float32)
    bounds = torch.tensor([0] + LENGTHS).cumsum(0)
    sequences = lambda x: [x[bounds[i]:bounds[i + 1]] for i in range(len(LENGTHS))]  # noqa: E731
    q_local = torch.cat([shard(s, n, rank, 0) for s in sequences(q)])
    k_local = torch.cat([shard(s, n, rank, 0) for s in sequences(k)])
    local_cu = torch.tensor([0] + [length // n for length in LENGTHS]).cumsum(0)
    starts = torch.tensor(STARTS)
    q_out, k_out = ops.rope(q_local, k_local, config, layout="thd", cu_seqlens=local_cu, starts=starts, cp=(n, rank))
    want_q, want_k = ops.rope(q, k, config, layout="thd", cu_seqlens=bounds, starts=starts)
    for out, want, name in ((q_out, want_q, "q"), (k_out, want_k, "k")):
        parts = gather(out, n)  # each rank's shards, sequence after sequence
        per_rank = [[p[local_cu[i]:local_cu[i + 1]] for i in range(len(LENGTHS))] for p in parts]
        got = torch.cat([unshard([per_rank[r][i] for r in range(n)], n, 0) for i in range(len(LENGTHS))])
        assert torch.equal(got, want), f"packed: {name}"


def worker(rank, n, port):
    torch.set_num_threads(1)  # n processes on a few cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for dtype in (torch.float32, torch.bfloat16):
            padded_case(rank, n, dtype, "bhsd")
        padded_case(rank, n, torch.float32, "bshd")
        packed_case(rank, n)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Every check passed. Leave without the interpreter's teardown: there, after this function
    # has returned and the group is destroyed, a gloo process now and then dies of
    # std::terminate or SIGBUS in C++ static destruction, which would fail this test for
    # nothing it checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.parametrize("n", [2, 4])
def test_gathered_shards_equal_the_single_process_rotation(n):
    context = mp.start_processes(worker, args=(n, free_port()), nprocs=n, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    while not context.join(timeout=5):  # raises, with the worker's traceback, if one failed
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{n} ranks did not finish within {DEADLINE_S} s")


def test_the_docs_script_runs(tmp_path):
    page = (ROOT / "docs" / "python.md").read_text()
    section = page[page.index('<!-- BEGIN section "Context parallelism"'):
                   page.index('<!-- END section "Context parallelism"')]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    script = tmp_path / "context_parallel.py"
    script.write_text(block)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                            timeout=DEADLINE_S)
    assert result.returncode == 0, result.stdout + result.stderr
