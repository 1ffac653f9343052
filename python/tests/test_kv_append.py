"""rope.append_kv and torch.ops.rope.append_kv_ (RoPE + paged KV append) against a float64 NumPy reference.

The reference is written here: rotation from oracle.py (float64, independent of
rope), the scatter from the definition (token t with slot s >= 0, t < len(slots)
goes to page s // page_size, row s % page_size), FP8 codes from fp8_oracle.py
(nearest code, no library cast). Caches are poisoned with NaN (or a byte
pattern for FP8): a slot no token addresses must keep its poison bits.

An FP8 q output (q_out_fp8) is checked against the codes of the float64 oracle
rotation: rope quantises its float32 rotation, so where the oracle value lies
within the float32 tolerance of a rounding boundary either neighbouring code is
right (fp8_q_matches); everywhere else the code is the reference's.
"""

import numpy as np
import pytest

import rope
from conftest import HOST_BACKENDS, numpy_dtype, random_array
from fp8_oracle import decode, quantize_scaled
from oracle import TOLERANCE, max_abs, relative_l2, rope as oracle_rope, theta, to_logical

CONFIG = rope.Config(head_dim=64, base=10000.0, style="neox")
TOKENS, HEADS, KV_HEADS, DIM, PAGES, PAGE_SIZE = 7, 4, 2, 64, 6, 4
POSITIONS = np.array([5, 130, 17, 999, 3, 64, 250])  # the angle: unrelated to the slots below


def rotated(x, positions, config_dim=DIM, style="neox", base=10000.0):
    """float64 RoPE of x [T, H, D] at positions [T] (oracle.py), back in [T, H, D]."""
    logical = to_logical(np.asarray(x, dtype=np.float64), "thd")
    out = oracle_rope(logical, np.asarray(positions)[None, None, :], theta(config_dim, base), style)
    return out[0].transpose(1, 0, 2)


def permuted_slots(count, seed):
    """Slots over a shuffled page table: the tokens of a sequence land on pages in no particular order."""
    rng = np.random.default_rng(seed)
    pages = rng.permutation(PAGES)
    slots = [pages[t // PAGE_SIZE] * PAGE_SIZE + t % PAGE_SIZE for t in range(count)]
    return np.array(slots, dtype=np.int64)


def expected_cache(poison, rows, slots, tokens):
    """The cache [pages, page_size, heads, dim] after the scatter of ``rows`` [T, heads, dim]; float64."""
    want = np.array(poison, dtype=np.float64, copy=True)
    for t in range(tokens):
        if t < len(slots) and slots[t] >= 0:
            want[slots[t] // PAGE_SIZE, slots[t] % PAGE_SIZE] = rows[t]
    return want


def check_cache(got, want, dtype, what):
    """Rows written match the reference within the dtype's tolerance; untouched rows are NaN still."""
    got = np.asarray(got, dtype=np.float64)
    poisoned = np.isnan(want)
    assert np.array_equal(np.isnan(got), poisoned), f"{what}: written where it should not, or not written"
    rel, mx = TOLERANCE[dtype]
    if (~poisoned).any():
        assert max_abs(got[~poisoned], want[~poisoned]) <= mx, what


def inputs(dtype, seed):
    dt = numpy_dtype(dtype)
    return (random_array((TOKENS, HEADS, DIM), dtype, seed), random_array((TOKENS, KV_HEADS, DIM), dtype, seed + 1),
            random_array((TOKENS, KV_HEADS, DIM), dtype, seed + 2), dt)


def cache_views(layout, dt):
    """(k_cache, v_cache, kv_layout, owner): the two caches as rope.append_kv takes them, NaN-poisoned, and a
    function giving both back in NHD order [pages, page_size, heads, dim]."""
    if layout == "nhd":
        k_cache, v_cache = (np.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), np.nan, dt) for _ in range(2))
        return k_cache, v_cache, "nhd", lambda: (k_cache, v_cache)
    if layout == "hnd":
        k_cache, v_cache = (np.full((PAGES, KV_HEADS, PAGE_SIZE, DIM), np.nan, dt) for _ in range(2))
        return k_cache, v_cache, "hnd", lambda: (k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3))
    if layout == "nhd-transposed":  # an HND buffer seen through a permuted (any-strides) NHD view
        buffer = np.full((2, PAGES, KV_HEADS, PAGE_SIZE, DIM), np.nan, dt)
        k_cache, v_cache = buffer[0].transpose(0, 2, 1, 3), buffer[1].transpose(0, 2, 1, 3)
        return k_cache, v_cache, "nhd", lambda: (k_cache, v_cache)
    # packed [K|V]: [pages, page_size, heads, 2, dim], head stride 2 * dim
    buffer = np.full((PAGES, PAGE_SIZE, KV_HEADS, 2, DIM), np.nan, dt)
    k_cache, v_cache = buffer[:, :, :, 0, :], buffer[:, :, :, 1, :]
    return k_cache, v_cache, "nhd", lambda: (k_cache, v_cache)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["nhd", "hnd", "nhd-transposed", "packed"])
