"""rope.append_kv: RoPE fused with the paged KV-cache append (a serving engine's decode step).

As rope.apply (``_apply.py``), this file adds only Python's business to the C++
call (rope._rope.append_kv): the forms of the positions, scales and slot
mapping, the framework's CUDA stream, NumPy's bfloat16, and FP8 caches and FP8
q outputs held as torch.float8 tensors (passed as their uint8 codes, with the
format named).
Everything else is checked by the C++ library, before anything is written.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import _rope
from ._apply import _bfloat16_bits, _current_stream, _export_for_stream, _index, _positions, _refuse_autograd, \
    _stream_handle
from ._config import Config, _fail, _integer

# torch.float8 dtype names and the cache format they hold.
_FP8_TORCH = {"float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2"}


def append_kv(q: Any, k: Any, v: Any, config: Config, positions: Union[None, int, Any], slot_mapping: Any,
              k_cache: Any, v_cache: Any, *, page_size: int = 0, kv_layout: str = "nhd",
              cache_dtype: Optional[str] = None, k_scale: Any = None, v_scale: Any = None,
              out: Optional[Tuple[Any, Any]] = None, cos_sin_cache: Any = None, max_position: int = 0,
              backend: Optional[str] = None, stream: Any = None, q_scale: Any = None,
              q_out_dtype: Optional[str] = None) -> Tuple[Any, Any]:
    """Rotates q and k by RoPE and appends the rotated k and the unrotated v to paged caches.

    For each token t: q[t] and k[t] are rotated at ``positions[t]`` (in place,
    or into ``out``); when ``t < len(slot_mapping)`` and ``slot = slot_mapping[t]
    >= 0``, the rotated k row (from float32, rounded once) goes to
    ``k_cache[slot // page_size, slot % page_size]`` and v's row to ``v_cache``
    at the same place. A token with slot -1, or past the end of the slot list,
    is padding: rotated, written to neither cache. The position is the angle
    only, never the slot: after eviction or compaction they differ. Cache
    elements no written slot addresses keep their bytes.

    With an FP8 ``q_out`` (``out=(q_out, k_out)``, q_out a torch.float8 tensor
    or a uint8 array with ``q_out_dtype``) the rotated q goes there alone, each
    element quantised from its float32 value as the caches' are (never first
    rounded to q's dtype), for an attention kernel that reads q in FP8; every
    token, padding too, gets its row, and q itself is left unchanged.

    Args:
        q: queries [tokens, heads, head_dim], float32, float16 or bfloat16 (a
            NumPy array, PyTorch tensor or CuPy array), any strides with the
            last axis contiguous; [tokens, 0, head_dim] appends k alone.
        k: keys [tokens, kv_heads, head_dim] (kv_heads dividing q's heads, GQA),
            q's dtype: rotated, written back (the live key attention reads next)
            and appended to ``k_cache``.
        v: values [tokens, kv_heads, v_head_dim], q's dtype: appended to ``v_cache`` unrotated.
        config: the model's RoPE (rope.Config; for MLA, head_dim = the rope part's).
        positions: each token's position (the angle): an int offset (tokens at
            offset, offset + 1, ...) or integer ids [tokens] (or [axes, tokens]
            for M-RoPE), any integer dtype, converted to int64 where needed.
        slot_mapping: integer slots [T_w <= tokens]: page * page_size + offset
            in page; < 0 is padding. rope.slot_mapping_from_flashinfer_indptr,
            _from_flashinfer_positions and _from_block_table make it from
            FlashInfer's and flash-attn's page metadata.
        k_cache, v_cache: the caches, any strides (the last axis contiguous):
            [pages, page_size, heads, head_dim] with kv_layout "nhd", or
            [pages, heads, page_size, head_dim] with "hnd"; a packed [K|V] buffer
            ``buf[pages, page_size, heads, 2, head_dim]`` as ``buf[..., 0, :]``
            and ``buf[..., 1, :]``; an MLA buffer ``[pages, page_size, L + R]``
            as ``buf[..., L:]`` (k_cache, rotated k_pe) and ``buf[..., :L]``
            (v_cache, the latent kv_c), 3-D arrays being single-head caches.
            The model's dtype, or FP8: torch.float8_e4m3fn / float8_e5m2
            tensors, or uint8 arrays with ``cache_dtype``.
        page_size: slots per page; 0 takes it from the caches' shape (else it must match).
        kv_layout: "nhd" or "hnd": the axis order of 4-D caches.
        cache_dtype: "e4m3fn" or "e5m2" for FP8 caches held as uint8 (both caches).
        k_scale, v_scale: FP8 caches: float32 dequantisation scales (value ~=
            fp8 * scale, as vLLM stores them; FlashInfer's quant_scale is 1 /
            scale), one per cache or one per head, on the cache's device; a
            Python float for a NumPy cache. Codes are
            round_to_nearest_even(saturate(value / scale)). A Python number
            must be finite and > 0 (checked here); scales in GPU memory are
            not read by the checks, and one that is not finite and > 0 writes
            NaN codes.
        out: (q_out, k_out) to rotate into; q and k are then only read (k_out
            may be k itself: k rotated in place). q_out is q's shape and dtype,
            or an FP8 output of the rotated q: [tokens, heads, head_dim] (any
            strides, the last axis contiguous), a torch.float8_e4m3fn /
            float8_e5m2 tensor, or a uint8 array (NumPy, PyTorch, CuPy) with
            ``q_out_dtype``, on q's device; q is then left unchanged.
        cos_sin_cache: a float32 [max_position, rotary_dim] table (see rope.apply).
        max_position: largest position + 1 (dynamic/longrope scaling with ids on a CUDA device).
        backend: as rope.apply's (default: by the arrays' device).
        stream: as rope.apply's.
        q_scale: an FP8 q_out's float32 dequantisation scales (value ~= fp8 *
            scale), one for the tensor or one per q head, on q_out's device, or
            a Python float (checked finite and > 0 here, then made a float32
            [1] array beside q_out). Codes are round_to_nearest_even(saturate(
            value / scale)). Required with an FP8 q_out, refused without one.
        q_out_dtype: "e4m3fn" or "e5m2" for an FP8 q_out held as uint8 (a
            torch.float8 q_out names its own; a different name is refused).

    Returns:
        (q, k) rotated in place, or ``out`` as given (with an FP8 q_out: its
        codes, and k_out).

    Raises:
        rope.Error: (a ValueError) naming the offending argument and its value
            (a slot out of range or used twice, a position past the table, a
            cache of another dtype, head count or head_dim, overlapping arrays,
            an FP8 q_out of another shape or dtype, a q_out_dtype disagreeing
            with a torch.float8 q_out, a missing or bad q_scale); nothing has
            been written.
    """
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    for name, array in (("q", q), ("k", k), ("v", v)):
        _refuse_autograd(array, name)
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise _fail("out", type(out).__name__, "must be a pair (q_out, k_out)")
    result = (q, k) if out is None else tuple(out)
    offset, ids = _positions(positions)
    if slot_mapping is None:
        raise _fail("slot_mapping", "None", "append_kv needs each token's cache slot (-1: padding)")
    slots = _index("slot_mapping", slot_mapping)
    q_out, k_out = (None, None) if out is None else out
    page_size = _integer("page_size", page_size)
    max_position = _integer("max_position", max_position)
    if cache_dtype is not None and cache_dtype not in ("e4m3fn", "e5m2"):
        raise _fail("cache_dtype", repr(cache_dtype), 'must be "e4m3fn", "e5m2" or None (the model\'s dtype)')
    k_cache, k_dtype = _cache("k_cache", k_cache, cache_dtype)
    v_cache, v_dtype = _cache("v_cache", v_cache, cache_dtype)
    k_scale = _scale("k_scale", k_scale, k_cache)
    v_scale = _scale("v_scale", v_scale, v_cache)
    if q_out_dtype is not None and q_out_dtype not in ("e4m3fn", "e5m2"):
        raise _fail("q_out_dtype", repr(q_out_dtype), 'must be "e4m3fn", "e5m2" or None (q\'s dtype)')
    q_out, q_dtype = _fp8_out(q_out, q_out_dtype)
    # Where the q_out the C++ side gets is not FP8 (None, or q's dtype), a scale is refused there.
    q_scale = _scale("q_scale", q_scale, q_out if q_out is not None else q)
    arrays = [q, k, q_out, k_out, v, k_cache, v_cache, ids, slots, k_scale, v_scale, cos_sin_cache, q_scale]

    if stream is not None:
        handle = _stream_handle(stream)
        arrays = [_export_for_stream(a, handle) for a in arrays]
    else:
        handle = _current_stream(q)
    bits = 0
    for operand in range(7):  # q, k, q_out, k_out, v, k_cache, v_cache: NumPy bfloat16 as its uint16 bits.
        arrays[operand], is_bf16 = _bfloat16_bits(arrays[operand])
        bits |= int(is_bf16) << operand
    q, k, q_out, k_out, v, k_cache, v_cache, ids, slots, k_scale, v_scale, cos_sin_cache, q_scale = arrays
    _rope.append_kv(backend or "", config._native, q, k, v, q_out, k_out, offset, ids, slots, k_cache, v_cache,
                    k_scale, v_scale, kv_layout, page_size, k_dtype, v_dtype, cos_sin_cache, max_position, handle,
                    bits, q_scale, q_dtype)
    return result


def _fp8_out(q_out: Any, q_out_dtype: Optional[str]) -> Tuple[Any, str]:
    """(q_out as rope reads it, its FP8 format or ""): a torch.float8 tensor as its uint8 codes.

    A uint8 q_out (or any with q_out_dtype named) is taken as FP8 by the C++ side, which checks it."""
    return _fp8_codes("q_out", q_out, q_out_dtype, "q_out_dtype")


def _cache(name: str, cache: Any, cache_dtype: Optional[str]) -> Tuple[Any, str]:
    """(the cache as rope reads it, its format): a torch.float8 tensor as its uint8 codes."""
    return _fp8_codes(name, cache, cache_dtype, "cache_dtype")


def _fp8_codes(name: str, array: Any, named: Optional[str], named_by: str) -> Tuple[Any, str]:
    """(array as rope reads it, its FP8 format or ""): a torch.float8 tensor becomes its uint8 codes and
    names its own format, which must agree with ``named`` (the argument ``named_by``) when that is given."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        fp8 = _FP8_TORCH.get(str(array.dtype).replace("torch.", ""))
        if fp8 is not None:
            if named is not None and named != fp8:
                raise _fail(named_by, repr(named), f"disagrees with {name}.dtype {array.dtype}")
            return array.view(torch.uint8), fp8
    return array, named or ""


def _scale(name: str, scale: Any, cache: Any) -> Any:
    """A float scale as a float32 [1] array beside ``cache``: NumPy's, or a tensor on the cache's device.

    Checked here, where it is still a Python number: on a GPU the library cannot read it, and a scale
    that is not finite and > 0 would write NaN codes."""
    if not isinstance(scale, (float, int, np.floating)) or isinstance(scale, bool):
        return scale
    with np.errstate(over="ignore", under="ignore"):
        single = np.float32(scale)  # What the kernel reads: 1e39 becomes inf, 1e-50 becomes 0.
    if not (math.isfinite(float(scale)) and np.isfinite(single) and single > 0):
        raise _fail(name, scale, "must be finite and > 0 as a float32 (the dequantisation scale)")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(cache, torch.Tensor):
        return torch.full((1,), float(scale), dtype=torch.float32, device=cache.device)
    return np.full(1, scale, dtype=np.float32)
