"""python/bench/peers.py (rope beside the public RoPE kernels) without a GPU: its command line, and that what
it checks every implementation against is right: its float64 reference agrees with this suite's oracle on
every row's position form, rope and HuggingFace's formula pass its check, and a call that rotates nothing fails it.
"""

import functools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oracle

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import peers  # noqa: E402
from op_cost import Sets  # noqa: E402

# Small rows of each form, layout and dtype the harness measures.
ROWS = [("p", "plain", "bhsd", (2, 4, 16, 64), 4, "fp32"), ("q", "plain", "bshd", (2, 4, 16, 64), 2, "bf16"),
        ("k", "packed", "thd", (1, 4, 300, 64), 2, "bf16"), ("m", "mrope", "bshd", (1, 4, 70, 128), 2, "bf16"),
        ("t", "table", "bshd", (2, 4, 16, 64), 4, "fp32")]


def run(*arguments):
    return subprocess.run([sys.executable, str(BENCH / "peers.py"), *arguments], capture_output=True, text=True)


def test_help_names_the_rows_and_the_rope_bench_column():
    done = run("--help")
    assert done.returncode == 0, done.stderr
    assert "--rope-bench" in done.stdout and "packed THD" in done.stdout and "--quick" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the path of a machine without a GPU")
def test_without_a_gpu_it_reports_skipped(tmp_path):
    done = run(str(tmp_path), "--quick")
    assert done.returncode == 77 and "SKIPPED" in done.stdout, done.stdout + done.stderr


def test_packed_lengths_are_rope_bench_s_draw():
    lengths = peers.packed_lengths()  # rope-bench --packed 1..8192:32768, the 7 sequences
    assert len(lengths) == 7 and sum(lengths) == 32768 and all(1 <= n <= 8192 for n in lengths)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r[1]}-{r[2]}-{r[5]}" for r in ROWS])
def test_the_check_agrees_with_the_oracle(row, monkeypatch):
    monkeypatch.setattr(peers.Case, "device", "cpu")
    case = peers.Case(row, functools.partial(Sets, count=2))
    _, form, _, shape, _, dtype = row
    ids = case.positions.numpy()
    axes = oracle.pair_axes(shape[3] // 2, "mrope" if form == "mrope" else "single", peers.SECTIONS)
    for x, want in zip(case.inputs, case.want):
        logical = case.logical(x).double().numpy()
        expected = oracle.rope(logical, oracle.ids_positions(ids, logical.shape[0], len(ids)),
                               oracle.theta(shape[3], peers.BASE), axes_of_pairs=axes)
        assert oracle.relative_l2(want.numpy(), expected) < 1e-12
    makers = {name: make for name, _, _, make in peers.peer_makers(peers.ROOT / ".carry" / "peers", None)}
    for name in ("rope.ops.rope_", "rope.ops.rope", "HF eager"):
        max_abs, rel_l2 = peers.check(case, makers[name](case))
        assert rel_l2 <= peers.TOLERANCE[dtype] and max_abs < 0.05, name
    nothing = peers.check(case, lambda i: (case.sets.q[i], case.sets.k[i]))  # Inputs left as they were.
    assert nothing[1] > 10 * peers.TOLERANCE[dtype]
    nan = peers.check(case, lambda i: (torch.full_like(case.sets.q[i], math.nan), case.sets.k[i]))
    assert nan == (math.inf, math.inf) and np.isinf(nan[1])
