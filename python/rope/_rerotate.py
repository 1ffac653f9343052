"""rope.rerotate: keys rotated at some positions, turned to others, through DLPack.

The C++ call (rope._rope.rerotate) checks and runs everything; this file adds
what rope.apply adds (the positions' Python forms, the caller's CUDA stream,
NumPy's bfloat16), with the same helpers.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from . import _rope
from ._apply import (_bfloat16_bits, _current_stream, _export_for_stream, _positions, _refuse_autograd,
                     _stream_handle)
from ._config import Config, _fail, _integer


def rerotate(k: Any, config: Config, from_positions: Union[int, Any], to_positions: Union[int, Any], *,
             backend: Optional[str] = None, out: Any = None, layout: Optional[str] = None,
             from_max_position: int = 0, to_max_position: int = 0, stream: Any = None) -> Any:
    """Turns keys rotated at ``from_positions`` into keys rotated at ``to_positions``.

    One rotation by angle(to) - angle(from) per pair, its angle formed as the
    precise mode forms one (the difference in double, rounded to float32
    once), whatever ``config.precise_angles`` says: one rotation's error at any
    position and distance, where successive corrections drift. Never scaled:
    rotated keys keep the attention factor they carry. ``to_positions`` all 0
    is the inverse (the raw keys, times the attention factor). Features past
    rotary_dim pass through untouched.

    Args:
        k: keys rotated at ``from_positions``: a NumPy array, PyTorch tensor or
            CuPy array, float32, float16 or bfloat16, on the host or a CUDA
            device, any strides; 4-D in ``layout`` order, or 3-D for "thd".
        config: the model's RoPE (rope.Config).
        from_positions: the positions k is rotated at: an int offset (token s at
            offset + s) or integer ids, [seq], [batch, seq], or with several axes
            (M-RoPE, axial) [axes, seq] or [axes, batch, seq], as rope.apply's positions.
        to_positions: the positions to rotate k to, in either form.
        backend: as rope.apply's (None: cuda-optimized for CUDA arrays, else cpu-eigen).
        out: where the re-rotated keys go (same sizes as k); None: in place.
        layout: "bhsd" (the default for 4-D), "bshd" or "thd" (the default for 3-D).
        from_max_position: largest position + 1 of ``from_positions``, needed with
            dynamic or longrope scaling when those ids live on a CUDA device.
        to_max_position: the same for ``to_positions``.
        stream: the CUDA stream to launch on, as rope.apply's (default: the
            current stream of the framework that made k).

    Returns:
        k re-rotated in place, or ``out``.

    Raises:
        rope.Error: (a ValueError) naming the offending argument and its value
            (from.ids[3], to.length, scaling.type when dynamic or longrope scaling
            gives the two sides different frequencies); nothing has been written.
    """
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    _refuse_autograd(k, "k")
    result = k if out is None else out
    from_offset, from_ids = _positions(from_positions, "from_positions")
    to_offset, to_ids = _positions(to_positions, "to_positions")
    if layout is None:
        layout = "thd" if getattr(k, "ndim", 4) == 3 else "bhsd"
    arrays = [k, out, from_ids, to_ids]
    if stream is not None:
        handle = _stream_handle(stream)
        arrays = [_export_for_stream(a, handle) for a in arrays]
    else:
        handle = _current_stream(k)
    arrays[0], k_bits = _bfloat16_bits(arrays[0])
    arrays[1], out_bits = _bfloat16_bits(arrays[1])
    k, out, from_ids, to_ids = arrays
    _rope.rerotate(backend or "", config._native, k, out, layout, from_offset, from_ids,
                   _integer("from_max_position", from_max_position), to_offset, to_ids,
                   _integer("to_max_position", to_max_position), handle, int(k_bits) | int(out_bits) << 2)
    return result


def rerotate_cache(k_cache: Any, config: Config, slot_mapping: Any, from_positions: Union[int, Any],
                   to_positions: Union[int, Any], *, backend: Optional[str] = None, kv_layout: str = "nhd",
                   from_max_position: int = 0, to_max_position: int = 0, stream: Any = None) -> Any:
    """Turns, in place, the rows of a paged key cache that ``slot_mapping`` names from
    ``from_positions`` to ``to_positions``: rope.rerotate for keys that live in a cache.

    Entry t with ``slot = slot_mapping[t] >= 0`` turns every head row of
    ``k_cache[slot // page_size, slot % page_size]`` as rope.rerotate turns token t
    of a key tensor (one rotation by the precise angle difference, never scaled);
    a slot < 0 is skipped, and every other element of the cache keeps its bytes.

    Args:
        k_cache: the key cache, as rope.append_kv's (4-D in ``kv_layout`` order, or
            3-D single-head; any strides, the last axis contiguous), float32, float16
            or bfloat16; FP8 caches are refused (turning them would round twice).
        config: the model's RoPE (rope.Config).
        slot_mapping: int64 slots [T] of the entries to turn: page * page_size +
            offset in page; < 0 skips the entry.
        from_positions: the positions the entries' keys are rotated at: an int
            offset (entry t at offset + t) or integer ids [T] ([axes, T] for M-RoPE).
        to_positions: the positions to turn them to, in either form.
        backend: as rope.apply's (None: cuda-optimized for CUDA arrays, else cpu-eigen).
        kv_layout: "nhd" ([pages, page_size, heads, head_dim]) or "hnd"
            ([pages, heads, page_size, head_dim]).
        from_max_position: largest position + 1 of ``from_positions``, needed with
            dynamic or longrope scaling when those ids live on a CUDA device.
        to_max_position: the same for ``to_positions``.
        stream: the CUDA stream to launch on, as rope.apply's.

    Returns:
        k_cache, its named rows re-rotated.

    Raises:
        rope.Error: (a ValueError) naming the offending argument and its value
            (slot_mapping.slots[3] out of range or used twice, k_cache.dtype of an
            FP8 cache, to.length, scaling.type); nothing has been written.
    """
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    _refuse_autograd(k_cache, "k_cache")
    result = k_cache
    from_offset, from_ids = _positions(from_positions, "from_positions")
    to_offset, to_ids = _positions(to_positions, "to_positions")
    arrays = [k_cache, slot_mapping, from_ids, to_ids]
    if stream is not None:
        handle = _stream_handle(stream)
        arrays = [_export_for_stream(a, handle) for a in arrays]
    else:
        handle = _current_stream(k_cache)
    arrays[0], cache_bits = _bfloat16_bits(arrays[0])
    k_cache, slot_mapping, from_ids, to_ids = arrays
    _rope.rerotate_cache(backend or "", config._native, k_cache, slot_mapping, kv_layout, from_offset, from_ids,
                         _integer("from_max_position", from_max_position), to_offset, to_ids,
                         _integer("to_max_position", to_max_position), handle, int(cache_bits))
    return result
