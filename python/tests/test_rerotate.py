"""rope.rerotate on every host backend against an independent NumPy float64 re-rotation:
each pair turned by to * theta_i - from * theta_i, computed here from the positions'
definitions (oracle.py), never by rope. Positions go up to 200000: rope forms the
angle difference before rounding, so one re-rotation keeps one rotation's accuracy."""

import numpy as np
import pytest

import oracle
import rope
from conftest import HOST_BACKENDS, poisoned, random_array

pytestmark = pytest.mark.skipif(not HOST_BACKENDS, reason="no host backend available")

# One rotation's error in float32, at any position (the precise mode's angle).
ONE_ROTATION = (1e-6, 4e-6)


def rerotated(x, from_positions, to_positions, theta, style="neox", rotary_dim=None, axes_of_pairs=None):
    """x [b, h, s, d] with pair i of token (b, s) turned by to * theta_i - from * theta_i ([axes, b, s] positions)."""
    rotary_dim = rotary_dim or x.shape[-1]
    pairs = rotary_dim // 2
    axes_of_pairs = np.zeros(pairs, dtype=np.int64) if axes_of_pairs is None else axes_of_pairs
    batch, seq = x.shape[0], x.shape[2]
    angles = np.empty((batch, seq, pairs))
    for i in range(pairs):
        start = np.broadcast_to(np.asarray(from_positions, dtype=np.float64)[axes_of_pairs[i]], (batch, seq))
        end = np.broadcast_to(np.asarray(to_positions, dtype=np.float64)[axes_of_pairs[i]], (batch, seq))
        angles[:, :, i] = end * theta[i] - start * theta[i]
    return oracle.rotate_cos_sin(x, np.cos(angles), np.sin(angles), style, rotary_dim)


