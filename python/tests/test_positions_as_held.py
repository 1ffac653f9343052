"""Positions and integers as users hold them, through every Python entry (rope.apply,
rope.ops.rope_, rope.ops.rope, torch.ops.rope.apply_):

- integer position arrays of any integer type and any strides (a slice, an
  expand()ed row, int32, NumPy or PyTorch) rotate as their int64 values do,
  against the float64 oracle;
- non-integer positions (a float list, a float array or tensor, bools) are a
  rope.Error naming ``positions``, never truncated (positions=[1.9] * 8 used to
  rotate by position 1), and nothing is written;
- a Python integer beyond int64 (positions, offsets, cp, max_position, config
  fields; beyond float64 for base and factor) is a rope.Error naming it, not
  nanobind's TypeError or Python's OverflowError;
- an inference tensor rotated in place outside torch.inference_mode() is
  refused by rope.ops.rope_ whichever operator is registered (the C++ one, or
  the Python fallback: CTest runs this file under ROPE_PYTHON_OPERATOR=1 too).
"""

import re

import numpy as np
import pytest

import oracle
import rope
from conftest import HOST_BACKENDS, random_array

pytestmark = pytest.mark.skipif(not HOST_BACKENDS, reason="no host backend available")

HEAD_DIM, SEQ = 32, 8
BIG = 2 ** 70  # no int64 holds it
HUGE = 10 ** 400  # no float64 holds it


def config(**fields):
    return rope.Config(**{"head_dim": HEAD_DIM, **fields})


def check_rotated(got, x, ids):
    want = oracle.rope(x, oracle.ids_positions(np.asarray(ids), x.shape[0]), oracle.theta(HEAD_DIM, 10000.0))
    rel_tol, abs_tol = oracle.TOLERANCE["float32"]
    got = np.asarray(got, dtype=np.float64)
    assert oracle.relative_l2(got, want) < rel_tol and oracle.max_abs(got, want) < abs_tol


def numpy_views():
    """(name, ids view, its int64 values): what a user may hold instead of a contiguous int64 array."""
    base = np.random.default_rng(3).integers(0, 400, size=2 * SEQ)
    row = base[:SEQ].copy()
    return [
        ("int32", row.astype(np.int32), row),
        ("uint16", row.astype(np.uint16), row),
        ("strided slice", base[::2], base[::2]),
        ("reversed", row[::-1], row[::-1]),
        ("broadcast [2, seq]", np.broadcast_to(row, (2, SEQ)), np.broadcast_to(row, (2, SEQ))),
        ("list", row.tolist(), row),
    ]


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("case", numpy_views(), ids=[c[0] for c in numpy_views()])
def test_numpy_integer_positions_of_any_type_and_strides(backend, case):
    _, ids, values = case
    q = random_array((2, 3, SEQ, HEAD_DIM), "float32", 1)
    x = q.copy()
    rope.apply(q, None, config(), positions=ids, backend=backend)
    check_rotated(q, x, values)


NOT_INTEGERS = [
    ("float list", [1.9] * SEQ, "float64"),
    ("float array", np.full(SEQ, 1.9), "float64"),
    ("float32 array", np.full(SEQ, 1.0, dtype=np.float32), "float32"),
    ("bool array", np.ones(SEQ, dtype=bool), "bool"),
    ("bool list", [True] * SEQ, "bool"),
    ("float", 1.9, "float"),
    ("bool", True, "bool"),
]


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("case", NOT_INTEGERS, ids=[c[0] for c in NOT_INTEGERS])
def test_non_integer_positions_are_refused_never_truncated(backend, case):
    _, positions, kind = case
    q = random_array((1, 2, SEQ, HEAD_DIM), "float32", 2)
    before = q.copy()
    with pytest.raises(rope.Error, match=re.escape(f"positions = {kind}") + ".*must be integers"):
        rope.apply(q, None, config(), positions=positions, backend=backend)
    assert np.array_equal(q, before)


@pytest.mark.parametrize("call", ["positions", "ids", "cp", "max_position", "head_dim", "rotary_dim", "sections",
                                  "original_max_position_embeddings", "base", "factor"])