def test_scatter_against_oracle(backend, dtype, layout):
    q, k, v, dt = inputs(dtype, 10)
    q0, k0, v0 = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    # Token 2 is padding (-1); tokens 5 and 6 lie beyond the slot list: rotated, never cached.
    slots = permuted_slots(TOKENS, 3)[:5].copy()
    slots[2] = -1
    k_cache, v_cache, kv_layout, nhd = cache_views(layout, dt)
    rope.append_kv(q, k, v, CONFIG, POSITIONS, slots, k_cache, v_cache, kv_layout=kv_layout, backend=backend)

    want_q, want_k = rotated(q0, POSITIONS), rotated(k0, POSITIONS)
    rel, mx = TOLERANCE[dtype]
    assert max_abs(q, want_q) <= mx and relative_l2(q, want_q) <= rel  # q rotated in place
    assert max_abs(k, want_k) <= mx and relative_l2(k, want_k) <= rel  # k written back, padding included
    poison = np.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), np.nan)
    got_k, got_v = nhd()
    check_cache(got_k, expected_cache(poison, want_k, slots, TOKENS), dtype, "k_cache")
    check_cache(got_v, expected_cache(poison, v0, slots, TOKENS), dtype, "v_cache")
    assert np.array_equal(np.asarray(got_v, np.float64)[slots[0] // PAGE_SIZE, slots[0] % PAGE_SIZE], v0[0])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_cached_k_equals_written_back_k_and_out(backend):
    """k_out (the live key) and the cached row are the same bits; q and k untouched with out=."""
    q, k, v, dt = inputs("float32", 20)
    q_in, k_in = q.copy(), k.copy()
    q_out, k_out = np.full_like(q, np.nan), np.full_like(k, np.nan)
    k_cache, v_cache, _, _ = cache_views("nhd", dt)
    slots = permuted_slots(TOKENS, 4)
    rope.append_kv(q, k, v, CONFIG, 40, slots, k_cache, v_cache, out=(q_out, k_out), backend=backend)
    assert np.array_equal(q, q_in) and np.array_equal(k, k_in)
    assert max_abs(k_out, rotated(k_in, np.arange(40, 40 + TOKENS))) <= TOLERANCE["float32"][1]
    for t, s in enumerate(slots):
        assert np.array_equal(k_cache[s // PAGE_SIZE, s % PAGE_SIZE], k_out[t])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_angle_is_the_position_not_the_slot(backend):
    """The same slots with other positions give other cached keys; the same positions on other slots the same."""
    q, k, v, dt = inputs("float32", 30)
    caches = []
    for positions, slots in ((POSITIONS, np.arange(TOKENS)), (POSITIONS + 7, np.arange(TOKENS)),
                             (POSITIONS, np.arange(TOKENS) + PAGE_SIZE)):
        k_cache, v_cache, _, _ = cache_views("nhd", dt)
        rope.append_kv(q.copy(), k.copy(), v, CONFIG, positions, slots, k_cache, v_cache, backend=backend)
        caches.append(k_cache.reshape(-1, KV_HEADS, DIM)[slots])
    assert not np.allclose(caches[0], caches[1])
    assert np.array_equal(caches[0], caches[2])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_mla_cache(backend):
    """DeepSeek's MLA buffer [pages, page_size, L + R]: latent kv_c first, then the rotated k_pe."""
    latent, rope_dim = 32, 16
    config = rope.Config(head_dim=rope_dim, base=10000.0, style="gptj")
    buffer = np.full((PAGES, PAGE_SIZE, latent + rope_dim), np.nan, np.float32)
    q_pe = random_array((TOKENS, 3, rope_dim), "float32", 40)
    k_pe = random_array((TOKENS, 1, rope_dim), "float32", 41)
    kv_c = random_array((TOKENS, 1, latent), "float32", 42)
    k0 = k_pe.astype(np.float64)
    slots = permuted_slots(TOKENS, 5)
    slots[4] = -1
    rope.append_kv(q_pe, k_pe, kv_c, config, POSITIONS, slots, buffer[..., latent:], buffer[..., :latent],
                   backend=backend)
    want_k = rotated(k0, POSITIONS, rope_dim, "gptj")
    for t, s in enumerate(slots):
        row = buffer[s // PAGE_SIZE, s % PAGE_SIZE] if s >= 0 else None
        if row is not None:
            assert np.array_equal(row[:latent], kv_c[t, 0])
            assert max_abs(row[latent:], want_k[t, 0]) <= TOLERANCE["float32"][1]
    assert np.isnan(buffer).sum() == (PAGES * PAGE_SIZE - (TOKENS - 1)) * (latent + rope_dim)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_cache_bit_exact(backend, fmt, per_head):
    """Codes equal the independent nearest-code reference of value / scale (the value: k_out, float32, the very
    value rope quantises; v as given); large values saturate at +-max with scale != 1."""
    q, k, v, _ = inputs("float32", 50)
    scale_factor = 3.0 if fmt == "e4m3fn" else 0.002
    largest = 448.0 if fmt == "e4m3fn" else 57344.0
    k *= 3.0 * largest * scale_factor  # some elements beyond largest * scale: saturated
    v *= 3.0 * largest * scale_factor
    poison = 0x5A
    k_cache = np.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), poison, np.uint8)
    v_cache = k_cache.copy()
    k_scale = np.array([scale_factor * 0.7, scale_factor * 1.3] if per_head else [scale_factor], np.float32)
    v_scale = np.array([scale_factor * 1.1, scale_factor * 0.9] if per_head else [scale_factor * 1.7], np.float32)
    slots = permuted_slots(TOKENS, 6)[:6].copy()
    slots[1] = -1
    rope.append_kv(q, k, v, CONFIG, POSITIONS, slots, k_cache, v_cache, cache_dtype=fmt, k_scale=k_scale,
                   v_scale=v_scale, backend=backend)
    scales = (lambda s: s.reshape(-1, 1) if per_head else s)
    saturated = 0
    for t, s in enumerate(slots):
        if s < 0:
            continue
        page, row = s // PAGE_SIZE, s % PAGE_SIZE
        assert np.array_equal(k_cache[page, row], quantize_scaled(k[t], scales(k_scale), fmt)), (t, fmt)
        assert np.array_equal(v_cache[page, row], quantize_scaled(v[t], scales(v_scale), fmt)), (t, fmt)
        saturated += int(np.sum((v_cache[page, row] & 0x7F) == (0x7E if fmt == "e4m3fn" else 0x7B)))
    assert saturated > 0  # the saturation was exercised
    written = np.zeros(PAGES * PAGE_SIZE, bool)
    written[slots[slots >= 0]] = True
    assert np.all(k_cache.reshape(PAGES * PAGE_SIZE, -1)[~written] == poison)
    assert np.all(v_cache.reshape(PAGES * PAGE_SIZE, -1)[~written] == poison)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_slot_mapping_from_block_table_feeds_append(backend):
    """flash-attn's page metadata through rope.slot_mapping_from_block_table, then append_kv: each request's
    new tokens land at the rows its block table names, rotated at the positions after its cached tokens."""
    block_table = np.array([[4, 1, 0], [2, 5, 3]])          # request b's pages, in order
    cache_seqlens = np.array([5, 2])                         # tokens already cached
    cu_seqlens_q = np.array([0, 3, 7])                       # this step: 3 and 4 new tokens
    slots = rope.slot_mapping_from_block_table(block_table, cache_seqlens, cu_seqlens_q, page_size=PAGE_SIZE,
                                               pages=PAGES)
    positions = np.concatenate([np.arange(5, 8), np.arange(2, 6)])  # the angle: position in its request
    q, k, v, dt = inputs("float32", 45)
    k0 = k.astype(np.float64)
    k_cache, v_cache, _, _ = cache_views("nhd", dt)
    rope.append_kv(q, k, v, CONFIG, positions, slots, k_cache, v_cache, backend=backend)
    want_k = rotated(k0, positions)
    for t, (b, position) in enumerate([(0, 5), (0, 6), (0, 7), (1, 2), (1, 3), (1, 4), (1, 5)]):
        page, row = block_table[b, position // PAGE_SIZE], position % PAGE_SIZE  # written from the definition
        assert max_abs(k_cache[page, row], want_k[t]) <= TOLERANCE["float32"][1], t
        assert np.array_equal(v_cache[page, row], v[t]), t
    assert np.isnan(k_cache).sum() == (PAGES * PAGE_SIZE - TOKENS) * KV_HEADS * DIM


def test_fp8_reference_saturates():
    """The test's own reference: the boundaries the issue names (448/464/465, 57344/61440), NaN, inf, subnormals."""
    from fp8_oracle import quantize
    x = np.array([448, 464, 465, 1e6, np.inf, -np.inf, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10], np.float32)
    assert list(quantize(x, "e4m3fn")) == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x01, 0x00, 0x01]
    y = np.array([57344, 61440, 1e6, np.inf, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -17], np.float32)
    assert list(quantize(y, "e5m2")) == [0x7B, 0x7B, 0x7B, 0x7B, 0x01, 0x00, 0x02]
    assert quantize(np.array([np.nan], np.float32), "e4m3fn")[0] & 0x7F == 0x7F
    assert quantize(np.array([np.nan], np.float32), "e5m2")[0] & 0x7F == 0x7E


@pytest.mark.parametrize("case, message", [
    (dict(slot_mapping=[0, PAGES * PAGE_SIZE]), "slot_mapping.slots[1]"),
    (dict(slot_mapping=[3, 3]), "slot_mapping.slots[1]"),
    (dict(slot_mapping=list(range(TOKENS + 1))), "slot_mapping.count"),
    (dict(slot_mapping=[0.0, 1.0]), "slot_mapping"),
    (dict(kv_layout="nchw"), "kv_layout"),
    (dict(page_size=PAGE_SIZE + 1), "page_size"),
    (dict(k_cache="uint8"), "k_cache.dtype"),
    (dict(k_cache="float16"), "k_cache.dtype"),
    (dict(k_cache="fp8-no-scale"), "k_scale"),
    (dict(k_cache="heads"), "k_cache.heads"),
    (dict(k_scale=1.0), "k_scale"),
    (dict(k_cache="fp8", k_scale=0.0), "k_scale = 0.0: must be finite and > 0"),
    (dict(k_cache="fp8", k_scale=-0.5), "k_scale = -0.5"),
    (dict(k_cache="fp8", k_scale=float("nan")), "k_scale = nan"),
    (dict(k_cache="fp8", v_scale=float("inf")), "v_scale = inf"),
    (dict(k_cache="fp8", v_scale=1e39), "v_scale = 1e.39: must be finite"),  # Not a float32 (. for the +).
    (dict(k_cache="fp8", k_scale=1e-50), "k_scale = 1e-50: must be finite and > 0"),  # 0 as a float32.
    (dict(positions=[1, 2]), "positions"),
    (dict(cache_dtype="e3m4"), "cache_dtype"),
])
def test_bad_input_named_and_nothing_written(case, message):
    q, k, v, dt = inputs("float32", 60)
    q_in, k_in = q.copy(), k.copy()
    k_cache, v_cache, _, _ = cache_views("nhd", dt)
    kind = case.pop("k_cache", None)
    if kind in ("uint8", "fp8-no-scale", "fp8"):
        k_cache = np.zeros(k_cache.shape, np.uint8)
        v_cache = np.zeros(k_cache.shape, np.uint8)
        if kind != "uint8":
            case["cache_dtype"] = "e4m3fn"
        if kind == "fp8":  # One scale bad, the other good.
            case.setdefault("k_scale", 1.0)
            case.setdefault("v_scale", 1.0)
    elif kind == "float16":
        k_cache = np.full(k_cache.shape, np.nan, np.float16)
    elif kind == "heads":
        k_cache = np.full((PAGES, PAGE_SIZE, KV_HEADS + 1, DIM), np.nan, np.float32)
    arguments = dict(positions=POSITIONS, slot_mapping=[0, 1])
    arguments.update(case)
    k_before, v_before = k_cache.copy(), v_cache.copy()
    with pytest.raises(rope.Error, match=message.replace("[", r"\[").replace("]", r"\]")):
        rope.append_kv(q, k, v, CONFIG, arguments.pop("positions"), arguments.pop("slot_mapping"), k_cache, v_cache,
                       **arguments)
    assert np.array_equal(q, q_in) and np.array_equal(k, k_in)
    assert np.array_equal(k_cache, k_before, equal_nan=k_cache.dtype != np.uint8)
    assert np.array_equal(v_cache, v_before, equal_nan=v_cache.dtype != np.uint8)


# --- An FP8 output of the rotated q (out=(q_out, k_out), q_out FP8) --------------------------------
FP8_Q_SCALE = {"e4m3fn": 3.0, "e5m2": 0.002}   # != 1; e5m2's small so its 57344 saturates too
FP8_LARGEST = {"e4m3fn": 448.0, "e5m2": 57344.0}
FP8_SATURATED = {"e4m3fn": 0x7E, "e5m2": 0x7B}   # +max's code (the sign bit aside)


def fp8_q_inputs(fmt, seed):
    """q (float32, scaled so that some rotated elements pass largest * scale: saturated), k, v and the float64
    oracle rotation of q at POSITIONS."""
    q, k, v, _ = inputs("float32", seed)
    q *= np.float32(3.0 * FP8_LARGEST[fmt] * FP8_Q_SCALE[fmt])
    return q, k, v, rotated(q.astype(np.float64), POSITIONS)


def fp8_q_scales(fmt, per_head):
    """float32 scales: one, or one per q head (all != 1)."""
    base = FP8_Q_SCALE[fmt]
    return np.array([base * f for f in (0.7, 1.3, 1.0, 0.9)] if per_head else [base], np.float32)


def fp8_q_matches(codes, want, scale, fmt):
    """Whether FP8 ``codes`` [T, H, D] are the codes of the float64 rotation ``want`` with dequantisation
    ``scale`` ([1] or [H]): each decoded code within [code(want - d), code(want + d)], d the float32 tolerance
    (TOLERANCE's max_abs, for values of magnitude 1) times the magnitude of the element's rotation pair (an angle
    error moves an element by the size of its partner), and nearly all codes the nearest one itself."""
    scale = np.asarray(scale, np.float32).reshape(-1, 1) if np.size(scale) > 1 else np.float32(np.ravel(scale)[0])
    half = want.shape[-1] // 2
    partner = np.concatenate([want[..., half:], want[..., :half]], axis=-1)  # neox pairs d with d + D/2
    delta = TOLERANCE["float32"][1] * (np.abs(want) + np.abs(partner))
    table = decode(fmt)
    got = table[np.asarray(codes)]
    low, high = table[quantize_scaled(want - delta, scale, fmt)], table[quantize_scaled(want + delta, scale, fmt)]
    exact = np.asarray(codes) == quantize_scaled(want, scale, fmt)
    return bool(np.all((low <= got) & (got <= high)) and exact.mean() >= 0.98)


def check_fp8_q(codes, want, scale, fmt):
    codes = np.asarray(codes)
    assert codes.dtype == np.uint8 and codes.shape == want.shape
    assert fp8_q_matches(codes, want, scale, fmt), fmt
    assert np.any((codes & 0x7F) == FP8_SATURATED[fmt]), "the saturation was not exercised"


def test_fp8_q_check_tells_right_codes_from_wrong():
    """The check itself: the reference's codes pass; one code off where no boundary is near fails."""
    want = rotated(random_array((TOKENS, HEADS, DIM), "float32", 140).astype(np.float64), POSITIONS)
    codes = quantize_scaled(want, 0.01, "e4m3fn")
    assert fp8_q_matches(codes, want, 0.01, "e4m3fn")
    wrong = codes.copy()
    wrong[np.unravel_index(np.argmax(np.abs(want)), want.shape)] ^= 1  # the neighbouring mantissa, far from 0
    assert not fp8_q_matches(wrong, want, 0.01, "e4m3fn")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_q_out_numpy_uint8(backend, fmt, per_head):
    """NumPy: q_out uint8 with q_out_dtype; every token gets its row (padding and tokens past the slot list
    too), q is left as it was, k goes to k_out and the caches as without the FP8 output."""
    q, k, v, want_q = fp8_q_inputs(fmt, 120)
    q_in, k0 = q.copy(), k.astype(np.float64)
    q_out = np.full((TOKENS, HEADS, DIM), 0x5A, np.uint8)
    k_out = np.full_like(k, np.nan)
    k_cache, v_cache, _, _ = cache_views("nhd", np.float32)
    slots = permuted_slots(TOKENS, 13)[:5].copy()
    slots[1] = -1
    q_scale = fp8_q_scales(fmt, per_head)
    result = rope.append_kv(q, k, v, CONFIG, POSITIONS, slots, k_cache, v_cache, out=(q_out, k_out),
                            q_out_dtype=fmt, q_scale=q_scale, backend=backend)
    assert result[0] is q_out and result[1] is k_out
    assert np.array_equal(q, q_in)  # q unchanged
    check_fp8_q(q_out, want_q, q_scale, fmt)
    want_k = rotated(k0, POSITIONS)
    assert max_abs(k_out, want_k) <= TOLERANCE["float32"][1]
    poison = np.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), np.nan)
    check_cache(k_cache, expected_cache(poison, want_k, slots, TOKENS), "float32", "k_cache")


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_q_out_python_float_scale_and_k_in_place(backend, fmt):
    """q_scale a Python float; out=(q_out, k): k rotated in place, FP8 caches beside an FP8 q."""
    q, k, v, want_q = fp8_q_inputs(fmt, 125)
    q_in, k0 = q.copy(), k.astype(np.float64)
    q_out = np.zeros((TOKENS, HEADS, DIM), np.uint8)
    k_cache = np.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), 0x5A, np.uint8)
    v_cache = k_cache.copy()
    slots = permuted_slots(TOKENS, 14)
    rope.append_kv(q, k, v, CONFIG, POSITIONS, slots, k_cache, v_cache, cache_dtype=fmt, k_scale=0.01,
                   v_scale=0.02, out=(q_out, k), q_out_dtype=fmt, q_scale=FP8_Q_SCALE[fmt] * 1.5, backend=backend)
    assert np.array_equal(q, q_in)
    check_fp8_q(q_out, want_q, FP8_Q_SCALE[fmt] * 1.5, fmt)
    assert max_abs(k, rotated(k0, POSITIONS)) <= TOLERANCE["float32"][1]  # k in place
    for t, s in enumerate(slots):
        assert np.array_equal(k_cache[s // PAGE_SIZE, s % PAGE_SIZE], quantize_scaled(k[t], 0.01, fmt))


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_fp8_q_out_strided_slice_keeps_the_other_bytes(backend):
    """q_out a slice of a bigger buffer (token and head strides not dense): only its elements are written."""
    fmt, poison = "e4m3fn", 0xA5
    q, k, v, want_q = fp8_q_inputs(fmt, 130)
    buffer = np.full((TOKENS, HEADS + 1, 2 * DIM), poison, np.uint8)
    q_out = buffer[:, 1:, DIM:]
    assert q_out.strides == ((HEADS + 1) * 2 * DIM, 2 * DIM, 1)
    k_cache, v_cache, _, _ = cache_views("hnd", np.float32)
    q_scale = fp8_q_scales(fmt, True)
    rope.append_kv(q, k, v, CONFIG, POSITIONS, permuted_slots(TOKENS, 15), k_cache, v_cache, kv_layout="hnd",
                   out=(q_out, np.empty_like(k)), q_out_dtype=fmt, q_scale=q_scale, backend=backend)
    check_fp8_q(q_out, want_q, q_scale, fmt)
    untouched = np.ones(buffer.shape, bool)
    untouched[:, 1:, DIM:] = False
    assert np.all(buffer[untouched] == poison)


@pytest.mark.parametrize("case, message", [
    (dict(q_out="shape"), "q_out.shape"),
    (dict(q_out="ndim"), "q_out.ndim"),
    (dict(q_out="float16"), "q_out.dtype"),
    (dict(q_out="uint8", q_out_dtype=None), "q_out.dtype = uint8: is an FP8 q_out only with its format named"),
    (dict(q_out_dtype="e3m4"), "q_out_dtype"),
    (dict(q_scale=None), "q_scale = None"),
    (dict(q_scale=float("nan")), "q_scale = nan: must be finite and > 0"),
    (dict(q_scale=float("inf")), "q_scale = inf"),
    (dict(q_scale=0.0), "q_scale = 0.0"),
    (dict(q_scale=1e39), "q_scale = 1e.39"),
    (dict(q_scale=np.array([1.0], np.float64)), "q_scale.dtype"),
    (dict(q_scale=np.array([1.0, np.nan, 1.0, 1.0], np.float32)), r"q_out_fp8.scale\[1\] = nan"),
    (dict(q_scale=np.ones(3, np.float32)), "q_out_fp8.scale_count = 3"),
    (dict(q_out="overlapping"), "q_out_fp8.strides"),
    (dict(q_out="none", q_scale=1.0, q_out_dtype=None), "q_scale = set: is read only with an FP8 q_out"),
    (dict(q_out="float32", q_scale=1.0, q_out_dtype=None), "q_scale = set: is read only with an FP8 q_out"),
    (dict(q_out="none", q_scale=None), "q_out_dtype = e4m3fn: names the format of an FP8 q_out"),
])
def test_fp8_q_out_bad_input_named_and_nothing_written(case, message):
    q, k, v, _ = inputs("float32", 150)
    q_in, k_in = q.copy(), k.copy()
    k_cache, v_cache, _, _ = cache_views("nhd", np.float32)
    kind = case.pop("q_out", "good")
    q_out = {"good": np.full((TOKENS, HEADS, DIM), 0x5A, np.uint8),
             "shape": np.full((TOKENS, HEADS - 1, DIM), 0x5A, np.uint8),
             "ndim": np.full((TOKENS, HEADS * DIM), 0x5A, np.uint8),
             "float16": np.zeros((TOKENS, HEADS, DIM), np.float16),
             "float32": np.zeros((TOKENS, HEADS, DIM), np.float32),
             "uint8": np.full((TOKENS, HEADS, DIM), 0x5A, np.uint8),
             "overlapping": np.lib.stride_tricks.as_strided(np.full(TOKENS * DIM, 0x5A, np.uint8),
                                                            (TOKENS, HEADS, DIM), (DIM, 0, 1)),
             "none": None}[kind]
    arguments = dict(q_scale=np.float32(2.0), q_out_dtype="e4m3fn")
    arguments.update(case)
    out = None if q_out is None else (q_out, np.full_like(k, np.nan))
    before = None if q_out is None else q_out.copy()
    with pytest.raises(rope.Error, match=message):
        rope.append_kv(q, k, v, CONFIG, POSITIONS, [0, 1], k_cache, v_cache, out=out, **arguments)
    assert np.array_equal(q, q_in) and np.array_equal(k, k_in)
    assert np.isnan(k_cache).all() and np.isnan(v_cache).all()
    if q_out is not None:
        assert np.array_equal(q_out, before) and np.isnan(out[1]).all()


# --- The PyTorch operator ------------------------------------------------------------------------
torch = pytest.importorskip("torch", reason="torch.ops.rope.append_kv_ needs PyTorch")


def torch_inputs(seed, device="cpu"):
    q, k, v, _ = inputs("float32", seed)
    return tuple(torch.from_numpy(x).to(device) for x in (q, k, v))


def test_operator_equals_numpy_call_and_mutates_in_place():
    import rope.ops
    q, k, v = torch_inputs(70)
    k_cache = torch.full((PAGES, KV_HEADS, PAGE_SIZE, DIM), float("nan"))
    v_cache = k_cache.clone()
    slots = torch.from_numpy(permuted_slots(5, 7))
    versions = [t._version for t in (q, k, k_cache, v_cache)]
    want = [x.numpy().copy() for x in (q, k)]
    want_k_cache, want_v_cache, _, nhd = cache_views("hnd", np.float32)
    rope.append_kv(*want, v.numpy(), CONFIG, POSITIONS, slots.numpy(), want_k_cache, want_v_cache, kv_layout="hnd")
    rope.ops.append_kv_(q, k, v, CONFIG, torch.from_numpy(POSITIONS), slots, k_cache, v_cache, kv_layout="hnd")
    assert np.array_equal(q.numpy(), want[0]) and np.array_equal(k.numpy(), want[1])
    assert np.array_equal(k_cache.numpy(), want_k_cache, equal_nan=True)
    assert np.array_equal(v_cache.numpy(), want_v_cache, equal_nan=True)
    assert all(t._version > before for t, before in zip((q, k, k_cache, v_cache), versions))


def test_operator_opcheck():
    """PyTorch's own check of a custom operator: schema (the declared mutations), fake implementation,
    dispatch under functionalization and autograd."""
    import rope.ops
    q, k, v = torch_inputs(75)
    k_cache = torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan"))
    arguments = (q, k, v, k_cache, k_cache.clone(), torch.from_numpy(permuted_slots(TOKENS, 11)), CONFIG.key, 0,
                 torch.from_numpy(POSITIONS), None, None, None, "nhd", "", "", 0, None, None, "")
    torch.library.opcheck(torch.ops.rope.append_kv_.default, arguments,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_operator_compiles_without_graph_break():
    import rope.ops
    q, k, v = torch_inputs(80)
    positions = torch.from_numpy(POSITIONS)
    slots = torch.from_numpy(permuted_slots(TOKENS, 8))
    buffer = torch.full((PAGES, PAGE_SIZE, KV_HEADS, 2, DIM), float("nan"))  # packed [K|V]

    def step(q, k, v, buffer):
        q = q * 2.0  # work on both sides of the call: the mutation must be ordered between them
        rope.ops.append_kv_(q, k, v, CONFIG, positions, slots, buffer[..., 0, :], buffer[..., 1, :])
        return q + 1.0, k * 3.0

    eager_args = [q.clone(), k.clone(), v, buffer.clone()]
    compiled_args = [q.clone(), k.clone(), v, buffer.clone()]
    want = step(*eager_args)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*compiled_args)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert torch.equal(eager_args[1], compiled_args[1])  # k written back through the compiled graph
    assert torch.equal(eager_args[3].nan_to_num(7.0), compiled_args[3].nan_to_num(7.0))
    assert not torch.isnan(compiled_args[3].view(PAGES * PAGE_SIZE, -1)[slots]).any()


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_operator_float8_cache(fmt):
    import rope.ops
    q, k, v = torch_inputs(90)
    dtype = torch.float8_e4m3fn if fmt == "e4m3fn" else torch.float8_e5m2
    k_cache = torch.zeros(PAGES, PAGE_SIZE, KV_HEADS, DIM, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    k_scale, v_scale = torch.tensor([0.01, 0.02]), torch.tensor([0.003])
    slots = torch.from_numpy(permuted_slots(TOKENS, 9))
    rope.ops.append_kv_(q, k, v, CONFIG, 0, slots, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale)
    codes_k, codes_v = k_cache.view(torch.uint8).numpy(), v_cache.view(torch.uint8).numpy()
    for t, s in enumerate(slots.tolist()):
        page, row = s // PAGE_SIZE, s % PAGE_SIZE
        assert np.array_equal(codes_k[page, row], quantize_scaled(k[t].numpy(), k_scale.numpy()[:, None], fmt))
        assert np.array_equal(codes_v[page, row], quantize_scaled(v[t].numpy(), v_scale.numpy(), fmt))


def test_operator_bad_input_is_rope_error():
    import rope.ops
    q, k, v = torch_inputs(95)
    k_cache = torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan"))
    with pytest.raises(rope.Error, match="v_cache"):
        rope.ops.append_kv_(q, k, v, CONFIG, 0, torch.tensor([0, 1]), k_cache, k_cache[:, :, :1])
    assert torch.isnan(k_cache).all()


FP8_TORCH = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def fp8_q_torch_inputs(fmt, seed, device="cpu"):
    q, k, v, want_q = fp8_q_inputs(fmt, seed)
    return tuple(torch.from_numpy(x).to(device) for x in (q, k, v)) + (want_q,)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_q_out_torch_float8(fmt, per_head):
    """rope.append_kv with a torch.float8 q_out (its format from its dtype; q_out_dtype naming the same is
    accepted): out is returned as given."""
    q, k, v, want_q = fp8_q_torch_inputs(fmt, 160)
    q_in = q.clone()
    q_out = torch.zeros(TOKENS, HEADS, DIM, dtype=getattr(torch, FP8_TORCH[fmt]))
    k_out = torch.full_like(k, float("nan"))
    q_scale = torch.from_numpy(fp8_q_scales(fmt, per_head))
    k_cache, v_cache = (torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan")) for _ in range(2))
    result = rope.append_kv(q, k, v, CONFIG, torch.from_numpy(POSITIONS), torch.from_numpy(permuted_slots(6, 16)),
                            k_cache, v_cache, out=(q_out, k_out), q_scale=q_scale,
                            q_out_dtype=fmt if per_head else None)
    assert result[0] is q_out and result[1] is k_out
    assert torch.equal(q, q_in)
    check_fp8_q(q_out.view(torch.uint8).numpy(), want_q, q_scale.numpy(), fmt)


def test_fp8_q_out_dtype_disagreeing_with_float8_tensor():
    q, k, v, _ = fp8_q_torch_inputs("e4m3fn", 165)
    q_out = torch.zeros(TOKENS, HEADS, DIM, dtype=torch.float8_e4m3fn)
    k_cache, v_cache = (torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan")) for _ in range(2))
    with pytest.raises(rope.Error, match="q_out_dtype = 'e5m2': disagrees with q_out.dtype torch.float8_e4m3fn"):
        rope.append_kv(q, k, v, CONFIG, 0, [0, 1], k_cache, v_cache, out=(q_out, torch.empty_like(k)), q_scale=1.0,
                       q_out_dtype="e5m2")
    assert (q_out.view(torch.uint8) == 0).all() and torch.isnan(k_cache).all()


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("holder", ["float8", "uint8"])
def test_operator_fp8_q_out(fmt, holder):
    """rope.ops.append_kv_ with q_out: returns (q_out, k); q unchanged (its version may move: the schema
    declares q written), k rotated in place, q_out's version moved; a uint8 q_out with q_out_dtype alike."""
    import rope.ops
    q, k, v, want_q = fp8_q_torch_inputs(fmt, 170)
    q_in, k0 = q.clone(), k.numpy().astype(np.float64)
    dtype = getattr(torch, FP8_TORCH[fmt]) if holder == "float8" else torch.uint8
    q_out = torch.zeros(TOKENS, HEADS, DIM, dtype=dtype)
    k_cache, v_cache = (torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan")) for _ in range(2))
    q_scale = torch.from_numpy(fp8_q_scales(fmt, True))
    version = q_out._version
    result = rope.ops.append_kv_(q, k, v, CONFIG, torch.from_numpy(POSITIONS), torch.from_numpy(permuted_slots(7, 17)),
                                 k_cache, v_cache, q_out=q_out, q_scale=q_scale,
                                 q_out_dtype=fmt if holder == "uint8" else None)
    assert result[0] is q_out and result[1] is k
    assert torch.equal(q, q_in) and q_out._version > version
    check_fp8_q(q_out.view(torch.uint8).numpy(), want_q, q_scale.numpy(), fmt)
    assert max_abs(k.numpy(), rotated(k0, POSITIONS)) <= TOLERANCE["float32"][1]


def test_operator_fp8_q_out_python_float_scale():
    import rope.ops
    q, k, v, want_q = fp8_q_torch_inputs("e4m3fn", 175)
    q_out = torch.zeros(TOKENS, HEADS, DIM, dtype=torch.float8_e4m3fn)
    k_cache, v_cache = (torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan")) for _ in range(2))
    rope.ops.append_kv_(q, k, v, CONFIG, torch.from_numpy(POSITIONS), torch.arange(TOKENS), k_cache, v_cache,
                        q_out=q_out, q_scale=4.5)
    check_fp8_q(q_out.view(torch.uint8).numpy(), want_q, 4.5, "e4m3fn")


@pytest.mark.parametrize("holder", ["float8", "uint8"])
def test_operator_fp8_q_out_opcheck(holder):
    """PyTorch's check of the operator with the optional mutated q_out (Tensor(a16!)?) and q_scale. Its schema
    check compares tensors with arithmetic PyTorch lacks for float8 on the CPU: run on the uint8 form."""
    import rope.ops
    q, k, v, _ = fp8_q_torch_inputs("e4m3fn", 180)
    k_cache = torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan"))
    q_out = torch.zeros(TOKENS, HEADS, DIM, dtype=torch.float8_e4m3fn if holder == "float8" else torch.uint8)
    arguments = (q, k, v, k_cache, k_cache.clone(), torch.from_numpy(permuted_slots(TOKENS, 18)), CONFIG.key, 0,
                 torch.from_numpy(POSITIONS), None, None, None, "nhd", "", "", 0, q_out, torch.tensor([3.0]),
                 "" if holder == "float8" else "e4m3fn")
    checks = ("test_faketensor", "test_aot_dispatch_dynamic") + (("test_schema",) if holder == "uint8" else ())
    torch.library.opcheck(torch.ops.rope.append_kv_.default, arguments, test_utils=checks)


def test_operator_fp8_q_out_compiles_without_graph_break():
    import rope.ops
    q, k, v, _ = fp8_q_torch_inputs("e4m3fn", 185)
    positions = torch.from_numpy(POSITIONS)
    slots = torch.from_numpy(permuted_slots(TOKENS, 19))
    q_scale = torch.tensor([2.0, 3.0, 4.0, 5.0])

    def step(q, k, v, k_cache, v_cache, q_out):
        q = q * 2.0  # work on both sides of the call: the write to q_out must be ordered between them
        q8, k = rope.ops.append_kv_(q, k, v, CONFIG, positions, slots, k_cache, v_cache, q_out=q_out,
                                    q_scale=q_scale)
        return q8.view(torch.uint8).to(torch.int32) + 1, q + 1.0, k * 3.0

    def fresh():
        cache = torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan"))
        return [q.clone(), k.clone(), v, cache, cache.clone(), torch.zeros(TOKENS, HEADS, DIM, dtype=torch.float8_e4m3fn)]

    eager_args, compiled_args = fresh(), fresh()
    want = step(*eager_args)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*compiled_args)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert torch.equal(eager_args[5].view(torch.uint8), compiled_args[5].view(torch.uint8))
    assert torch.equal(eager_args[0], compiled_args[0])  # q itself left as it was by both


@pytest.mark.parametrize("case, message", [
    (dict(q_out="float32"), "q_out.dtype = torch.float32: must be torch.float8_e4m3fn or float8_e5m2"),
    (dict(q_out="uint8"), "q_out.dtype = uint8: is an FP8 q_out only with its format named"),
    (dict(q_out_dtype="e5m2"), "q_out_dtype = 'e5m2': disagrees with q_out.dtype torch.float8_e4m3fn"),
    (dict(q_scale=None), "q_scale = None"),
    (dict(q_scale=float("nan")), "q_scale = nan"),
    (dict(q_out="none", q_scale=torch.tensor([1.0])), "q_scale = set"),
    (dict(q_out="shape"), "q_out.shape"),
])
def test_operator_fp8_q_out_bad_input(case, message):
    import rope.ops
    q, k, v = torch_inputs(190)
    q_in, k_in = q.clone(), k.clone()
    k_cache = torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan"))
    v_cache = k_cache.clone()
    kind = case.pop("q_out", "float8")
    q_out = {"float8": torch.zeros(TOKENS, HEADS, DIM, dtype=torch.float8_e4m3fn),
             "float32": torch.zeros(TOKENS, HEADS, DIM),
             "uint8": torch.zeros(TOKENS, HEADS, DIM, dtype=torch.uint8),
             "shape": torch.zeros(TOKENS - 1, HEADS, DIM, dtype=torch.float8_e4m3fn),
             "none": None}[kind]
    arguments = dict(q_out=q_out, q_scale=torch.tensor([1.0]))
    arguments.update(case)
    with pytest.raises(rope.Error, match=message):
        rope.ops.append_kv_(q, k, v, CONFIG, 0, torch.tensor([0, 1]), k_cache, v_cache, **arguments)
    assert torch.equal(q, q_in) and torch.equal(k, k_in) and torch.isnan(k_cache).all()
    if q_out is not None:
        assert (q_out.view(torch.uint8) == 0).all()


# --- CUDA: captured in a CUDA graph -------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not any(
    b.device == "cuda" and b.available for b in rope.list_backends()),
    reason="no CUDA device or no CUDA backend here: the CUDA graph capture of append_kv_ is not run")
def test_operator_cuda_graph_capture():
    import rope.ops
    q, k, v = torch_inputs(100, "cuda")
    positions = torch.from_numpy(POSITIONS).cuda()
    slots = torch.from_numpy(permuted_slots(TOKENS, 10)).cuda()
    k_cache = torch.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), float("nan"), device="cuda")
    v_cache = k_cache.clone()
    q_in, k_in = q.clone(), k.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        rope.ops.append_kv_(q, k, v, CONFIG, positions, slots, k_cache, v_cache)
    q.copy_(q_in)
    k.copy_(k_in)
    graph.replay()
    torch.cuda.synchronize()
    want_k = rotated(k_in.cpu().numpy(), POSITIONS)
    assert max_abs(k.cpu().numpy(), want_k) <= TOLERANCE["float32"][1]
    poison = np.full((PAGES, PAGE_SIZE, KV_HEADS, DIM), np.nan)
    check_cache(k_cache.cpu().numpy(), expected_cache(poison, want_k, slots.cpu().numpy(), TOKENS), "float32",
                "k_cache")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not any(
    b.device == "cuda" and b.available for b in rope.list_backends()),
    reason="no CUDA device or no CUDA backend here: rope.append_kv on CUDA tensors is not run")
@pytest.mark.parametrize("backend", [b.name for b in rope.list_backends() if b.device == "cuda"])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_append_against_reference(backend, fp8):
    """rope.append_kv on CUDA tensors (HND caches as a transposed view, a permuted page table, padding):
    k and the cache rows against float64, FP8 codes bit for bit against fp8_oracle of the written-back k."""
    q, k, v = torch_inputs(110, "cuda")
    k_in = k.cpu().numpy().astype(np.float64)
    slots = permuted_slots(TOKENS, 12)[:6].copy()
    slots[3] = -1
    dtype = torch.float8_e4m3fn if fp8 else torch.float32
    k_hnd = torch.full((PAGES, KV_HEADS, PAGE_SIZE, DIM), float("nan"), device="cuda").to(dtype)
    v_hnd = torch.full((PAGES, KV_HEADS, PAGE_SIZE, DIM), float("nan"), device="cuda").to(dtype)
    scales = dict(k_scale=torch.tensor([0.01], device="cuda"), v_scale=torch.tensor([0.02], device="cuda")) if fp8 \
        else {}
    rope.append_kv(q, k, v, CONFIG, torch.from_numpy(POSITIONS).cuda(), torch.from_numpy(slots).cuda(),
                   k_hnd.transpose(1, 2), v_hnd.transpose(1, 2), backend=backend, **scales)
    torch.cuda.synchronize()
    want_k = rotated(k_in, POSITIONS)
    got_k = k.cpu().numpy()
    assert max_abs(got_k, want_k) <= TOLERANCE["float32"][1]
    k_cache = k_hnd.transpose(1, 2).cpu()
    v_cache = v_hnd.transpose(1, 2).cpu()
    for t, s in enumerate(slots):
        if s < 0:
            continue
        page, row = s // PAGE_SIZE, s % PAGE_SIZE
        if fp8:
            assert np.array_equal(k_cache[page, row].view(torch.uint8).numpy(), quantize_scaled(got_k[t], 0.01, "e4m3fn"))
            assert np.array_equal(v_cache[page, row].view(torch.uint8).numpy(),
                                  quantize_scaled(v[t].cpu().numpy(), 0.02, "e4m3fn"))
        else:
            assert np.array_equal(k_cache[page, row].numpy(), got_k[t])
            assert np.array_equal(v_cache[page, row].numpy(), v[t].cpu().numpy())
    written = np.zeros(PAGES * PAGE_SIZE, bool)
    written[slots[slots >= 0]] = True
    untouched = k_cache.reshape(PAGES * PAGE_SIZE, -1)[torch.from_numpy(~written)]
    assert (untouched.view(torch.uint8) == 0x7F).all() if fp8 else torch.isnan(untouched).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not any(
    b.device == "cuda" and b.available for b in rope.list_backends()),
    reason="no CUDA device or no CUDA backend here: the FP8 q output on CUDA tensors is not run")
