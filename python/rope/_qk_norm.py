"""rope.apply_qk_norm: fused QK-RMSNorm + RoPE on the caller's arrays (rope::apply_qk_norm).

Qwen3, Gemma 3 and OLMo 2 normalise q and k with an RMSNorm before RoPE. ``kind`` says
what is normalised and how the weight applies, ``rounding`` where results round to the
storage dtype: "float32" rounds once at the end; "hf_qwen3", "hf_gemma3" and "hf_olmo2"
round where each model's HuggingFace code rounds, so bf16 results are HF's bits.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _rope
from ._apply import (_bfloat16_bits, _current_stream, _export_for_stream, _positions, _refuse_autograd,
                     _stream_handle)
from ._config import Config, _fail, _integer

_KINDS = ("per_head", "per_head_gemma", "across_heads")
_ROUNDINGS = ("float32", "hf_qwen3", "hf_gemma3", "hf_olmo2")


def apply_qk_norm(q: Any, k: Any, q_weight: Any, k_weight: Any, config: Config,
                  positions: Union[None, int, Any] = None, *, kind: str = "per_head", rounding: str = "float32",
                  eps: float = 1e-6, out: Optional[Tuple[Any, Any]] = None, layout: Optional[str] = None,
                  cos_sin_cache: Any = None, backend: Optional[str] = None, stream: Any = None) -> Tuple[Any, Any]:
    """Normalises q and k with an RMSNorm, then rotates them by RoPE: in place, or into ``out``.

    Args:
        q: queries (NumPy, PyTorch, CuPy; float32, float16 or bfloat16), 4-D in ``layout``
            order or 3-D [tokens, heads, head_dim], as for rope.apply.
        k: keys, same batch, seq and head_dim as q.
        q_weight: q's norm weight, 1-D: head_dim values, or heads * head_dim for
            ``kind="across_heads"``; float32 or q's dtype.
        k_weight: k's norm weight, likewise.
        config: the model's RoPE (rope.Config): any scaling, axes, pairing, partial rotary.
        positions: None (0, 1, ...), an int offset, or integer ids, as for rope.apply.
        kind: "per_head" (``weight * x_hat``, Qwen3), "per_head_gemma" (``x_hat * (1 + weight)``,
            Gemma 3) or "across_heads" (mean over all heads of a token, OLMo 2).
        rounding: "float32" (float32 throughout, rounded once), or "hf_qwen3", "hf_gemma3",
            "hf_olmo2": rounded where that model's HuggingFace code rounds.
        eps: added to mean(x^2), in float32; > 0.
        out: (q_out, k_out), or None for in place.
        layout: "bhsd" (default for 4-D), "bshd" or "thd" (default for 3-D).
        cos_sin_cache: a float32 [rows, rotary_dim] table replacing rope's angles (as for rope.apply).
        backend: a backend name; None picks cuda-optimized for CUDA arrays, else cpu-eigen (or cpu-naive).
        stream: the CUDA stream (as for rope.apply).

    Returns:
        (q, k) normalised and rotated in place, or ``out``.

    Raises:
        rope.Error: (a ValueError) naming the offending argument and its value; nothing is written then.
    """
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise _fail("out", type(out).__name__, "must be a pair (q_out, k_out)")
    q_out, k_out = (None, None) if out is None else out
    if layout is None:
        layout = "thd" if getattr(q, "ndim", 4) == 3 else "bhsd"
    _call(config, [q, k, q_out, k_out, None, None, q_weight, k_weight], kind, rounding, eps, layout, positions,
          cos_sin_cache, backend, stream, 0, 0)
    return (q, k) if out is None else tuple(out)


def apply_qk_norm_packed(qkv: Any, q_heads: int, kv_heads: int, q_weight: Any, k_weight: Any, config: Config,
                         positions: Union[None, int, Any] = None, *, kind: str = "per_head",
                         rounding: str = "float32", eps: float = 1e-6, v_out: Any = None, cos_sin_cache: Any = None,
                         backend: Optional[str] = None, stream: Any = None) -> Any:
    """apply_qk_norm on a packed qkv buffer: its q and k slices normalised and rotated in place.

    Args:
        qkv: a 2-D [tokens, (q_heads + 2 * kv_heads) * head_dim] array, rows contiguous
            (a row stride past the width is fine): each row holds q's heads, then k's, then v's.
        q_heads: query heads.
        kv_heads: key heads (and value heads).
        q_weight, k_weight, config, positions, kind, rounding, eps, cos_sin_cache, backend,
            stream: as for apply_qk_norm.
        v_out: a [tokens, kv_heads, head_dim] array to copy v into; None leaves v alone.

    Returns:
        qkv, its q and k slices normalised and rotated (v untouched).

    Raises:
        rope.Error: (a ValueError) naming the offending argument (e.g. ``qkv.width`` when the
            head counts do not add up to the row); nothing is written then.
    """
    _call(config, [None, None, None, None, qkv, v_out, q_weight, k_weight], kind, rounding, eps, "thd", positions,
          cos_sin_cache, backend, stream, _integer("q_heads", q_heads), _integer("kv_heads", kv_heads))
    return qkv


def _call(config: Config, arrays: list, kind: str, rounding: str, eps: float, layout: str, positions: Any,
          cos_sin_cache: Any, backend: Optional[str], stream: Any, q_heads: int, kv_heads: int) -> None:
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    if kind not in _KINDS:
        raise _fail("kind", repr(kind), "must be one of " + ", ".join(_KINDS))
    if rounding not in _ROUNDINGS:
        raise _fail("rounding", repr(rounding), "must be one of " + ", ".join(_ROUNDINGS))
    for name, array in zip(("q", "k", "out[0]", "out[1]", "qkv", "v_out", "q_weight", "k_weight"), arrays):
        _refuse_autograd(array, name)
    offset, ids = _positions(positions)
    arrays = arrays + [ids, cos_sin_cache]
    first = next(a for a in arrays if a is not None)
    if stream is not None:
        handle = _stream_handle(stream)
        arrays = [_export_for_stream(a, handle) for a in arrays]
    else:
        handle = _current_stream(first)
    bits = 0
    for i, slot in enumerate((0, 1, 2, 3, 6, 7, 4, 5)):  # the C++ call's bit of each array above
        arrays[i], is_bf16 = _bfloat16_bits(arrays[i])
        bits |= int(is_bf16) << slot
    q, k, q_out, k_out, qkv, v_out, q_weight, k_weight, ids, cos_sin_cache = arrays
    _rope.apply_qk_norm(backend or "", config._native, q, k, q_out, k_out, qkv, q_heads, kv_heads, v_out, q_weight,
                        k_weight, kind, rounding, float(eps), layout, offset, ids, cos_sin_cache, handle, bits)
