"""The positions forms beyond one line, on every host backend, against the float64
oracle: packed sequences (thd + cu_seqlens, starts), context-parallel shards,
M-RoPE (contiguous and interleaved, with distinct temporal/height/width rows),
axial RoPE, and a caller's cos/sin table (real angles and angles no formula
would give). Positions stay below ~1000, where float32 angles meet the tolerance."""

import numpy as np
import pytest

import oracle
import rope
from conftest import HOST_BACKENDS, poisoned, random_array

pytestmark = pytest.mark.skipif(not HOST_BACKENDS, reason="no host backend available")


def check(got, want, what, dtype="float32"):
    rel_tol, abs_tol = oracle.TOLERANCE[dtype]
    rel, worst = oracle.relative_l2(got, want), oracle.max_abs(got, want)
    assert rel < rel_tol and worst < abs_tol, f"{what}: relative L2 {rel:.3g}, max abs {worst:.3g}"


CU_SEQLENS = np.array([0, 6, 6, 16, 20], dtype=np.int64)  # 4 sequences, one empty; 20 tokens


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("starts", [None, np.array([100, 0, 7, 900], dtype=np.int64)])
def test_packed_sequences(backend, style, starts):
    tokens, q_heads, k_heads, head_dim = 20, 4, 1, 64  # k with one head: a case that broke elsewhere
    q, k = random_array((tokens, q_heads, head_dim), "float32", 20), random_array((tokens, k_heads, head_dim), "float32", 21)
    x_q, x_k = q.copy(), k.copy()
    config = rope.Config(head_dim=head_dim, style=style)
    rope.apply(q, k, config, cu_seqlens=CU_SEQLENS, starts=starts, backend=backend)  # layout thd (3-D)
    positions = oracle.packed_positions(CU_SEQLENS, starts)
    for got, x in ((q, x_q), (k, x_k)):
        want = oracle.rope(oracle.to_logical(x, "thd"), positions, oracle.theta(head_dim, 10000.0), style)
        check(oracle.to_logical(got, "thd"), want, "packed")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_packed_offset_is_every_start(backend):
    q = random_array((20, 2, 32), "float32", 22)
    x = q.copy()
    rope.apply(q, None, rope.Config(head_dim=32), positions=50, cu_seqlens=CU_SEQLENS, backend=backend)
    starts = np.full(4, 50)
    want = oracle.rope(oracle.to_logical(x, "thd"), oracle.packed_positions(CU_SEQLENS, starts), oracle.theta(32, 1e4))
    check(oracle.to_logical(q, "thd"), want, "packed with offset")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("cp_size", [2, 4])
def test_context_parallel_shard_of_an_offset_sequence(backend, cp_size):
    batch, heads, local_seq, head_dim = 2, 2, 8, 32  # each rank holds 8 of 8*cp_size tokens
    for rank in range(cp_size):
        q = random_array((batch, heads, local_seq, head_dim), "float32", 30 + rank)
        x = q.copy()
        rope.apply(q, None, rope.Config(head_dim=head_dim), positions=5, cp=(cp_size, rank), backend=backend)
        shard = oracle.cp_shard(5 + np.arange(local_seq * cp_size), cp_size, rank)
        positions = np.broadcast_to(shard, (1, batch, local_seq))
        check(q, oracle.rope(x, positions, oracle.theta(head_dim, 1e4)), f"cp rank {rank}/{cp_size}")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_context_parallel_positions_are_global(backend):
    # cu_seqlens [0, 4, 8] on rank 0 of 2 rotates positions [0, 3, 4, 7] in each sequence, not [0, 1, 2, 3].
    cu = np.array([0, 4, 8], dtype=np.int64)
    q = random_array((8, 1, 16), "float32", 40)
    x = q.copy()
    rope.apply(q, None, rope.Config(head_dim=16), cu_seqlens=cu, cp=(2, 0), backend=backend)
    positions = oracle.packed_positions(cu, cp_size=2, rank=0)
    assert positions.ravel().tolist() == [0, 1, 6, 7, 0, 1, 6, 7]
    check(oracle.to_logical(q, "thd"), oracle.rope(oracle.to_logical(x, "thd"), positions, oracle.theta(16, 1e4)), "cp packed")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("per_sequence", [False, True])