def check(got, want, what, tolerance):
    rel, worst = oracle.relative_l2(got, want), oracle.max_abs(got, want)
    assert rel < tolerance[0] and worst < tolerance[1], f"{what}: relative L2 {rel:.3g}, max abs {worst:.3g}"


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("in_place", [True, False])
def test_offset_to_ids_matches_float64(backend, style, in_place):
    batch, heads, seq, head_dim = 2, 3, 12, 64
    k = random_array((batch, heads, seq, head_dim), "float32", 170)
    x = k.copy()
    to_ids = np.random.default_rng(171).integers(0, 200_000, size=(batch, seq))
    config = rope.Config(head_dim=head_dim, style=style, rotary_dim=48)
    out = None if in_place else poisoned(k.shape, "float32")
    result = rope.rerotate(k, config, 150_000, to_ids, out=out, backend=backend)
    assert result is (k if in_place else out)
    want = rerotated(x, oracle.offset_positions(batch, seq, 150_000), oracle.ids_positions(to_ids, batch),
                     oracle.theta(48, 10000.0), style, 48)
    check(result, want, "re-rotated", ONE_ROTATION)
    if not in_place:
        assert np.array_equal(k, x)  # The input is only read.


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_mrope_ids(backend):
    seq, head_dim, sections = 10, 64, [8, 12, 12]
    k = random_array((seq, 2, head_dim), "float32", 172)  # thd
    x = k.copy()
    rng = np.random.default_rng(173)
    from_ids, to_ids = rng.integers(0, 5000, size=(3, seq)), rng.integers(0, 5000, size=(3, seq))
    config = rope.Config(head_dim=head_dim, mrope_section=sections)
    rope.rerotate(k, config, from_ids, to_ids, backend=backend)
    want = rerotated(oracle.to_logical(x, "thd"), oracle.ids_positions(from_ids, 1, 3), oracle.ids_positions(to_ids, 1, 3),
                     oracle.theta(head_dim, 10000.0), axes_of_pairs=oracle.pair_axes(32, "mrope", sections))
    check(oracle.to_logical(k, "thd"), want, "M-RoPE", ONE_ROTATION)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_to_zero_gives_back_the_raw_keys(backend, dtype):
    raw = random_array((1, 16, 2, 64), dtype, 174)  # bshd
    keys = raw.copy()
    config = rope.Config(head_dim=64)
    rope.apply(keys, None, config, positions=900, layout="bshd", backend=backend)
    rope.rerotate(keys, config, 900, np.zeros(16, dtype=np.int64), layout="bshd", backend=backend)
    rel_tol, abs_tol = oracle.TOLERANCE[dtype]
    check(keys.astype(np.float64), raw.astype(np.float64), "back at 0", (2 * rel_tol, 2 * abs_tol))


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_bad_input_names_the_argument_and_writes_nothing(backend):
    k = random_array((1, 2, 8, 64), "float32", 175)
    before = k.copy()
    config = rope.Config(head_dim=64)
    cases = [
        (dict(from_positions=1.5, to_positions=0), "from_positions"),
        (dict(from_positions=0, to_positions=np.array([0, 1, 2, -3, 4, 5, 6, 7])), "to.ids[3] = -3"),
        (dict(from_positions=np.arange(9), to_positions=0), "from.length = 9"),
        (dict(from_positions=-1, to_positions=0), "from.offset = -1"),
    ]
    for arguments, message in cases:
        with pytest.raises(rope.Error, match=message.replace("[", r"\[").replace("]", r"\]")):
            rope.rerotate(k, config, backend=backend, **arguments)
        assert np.array_equal(k, before)
    dynamic = rope.Config(head_dim=64, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                "original_max_position_embeddings": 1024})
    with pytest.raises(rope.Error, match="scaling.type = dynamic"):
        rope.rerotate(k, dynamic, 5000, 3, backend=backend)
    assert np.array_equal(k, before)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_cache_rows_through_slots_match_float64(backend, kv_layout):
    """rope.rerotate_cache: the named rows (pages in no order, two skipped entries) turned
    as the float64 re-rotation turns them; every other element keeps its bytes."""
    pages, page_size, heads, head_dim, entries = 5, 4, 2, 32, 8
    shape = (pages, page_size, heads, head_dim) if kv_layout == "nhd" else (pages, heads, page_size, head_dim)
    cache = random_array(shape, "float32", 180)
    before = cache.copy()
    rng = np.random.default_rng(181)
    slots = rng.permutation(pages * page_size)[:entries].astype(np.int64)
    slots[[1, 5]] = -1
    from_ids = rng.integers(0, 200_000, size=entries)
    to_ids = rng.integers(0, 200_000, size=entries)
    config = rope.Config(head_dim=head_dim)
    assert rope.rerotate_cache(cache, config, slots, from_ids, to_ids, backend=backend, kv_layout=kv_layout) is cache

    def row(c, slot):  # [heads, head_dim]: this test's own page arithmetic
        page, offset = divmod(int(slot), page_size)
        return c[page, offset] if kv_layout == "nhd" else c[page, :, offset]

    named = [t for t in range(entries) if slots[t] >= 0]
    gathered = np.stack([row(before, slots[t]) for t in named], axis=1)[None]  # [1, heads, n, head_dim]
    want = rerotated(gathered, oracle.ids_positions(from_ids[named], 1), oracle.ids_positions(to_ids[named], 1),
                     oracle.theta(head_dim, 10000.0))
    got = np.stack([row(cache, slots[t]) for t in named], axis=1)[None]
    check(got, want, "re-rotated cache rows", ONE_ROTATION)
    untouched = np.ones(shape, dtype=bool)
    for t in named:
        row(untouched, slots[t])[...] = False
    assert np.array_equal(cache.view(np.uint32)[untouched], before.view(np.uint32)[untouched])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_cache_bad_slots_are_named_and_nothing_is_written(backend):
    cache = random_array((3, 4, 1, 16), "float32", 182)
    before = cache.copy()
    config = rope.Config(head_dim=16)
    for slots, message in [([0, 12, 2], "slot_mapping.slots[1] = 12"), ([5, 1, 5], "slot_mapping.slots[2] = 5")]:
        with pytest.raises(rope.Error, match=message.replace("[", r"\[").replace("]", r"\]")):
            rope.rerotate_cache(cache, config, np.array(slots, dtype=np.int64), 0, [7, 8, 9], backend=backend)
        assert np.array_equal(cache, before)
    with pytest.raises(rope.Error, match="k_cache.dtype = uint8"):  # FP8 codes: refused, never rounded twice
        rope.rerotate_cache(np.zeros((3, 4, 1, 16), dtype=np.uint8), config, np.array([0], dtype=np.int64), 0, [1],
                            backend=backend)
    with pytest.raises(rope.Error, match="to.length"):
        rope.rerotate_cache(cache, config, np.array([0, 1], dtype=np.int64), 0, [7, 8, 9], backend=backend)
