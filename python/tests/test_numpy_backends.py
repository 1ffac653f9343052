"""Every host backend on NumPy arrays against the float64 oracle: dtypes, styles,
layouts, partial rotary, grouped-query k, positions, inverse, in and out of
place, and memory rope must read through strides (slices, transposes, padding,
a feature stride that is not 1)."""

import numpy as np
import pytest

import oracle
import rope
from conftest import DTYPES, HOST_BACKENDS, poisoned, random_array

pytestmark = pytest.mark.skipif(not HOST_BACKENDS, reason="no host backend available")


def check(got, want, dtype, what):
    """got (any layout, converted by the caller) against the float64 ``want``."""
    rel_tol, abs_tol = oracle.TOLERANCE[dtype]
    rel, worst = oracle.relative_l2(got, want), oracle.max_abs(got, want)
    assert rel < rel_tol and worst < abs_tol, f"{what}: relative L2 {rel:.3g} (< {rel_tol}), max abs {worst:.3g}"


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("in_place", [True, False])
def test_against_float64(backend, dtype, style, layout, in_place):
    batch, q_heads, k_heads, seq, head_dim, rotary_dim = 2, 8, 2, 24, 64, 48  # GQA, partial rotary
    shape = lambda heads: (batch, heads, seq, head_dim) if layout == "bhsd" else (batch, seq, heads, head_dim)
    q, k = random_array(shape(q_heads), dtype, 1), random_array(shape(k_heads), dtype, 2)
    q_before, k_before = q.copy(), k.copy()
    config = rope.Config(head_dim=head_dim, rotary_dim=rotary_dim, base=10000.0, style=style)
    offset = 37
    out = None if in_place else (poisoned(q.shape, dtype), poisoned(k.shape, dtype))

    q_res, k_res = rope.apply(q, k, config, positions=offset, backend=backend, layout=layout, out=out)

    theta = oracle.theta(rotary_dim, 10000.0)
    positions = oracle.offset_positions(batch, seq, offset)
    for name, got, x in (("q", q_res, q_before), ("k", k_res, k_before)):
        want = oracle.rope(oracle.to_logical(x, layout), positions, theta, style, rotary_dim)
        check(oracle.to_logical(got, layout), want, dtype, name)
    if in_place:
        assert q_res is q and k_res is k  # zero-copy: the caller's arrays hold the result
    else:
        assert np.array_equal(q, q_before, equal_nan=True) and np.array_equal(k, k_before, equal_nan=True)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_ids_shared_and_per_sequence(backend):
    batch, heads, seq, head_dim = 3, 4, 10, 32
    config = rope.Config(head_dim=head_dim, base=500000.0)
    theta = oracle.theta(head_dim, 500000.0)
    rng = np.random.default_rng(5)
    for ids in (rng.integers(0, 512, size=seq), rng.integers(0, 512, size=(batch, seq))):
        q = random_array((batch, heads, seq, head_dim), "float32", 3)
        x = q.copy()
        rope.apply(q, None, config, positions=ids, backend=backend)  # k None: rotate q only
        want = oracle.rope(x, oracle.ids_positions(ids, batch), theta)
        check(q, want, "float32", f"ids shape {ids.shape}")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_ids_as_list_and_int32(backend):
    config = rope.Config(head_dim=16)
    q = random_array((1, 2, 4, 16), "float32", 4)
    x = q.copy()
    rope.apply(q, None, config, positions=[9, 3, 0, 7], backend=backend)
    check(q, oracle.rope(x, oracle.ids_positions([9, 3, 0, 7], 1), oracle.theta(16, 10000.0)), "float32", "list")
    q2 = x.copy()
    rope.apply(q2, None, config, positions=np.array([9, 3, 0, 7], dtype=np.int32), backend=backend)
    assert np.array_equal(q, q2)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_linear_scaling(backend):
    config = rope.Config(head_dim=64, scaling={"rope_type": "linear", "factor": 4.0})
    q = random_array((1, 4, 32, 64), "float32", 6)
    x = q.copy()
    rope.apply(q, None, config, positions=1000, backend=backend)
    want = oracle.rope(x, oracle.offset_positions(1, 32, 1000), oracle.theta(64, 10000.0, linear_factor=4.0))
    check(q, want, "float32", "linear")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_inverse_undoes_forward_and_matches_oracle(backend):
    config = rope.Config(head_dim=64, style="gptj")
    q = random_array((2, 4, 16, 64), "float32", 7)
    x = q.copy()
    rope.apply(q, None, config, positions=11, backend=backend, inverse=True)
    want = oracle.rope(x, oracle.offset_positions(2, 16, 11), oracle.theta(64, 10000.0), "gptj", inverse=True)
    check(q, want, "float32", "inverse")
    rope.apply(q, None, config, positions=11, backend=backend)
    check(q, x.astype(np.float64), "float32", "forward after inverse")