def test_mrope_with_distinct_axis_rows(backend, interleaved, style, per_sequence):
    batch, heads, seq, head_dim = 2, 2, 12, 128
    sections = [24, 20, 20] if interleaved else [16, 24, 24]
    config = rope.Config(head_dim=head_dim, base=1e6, style=style, mrope_section=sections,
                         mrope_interleaved=interleaved)
    rng = np.random.default_rng(50)
    shape = (3, batch, seq) if per_sequence else (3, seq)
    ids = rng.integers(0, 700, size=shape)  # temporal, height, width rows all different (an image)
    q = random_array((batch, heads, seq, head_dim), "float32", 51)
    x = q.copy()
    rope.apply(q, None, config, positions=ids, backend=backend)
    axes = oracle.pair_axes(64, "mrope-interleaved" if interleaved else "mrope", sections)
    want = oracle.rope(x, oracle.ids_positions(ids, batch, axes=3), oracle.theta(head_dim, 1e6), style,
                       axes_of_pairs=axes)
    check(q, want, "mrope")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_mrope_from_a_huggingface_dict(backend):
    # Qwen2-VL's rope_scaling as transformers 4 wrote it: rope_type "mrope" with its sections.
    config = rope.Config(head_dim=128, scaling={"type": "mrope", "mrope_section": [16, 24, 24], "rope_theta": 1e6})
    assert config.mrope_section == [16, 24, 24] and config.axes == 3 and config.base == 1e6


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("sections", [[20, 20], [8, 28, 28]])
def test_axial(backend, sections):
    head_dim = 2 * sum(sections)
    config = rope.Config(head_dim=head_dim, base=10000.0, axial_sections=sections)
    rng = np.random.default_rng(60)
    ids = rng.integers(0, 64, size=(len(sections), 16))  # one coordinate per axis per patch
    q = random_array((1, 3, 16, head_dim), "float32", 61)
    x = q.copy()
    rope.apply(q, None, config, positions=ids, backend=backend)
    want = oracle.rope(x, oracle.ids_positions(ids, 1, axes=len(sections)), oracle.axial_theta(10000.0, sections),
                       axes_of_pairs=oracle.pair_axes(head_dim // 2, "axial", sections))
    check(q, want, "axial")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("angles", ["real", "arbitrary"])
@pytest.mark.parametrize("inverse", [False, True])
def test_cos_sin_cache(backend, angles, inverse):
    rows, head_dim, rotary_dim = 300, 64, 32
    rng = np.random.default_rng(70)
    if angles == "real":  # vLLM's table: cos(p * theta_i) then sin(p * theta_i)
        a = np.arange(rows)[:, None] * oracle.theta(rotary_dim, 10000.0)[None]
        table = np.concatenate([np.cos(a), np.sin(a)], axis=1).astype(np.float32)
    else:  # numbers no formula gives (cos and sin not even on the unit circle)
        table = rng.uniform(-2, 2, size=(rows, rotary_dim)).astype(np.float32)
    ids = rng.integers(0, rows, size=10)
    q = random_array((2, 3, 10, head_dim), "float32", 71)
    x = q.copy()
    out = poisoned(q.shape, "float32")
    rope.apply(q, None, rope.Config(head_dim=head_dim, rotary_dim=rotary_dim), positions=ids,
               cos_sin_cache=table, inverse=inverse, out=(out, None), backend=backend)
    want = oracle.rope_from_table(x, oracle.ids_positions(ids, 2), table, rotary_dim=rotary_dim, inverse=inverse)
    check(out, want, f"table ({angles})")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_cos_sin_cache_with_padded_rows(backend):
    padded = random_array((50, 40), "float32", 80)
    table = padded[:, :32]  # row stride 40
    q = random_array((1, 1, 5, 32), "float32", 81)
    x = q.copy()
    rope.apply(q, None, rope.Config(head_dim=32), positions=7, cos_sin_cache=table, backend=backend)
    check(q, oracle.rope_from_table(x, oracle.offset_positions(1, 5, 7), table), "padded table")
