"""rope.append_kv and torch.ops.rope.append_kv_ (RoPE + paged KV append) against a float64 NumPy reference.

The reference is written here: rotation from oracle.py (float64, independent of
rope), the scatter from the definition (token t with slot s >= 0, t < len(slots)
goes to page s // page_size, row s % page_size), FP8 codes from fp8_oracle.py
(nearest code, no library cast). Caches are poisoned with NaN (or a byte
pattern for FP8): a slot no token addresses must keep its poison bits.
"""

import numpy as np
import pytest

import rope
from conftest import HOST_BACKENDS, numpy_dtype, random_array
from fp8_oracle import quantize_scaled
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
                 torch.from_numpy(POSITIONS), None, None, None, "nhd", "", "", 0)
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