def test_integers_beyond_int64_are_rope_errors(call):
    q = random_array((1, 2, SEQ, HEAD_DIM), "float32", 3)
    before = q.copy()
    expected = re.escape(f"= {HUGE}") + ".*must be" if call in ("base", "factor") else re.escape(f"= {BIG}") + ".*int64"
    with pytest.raises(rope.Error, match=expected):
        if call == "positions":
            rope.apply(q, None, config(), positions=BIG)
        elif call == "ids":
            rope.apply(q, None, config(), positions=[BIG] * SEQ)
        elif call == "cp":
            rope.apply(q, None, config(), cp=(2, BIG))
        elif call == "max_position":
            rope.apply(q, None, config(), max_position=BIG)
        elif call == "head_dim":
            config(head_dim=BIG)
        elif call == "rotary_dim":
            config(rotary_dim=BIG)
        elif call == "sections":
            config(mrope_section=[BIG, 8, 8])
        elif call == "original_max_position_embeddings":
            config(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": BIG})
        elif call == "base":  # Beyond float too: a number out of range, named.
            config(base=HUGE)
        else:
            config(scaling={"rope_type": "linear", "factor": HUGE})
    assert np.array_equal(q, before)


# --- PyTorch: tensors and the operators ------------------------------------------------------
def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def torch_views(torch):
    g = torch.Generator().manual_seed(4)
    base = torch.randint(0, 400, (2 * SEQ,), generator=g)
    row = base[:SEQ].clone()
    return [
        ("int32", row.int(), row),
        ("int16", row.short(), row),
        ("strided slice", base[::2], base[::2]),
        ("expanded [2, seq]", row.expand(2, SEQ), row.expand(2, SEQ)),
        ("transposed [2, seq]", torch.stack([row, row + 1], 1).t(), torch.stack([row, row + 1])),
    ]


ENTRIES = ["rope.apply", "rope.ops.rope_", "rope.ops.rope", "torch.ops.rope.apply_"]


def rotate(torch, entry, q, positions, cfg):
    """q rotated through ``entry`` at ``positions``: the result (q itself where in place)."""
    if entry == "rope.apply":
        return rope.apply(q, None, cfg, positions=positions)[0]
    from rope import ops
    if entry == "rope.ops.rope_":
        return ops.rope_(q, None, cfg, positions=positions)[0]
    if entry == "rope.ops.rope":
        return ops.rope(q, None, cfg, positions=positions)[0]
    torch.ops.rope.apply_(q, None, cfg.key, 0, positions, None, None, 1, 0, None, "bhsd", False, "", 0)
    return q


try:
    import torch as _torch
    CUDA = _torch.cuda.is_available() and rope.list_backends()[3].available
except ImportError:
    CUDA = False
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not CUDA, reason="needs a CUDA device and rope built with CUDA")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_torch_integer_positions_of_any_type_and_strides(entry, device):
    torch = torch_or_skip()
    for name, ids, values in torch_views(torch):
        x = random_array((2, 3, SEQ, HEAD_DIM), "float32", 5)
        q = torch.from_numpy(x.copy()).to(device)
        got = rotate(torch, entry, q, ids.to(device), config())  # ids on q's device, as the backend wants them
        check_rotated(got.cpu().numpy(), x, values.numpy())


@pytest.mark.parametrize("entry", ENTRIES)
def test_torch_non_integer_positions_are_refused(entry):
    torch = torch_or_skip()
    cases = [(torch.full((SEQ,), 1.9), "float32"), (torch.ones(SEQ, dtype=torch.bool), "bool"),
             (torch.full((SEQ,), 2.0, dtype=torch.float64), "float64")]
    if entry != "torch.ops.rope.apply_":  # The Python forms the operator's schema does not take.
        cases += [([1.9] * SEQ, "float64"), (1.9, "float"), (True, "bool")]
    for positions, kind in cases:
        q = torch.from_numpy(random_array((1, 2, SEQ, HEAD_DIM), "float32", 6))
        before = q.clone()
        # rope.Error from rope's entries; the registered operator raises ValueError (rope.Error's base).
        with pytest.raises(ValueError, match=re.escape(f"positions = {kind}") + ".*must be integers"):
            rotate(torch, entry, q, positions, config())
        assert torch.equal(q, before), (entry, kind)


@pytest.mark.parametrize("argument", ["positions", "cp", "max_position"])
def test_torch_entries_refuse_integers_beyond_int64(argument):
    torch = torch_or_skip()
    from rope import ops
    q = torch.from_numpy(random_array((1, 2, SEQ, HEAD_DIM), "float32", 7))
    before = q.clone()
    kwargs = {"positions": BIG} if argument == "positions" else {"cp": (2, BIG)} if argument == "cp" else \
        {"max_position": BIG}
    for call in (ops.rope_, ops.rope):
        with pytest.raises(rope.Error, match=re.escape(f"= {BIG}") + ".*int64"):
            call(q, None, config(), **kwargs)
        assert torch.equal(q, before)


def test_inference_tensor_outside_inference_mode_is_refused_by_either_operator():
    # PyTorch allows no in-place update of an inference tensor outside torch.inference_mode(); the
    # docs promise rope.ops.rope_ refuses it before writing, with the C++ operator or without it.
    torch = torch_or_skip()
    from rope import ops
    cfg = config()
    with torch.inference_mode():
        q = torch.from_numpy(random_array((1, 2, SEQ, HEAD_DIM), "float32", 8)).clone()
        k = q.clone()
    before = q.clone()
    expected = "q = an inference tensor: is rotated in place outside torch.inference_mode()"
    with pytest.raises(ValueError, match=re.escape(expected)):
        ops.rope_(q, k, cfg, positions=3)
    with pytest.raises(ValueError, match=re.escape(expected)):
        torch.ops.rope.apply_(q, k, cfg.key, 3, None, None, None, 1, 0, None, "bhsd", False, "", 0)
    assert torch.equal(q, before) and torch.equal(k, before)
    with torch.inference_mode():  # Inside it, rotated.
        ops.rope_(q, k, cfg, positions=3)
    assert not torch.equal(q, before)