# --- Memory read through strides --------------------------------------------------------------
# Each case: the parent buffer's shape, the view of it rope gets, and the layout.
# None of the views is a dense bhsd block.
STRIDED_CASES = {
    "every_other_head": ((2, 8, 12, 64), lambda a: a[:, ::2], "bhsd"),
    "bshd_memory_transposed_to_bhsd": ((2, 12, 4, 64), lambda a: a.transpose(0, 2, 1, 3), "bhsd"),
    "padded_rows": ((2, 4, 12, 80), lambda a: a[..., :64], "bshd"),
    "feature_stride_two": ((2, 4, 12, 128), lambda a: a[..., ::2], "bhsd"),
    "fortran_order": ((64, 12, 4, 2), lambda a: a.T, "bhsd"),
}


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("case", list(STRIDED_CASES))
@pytest.mark.parametrize("in_place", [True, False])
def test_strided_inputs(backend, case, in_place):
    parent_shape, view_of, layout = STRIDED_CASES[case]
    parent_q, parent_k = random_array(parent_shape, "float32", 10), random_array(parent_shape, "float32", 11)
    q, k = view_of(parent_q), view_of(parent_k)
    assert not q.flags.c_contiguous
    parent_before = parent_q.copy()
    x_q, x_k = q.copy(), k.copy()
    config = rope.Config(head_dim=64, style="neox")
    # Out-of-place outputs are strided too: every other element of a wider buffer.
    out = None if in_place else (poisoned(q.shape[:-1] + (128,), "float32")[..., ::2],
                                 poisoned(k.shape[:-1] + (128,), "float32")[..., ::2])
    q_res, k_res = rope.apply(q, k, config, positions=3, backend=backend, layout=layout, out=out)
    shape = oracle.to_logical(q, layout).shape
    positions = oracle.offset_positions(shape[0], shape[2], 3)
    for got, x in ((q_res, x_q), (k_res, x_k)):
        want = oracle.rope(oracle.to_logical(x, layout), positions, oracle.theta(64, 10000.0))
        check(oracle.to_logical(got, layout), want, "float32", case)
    # The elements between the viewed ones (other heads, padding) are never written.
    covered = np.zeros(parent_q.size, dtype=bool)
    covered[view_of(np.arange(parent_q.size).reshape(parent_shape)).ravel()] = True
    gaps = ~covered.reshape(parent_shape)
    assert np.array_equal(parent_q[gaps], parent_before[gaps])
    if not in_place:
        assert np.array_equal(parent_q, parent_before)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_broadcast_input_is_read(backend):
    # A stride-0 input (one token broadcast over seq) is fine to read; outputs must not overlap.
    config = rope.Config(head_dim=32)
    token = random_array((1, 2, 1, 32), "float32", 12)
    q = np.broadcast_to(token, (1, 2, 6, 32))
    out = poisoned((1, 2, 6, 32), "float32")
    rope.apply(q, None, config, out=(out, None), backend=backend)
    want = oracle.rope(q.astype(np.float64), oracle.offset_positions(1, 6), oracle.theta(32, 10000.0))
    check(out, want, "float32", "broadcast input")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_empty_tensor_is_a_no_op(backend):
    config = rope.Config(head_dim=64)
    q = np.zeros((0, 4, 8, 64), np.float32)
    assert rope.apply(q, q.copy(), config, backend=backend)[0] is q


def test_default_backend_for_host_arrays_is_a_cpu_backend():
    q = random_array((1, 1, 4, 8), "float32", 13)
    x = q.copy()
    rope.apply(q, None, rope.Config(head_dim=8))
    check(q, oracle.rope(x, oracle.offset_positions(1, 4), oracle.theta(8, 10000.0)), "float32", "default backend")


def test_list_backends_names_every_backend_with_reasons():
    infos = rope.list_backends()
    assert [b.name for b in infos] == ["cpu-naive", "cpu-eigen", "cuda-naive", "cuda-optimized"]
    for b in infos:
        assert b.device in ("host", "cuda")
        assert b.available == (b.reason == "")