@pytest.mark.parametrize("backend", [b.name for b in rope.list_backends() if b.device == "cuda"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("cache_fp8", [False, True])
def test_cuda_fp8_q_out_against_reference(backend, fmt, cache_fp8):
    """rope.append_kv on CUDA tensors with a float8 q_out, a slice of a poisoned buffer, per-head scales on the
    device (FP8 caches of the same format take cuda-optimized's own kernel; model-dtype caches the generic one):
    codes against the oracle, q unchanged, the buffer's other bytes kept; rope.ops.append_kv_ alike."""
    import rope.ops
    q, k, v, want_q = fp8_q_torch_inputs(fmt, 200, "cuda")
    q_in = q.clone()
    dtype = getattr(torch, FP8_TORCH[fmt])
    buffer = torch.full((TOKENS, HEADS + 1, 2 * DIM), 0xA5, dtype=torch.uint8, device="cuda")
    q_out = buffer.view(dtype)[:, 1:, DIM:]
    q_scale = torch.from_numpy(fp8_q_scales(fmt, True)).cuda()
    cache_dtype = dtype if cache_fp8 else torch.float32
    k_cache, v_cache = (torch.zeros((PAGES, PAGE_SIZE, KV_HEADS, DIM), device="cuda").to(cache_dtype)
                        for _ in range(2))
    scales = dict(k_scale=torch.tensor([0.01], device="cuda"), v_scale=torch.tensor([0.02], device="cuda")) \
        if cache_fp8 else {}
    slots = torch.from_numpy(permuted_slots(5, 20)).cuda()
    positions = torch.from_numpy(POSITIONS).cuda()
    rope.append_kv(q, k, v, CONFIG, positions, slots, k_cache, v_cache, out=(q_out, k), q_scale=q_scale,
                   backend=backend, **scales)
    torch.cuda.synchronize()
    assert torch.equal(q, q_in)
    check_fp8_q(q_out.view(torch.uint8).cpu().numpy(), want_q, q_scale.cpu().numpy(), fmt)
    untouched = torch.ones(buffer.shape, dtype=torch.bool)
    untouched[:, 1:, DIM:] = False
    assert (buffer.cpu()[untouched] == 0xA5).all()
    if backend == "cuda-optimized":  # The operator picks the device's default backend.
        q_out2 = torch.zeros(TOKENS, HEADS, DIM, dtype=dtype, device="cuda")
        q, k, v, _ = fp8_q_torch_inputs(fmt, 200, "cuda")
        rope.ops.append_kv_(q, k, v, CONFIG, positions, slots, k_cache, v_cache, q_out=q_out2, q_scale=q_scale,
                            **scales)
        torch.cuda.synchronize()
        check_fp8_q(q_out2.view(torch.uint8).cpu().numpy(), want_q, q_scale.cpu().numpy(), fmt)
