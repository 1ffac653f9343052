"""rope as PyTorch operators: torch.ops.rope.apply_ (in place), torch.ops.rope.apply (functional) and
torch.ops.rope.append_kv_ (RoPE + paged KV append, in place; see the end of this file).

Importing this module (``rope.ops``; ``import rope`` alone never imports torch)
registers two operators, in the shape of a PyTorch C++ extension
(pytorch/extension-cpp: the operators defined and implemented in C++, the
Python parts added here):

- ``rope::apply_`` rotates q and k in place. Its schema declares the mutation
  (``Tensor(a0!) q, Tensor(a1!)? k``), so torch.compile orders it correctly
  against every other use of q and k, and it returns nothing. For inference
  (no autograd); its q and k version counters move, as PyTorch's own in-place
  operators' do.
- ``rope::apply`` returns the rotated q and k as new tensors. It is
  differentiable: RoPE is a rotation R, linear in q and k, so the gradient of
  the loss with respect to q is R^T times the gradient with respect to the
  output, and R^T is the inverse rotation. Its backward is therefore the same
  operator with ``inverse`` flipped, applied to the incoming gradients
  (``register_autograd`` below). With an attention factor a (yarn, longrope)
  the forward is a R and the backward a R^T: rope's inverse direction keeps the factor.

Both are defined and implemented in C++ (python/torch_ops/operator.cpp:
TORCH_LIBRARY, a kernel per device that checks the tensors and makes one
rope::apply call), loaded from rope/_torch_ops.so. This file adds their fake
implementations (``register_fake``: given tensors without data, they say what
the outputs look like, so torch.compile(fullgraph=True) traces through the
call) and the functional operator's backward. Where the library was not built
(PyTorch missing at build time, e.g. ``pip install .`` in an isolated build
environment) or was built for another PyTorch version, the same two schemas
are registered here with torch.library.custom_op over rope._rope, with the
same checks and messages (``CPP_OPERATOR`` says which is in use).

The rope.Config travels through the operators as its ``key`` (a JSON string:
operators take tensors, numbers and strings); the C++ kernel and
``Config.from_key`` read it with the same C++ code, once per key, cached. The
cos/sin table and the ids are not differentiated. A bad argument raises
rope.Error (a ValueError) from rope.ops.rope_ and rope.ops.rope; called
directly, torch.ops.rope.apply_ and apply raise ValueError with the same message.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from . import _rope
from ._apply import _cp, _index, _positions
from ._config import Config, _fail, _integer


def _load_cpp_operator() -> Any:
    """Imports rope._torch_ops, which registers the operators in C++; the module, or None where it cannot be used.

    The library is tied to the PyTorch it was compiled against (PyTorch's C++ API
    changes between versions): it is imported only into that version, else a warning
    says so and the operators are registered in Python. ROPE_PYTHON_OPERATOR=1 asks
    for the Python registration (the tests run the operators' tests against both).
    """
    here = pathlib.Path(__file__).resolve().parent
    library = here / "_torch_ops.so"
    if os.environ.get("ROPE_PYTHON_OPERATOR") == "1" or not library.exists():
        return None
    stamp = here / "_torch_ops.torch_version"
    built_for = stamp.read_text().strip() if stamp.exists() else "an unknown version"
    if built_for != torch.__version__:
        warnings.warn(f"rope: {library.name} was built for PyTorch {built_for}, this is PyTorch {torch.__version__}: "
                      "the operators are registered in Python instead (slower per call); reinstall rope "
                      "against this PyTorch to get the C++ operators", RuntimeWarning)
        return None
    from . import _torch_ops  # Loading it runs its TORCH_LIBRARY registration.
    return _torch_ops


_cpp_operator = _load_cpp_operator()

#: The path of the C++ operator library in use, or None where the operators are registered in Python.
CPP_OPERATOR: Optional[str] = None if _cpp_operator is None else str(pathlib.Path(_cpp_operator.__file__).resolve())


def _outputs_like(q: Tensor, k: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    # k None (rotate q only): an empty tensor stands for its output, operators return tensors.
    return torch.empty_like(q), (q.new_empty(0) if k is None else torch.empty_like(k))


# --- Without the C++ library: the same operators registered in Python -------------------------
if _cpp_operator is None:
    def _kernel(q, k, q_out, k_out, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache,
                layout, inverse, backend, max_position) -> None:
        """operator.cpp's rotate() in Python: the same checks, then one call through rope._rope and DLPack."""
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
        capsules = [None if t is None else torch.utils.dlpack.to_dlpack(t.detach()) for t in (
            q, k, q_out, k_out, _index("positions", ids), _index("cu_seqlens", cu_seqlens), _index("starts", starts),
            cos_sin_cache)]
        q, k, q_out, k_out, ids, cu_seqlens, starts, cos_sin_cache = capsules
        _rope.apply(backend, Config.from_key(config)._native, q, k, q_out, k_out, layout, offset, ids, cu_seqlens,
                    starts, cp_size, cp_rank, max_position, cos_sin_cache, inverse, stream, 0)

    @torch.library.custom_op("rope::apply_", mutates_args=("q", "k"))
    def _apply_in_place(q: Tensor, k: Optional[Tensor], config: str, offset: int, ids: Optional[Tensor],
                        cu_seqlens: Optional[Tensor], starts: Optional[Tensor], cp_size: int, cp_rank: int,
                        cos_sin_cache: Optional[Tensor], layout: str, inverse: bool, backend: str,
                        max_position: int) -> None:
        if not torch.is_inference_mode_enabled():  # As operator.cpp refuses it, before anything is written.
            for name, tensor in (("q", q), ("k", k)):
                if tensor is not None and tensor.is_inference():
                    raise _fail(name, "an inference tensor",
                                "is rotated in place outside torch.inference_mode(), which PyTorch does not allow: "
                                "clone it first, or call inside torch.inference_mode()")
        _kernel(q, k, None, None, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout,
                inverse, backend, max_position)

    @torch.library.custom_op("rope::apply", mutates_args=())
    def _apply_functional(q: Tensor, k: Optional[Tensor], config: str, offset: int, ids: Optional[Tensor],
                          cu_seqlens: Optional[Tensor], starts: Optional[Tensor], cp_size: int, cp_rank: int,
                          cos_sin_cache: Optional[Tensor], layout: str, inverse: bool, backend: str,
                          max_position: int) -> Tuple[Tensor, Tensor]:
        q_out, k_out = _outputs_like(q, k)
        _kernel(q, k, q_out, None if k is None else k_out, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank,
                cos_sin_cache, layout, inverse, backend, max_position)
        return q_out, k_out


# --- What the operators add in Python: fake implementations and the backward -----------------
@torch.library.register_fake("rope::apply_")
def _(q, k, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout, inverse, backend,
      max_position):
    return None  # Nothing new: q and k are changed where they are.


@torch.library.register_fake("rope::apply")
def _(q, k, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout, inverse, backend,
      max_position):
    return _outputs_like(q, k)


def _setup_context(ctx, inputs, output):
    (q, k, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout, inverse, backend,
     max_position) = inputs
    ctx.save_for_backward(ids, cu_seqlens, starts, cos_sin_cache)
    ctx.call = (config, offset, cp_size, cp_rank, layout, inverse, backend, max_position)
    ctx.has_k = k is not None


def _backward(ctx, grad_q, grad_k):
    # d loss / d q = R^T (d loss / d q_out): the inverse rotation of the incoming gradient.
    ids, cu_seqlens, starts, cos_sin_cache = ctx.saved_tensors
    config, offset, cp_size, cp_rank, layout, inverse, backend, max_position = ctx.call
    grad_q_in, grad_k_in = torch.ops.rope.apply(grad_q, grad_k if ctx.has_k else None, config, offset, ids,
                                                cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout,
                                                not inverse, backend, max_position)
    return (grad_q_in, grad_k_in if ctx.has_k else None) + (None,) * 12


torch.library.register_autograd("rope::apply", _backward, setup_context=_setup_context)


# --- What users call ------------------------------------------------------------------------------
def _arguments(q: Tensor, k: Optional[Tensor], config: Config, positions: Any, layout: Optional[str],
               cu_seqlens: Optional[Tensor], starts: Optional[Tensor], cp: Any, cos_sin_cache: Optional[Tensor],
               inverse: bool, backend: Optional[str], max_position: int) -> tuple:
    """The operators' 14 arguments from rope.apply's forms, checked as rope.apply checks them."""
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    offset, ids = _positions(positions)
    if ids is not None and not isinstance(ids, Tensor):  # A list or a NumPy array, now int64.
        ids = torch.as_tensor(np.asarray(ids), device=q.device)
    layout = layout or ("thd" if q.dim() == 3 else "bhsd")
    cp_size, cp_rank = _cp(cp)
    # "": the C++ side picks by device (cuda-optimized on CUDA, cpu-eigen or cpu-naive on the host).
    return (q, k, config.key, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout,
            bool(inverse), backend or "", _integer("max_position", max_position))


def _as_rope_error(call, *arguments):
    """The operator's ValueError (rope's message) as rope.Error, which rope.ops promises."""
    try:
        return call(*arguments)
    except _rope.Error:
        raise
    except ValueError as error:
        if "rope::Error" not in str(error):
            raise
        raise _rope.Error(str(error).split("\n")[0]) from None


# rope_'s and rope's fast ways into the C++ kernel in eager code (python/torch_ops/eager.cpp), where the
# library is loaded.
_eager_entry = None if _cpp_operator is None else _cpp_operator.rope_
_eager_functional = None if _cpp_operator is None else _cpp_operator.rope


def rope_(q: Tensor, k: Optional[Tensor], config: Config, positions: Any = None, *, layout: Optional[str] = None,
          cu_seqlens: Optional[Tensor] = None, starts: Optional[Tensor] = None, cp: Optional[Tuple[int, int]] = None,
          cos_sin_cache: Optional[Tensor] = None, inverse: bool = False, backend: Optional[str] = None,
          max_position: int = 0) -> Tuple[Tensor, Optional[Tensor]]:
    """Rotates q and k in place (torch.ops.rope.apply_; not differentiable); returns (q, k).

    The arguments are rope.apply's (positions: None, an int offset, or integer
    ids as a tensor, a list or a NumPy array; layout, cu_seqlens, starts, cp,
    cos_sin_cache, inverse, backend, max_position). The kernel runs on
    PyTorch's current stream. A bad argument raises rope.Error, before q or k
    is written; so does an inference tensor outside torch.inference_mode().
    """
    # Aside: in plain eager code, with the C++ library loaded, the arguments go as given to the
    # operator's kernel without PyTorch's dispatcher (python/torch_ops/eager.cpp says why and when
    # it declines); the result, the checks and the version counters are the operator's.
    if _eager_entry is not None and not torch.compiler.is_compiling() and _eager_entry(
            q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend, max_position):
        return q, k
    arguments = _arguments(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend,
                           max_position)
    _as_rope_error(torch.ops.rope.apply_, *arguments)
    return q, k


def rope(q: Tensor, k: Optional[Tensor], config: Config, positions: Any = None, *, layout: Optional[str] = None,
         cu_seqlens: Optional[Tensor] = None, starts: Optional[Tensor] = None, cp: Optional[Tuple[int, int]] = None,
         cos_sin_cache: Optional[Tensor] = None, inverse: bool = False, backend: Optional[str] = None,
         max_position: int = 0) -> Tuple[Tensor, Optional[Tensor]]:
    """The rotated q and k as new tensors, through torch.ops.rope.apply: differentiable
    (the backward is the inverse rotation of the gradient) and torch.compile-able.

    Returns (q_rotated, k_rotated), k_rotated None when k is None. Arguments as rope_.
    """
    # Aside: as rope_'s, in plain eager code with the C++ library loaded, where autograd records
    # nothing (no input requires grad, or grad mode is off): the operator's kernel without the
    # dispatcher and the Python autograd wrapper it would pass through (python/torch_ops/eager.cpp).
    if _eager_functional is not None and not torch.compiler.is_compiling():
        outputs = _eager_functional(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse,
                                    backend, max_position)
        if outputs is not None:
            return outputs
    arguments = _arguments(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend,
                           max_position)
    q_out, k_out = _as_rope_error(torch.ops.rope.apply, *arguments)
    return q_out, (None if k is None else k_out)


# --- RoPE + paged KV append: torch.ops.rope.append_kv_ -------------------------------------------
# Defined in C++ (python/torch_ops/kv_append_op.cpp) beside the others; without that library, the
# same schema registered here over rope._rope.append_kv. Either way it mutates q, k and both caches
# (declared in the schema) and returns nothing; with q_out (FP8) the rotated q goes there instead
# (declared too: ``Tensor(a16!)? q_out``) and q is left as it was. q_out, q_scale and q_out_dtype
# have no defaults: custom_op's version bump indexes every mutated argument, and PyTorch passes a
# Python kernel its arguments without the trailing ones left at their defaults.
if _cpp_operator is None:
    @torch.library.custom_op("rope::append_kv_", mutates_args=("q", "k", "k_cache", "v_cache", "q_out"))
    def _append_kv_in_place(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                            config: str, offset: int, ids: Optional[Tensor], k_scale: Optional[Tensor],
                            v_scale: Optional[Tensor], cos_sin_cache: Optional[Tensor], kv_layout: str,
                            cache_dtype: str, backend: str, max_position: int, q_out: Optional[Tensor],
                            q_scale: Optional[Tensor], q_out_dtype: str) -> None:
        from ._append import _cache, _fp8_out
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
        (k_cache, k_dtype), (v_cache, v_dtype) = (_cache("k_cache", k_cache, cache_dtype or None),
                                                  _cache("v_cache", v_cache, cache_dtype or None))
        q_dtype = ""
        if q_out is not None:
            q_out, q_dtype = _fp8_out(q_out, q_out_dtype or None)
            if not q_dtype and q_out.dtype != torch.uint8:  # As kv_append_op.cpp: q_out is FP8 only.
                raise _fail("q_out.dtype", str(q_out.dtype),
                            "must be torch.float8_e4m3fn or float8_e5m2 (or uint8 with q_out_dtype): the FP8 "
                            "output of q")
        elif q_out_dtype:
            q_dtype = q_out_dtype  # Refused by the C++ side: a format without an FP8 q_out.
        capsules = [None if t is None else torch.utils.dlpack.to_dlpack(t.detach()) for t in (
            q, k, v, k_cache, v_cache, _index("positions", ids), _index("slot_mapping", slot_mapping), k_scale,
            v_scale, cos_sin_cache, q_out, q_scale, None if q_out is None else k)]
        # With an FP8 q_out, k stays in place: k_out is k.
        q, k, v, k_cache, v_cache, ids, slot_mapping, k_scale, v_scale, cos_sin_cache, q_out, q_scale, k_out = capsules
        _rope.append_kv(backend, Config.from_key(config)._native, q, k, v, q_out, k_out, offset, ids, slot_mapping,
                        k_cache, v_cache, k_scale, v_scale, kv_layout, 0, k_dtype, v_dtype, cos_sin_cache,
                        max_position, stream, 0, q_scale, q_dtype)


@torch.library.register_fake("rope::append_kv_")
def _(q, k, v, k_cache, v_cache, slot_mapping, config, offset, ids, k_scale, v_scale, cos_sin_cache, kv_layout,
      cache_dtype, backend, max_position, q_out, q_scale, q_out_dtype):
    return None  # Nothing new: q (or q_out), k and the caches are changed where they are.


def append_kv_(q: Tensor, k: Tensor, v: Tensor, config: Config, positions: Any, slot_mapping: Tensor,
               k_cache: Tensor, v_cache: Tensor, *, kv_layout: str = "nhd", cache_dtype: Optional[str] = None,
               k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None,
               cos_sin_cache: Optional[Tensor] = None, backend: Optional[str] = None,
               max_position: int = 0, q_out: Optional[Tensor] = None, q_scale: Any = None,
               q_out_dtype: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """rope.append_kv as the PyTorch operator torch.ops.rope.append_kv_; returns (q, k), or (q_out, k).

    Rotates q and k in place and writes the rotated k and v into k_cache and
    v_cache at each token's slot (the arguments are rope.append_kv's; scales
    are float32 tensors on the caches' device, FP8 caches torch.float8_e4m3fn
    or float8_e5m2 tensors, or uint8 ones with ``cache_dtype``). Its schema
    declares the four mutations, so torch.compile(fullgraph=True) traces it
    without a graph break; on CUDA it runs on the current stream with no host
    synchronisation and no allocation when positions and slot_mapping are
    int64 and contiguous, so a CUDA graph captures it. Not differentiable. A
    bad argument raises rope.Error before anything is written.

    With ``q_out``, an FP8 tensor [tokens, heads, head_dim] (torch.float8_e4m3fn
    or float8_e5m2, or uint8 with ``q_out_dtype`` "e4m3fn" / "e5m2"; any
    strides, the last axis contiguous), the rotated q is written there alone,
    quantised from float32 as round_to_nearest_even(saturate(value / scale))
    with ``q_scale`` (float32 dequantisation scales, value ~= fp8 * scale: a
    tensor [1] or [heads] on q_out's device, or a Python float), for every
    token, padding too; q is left unchanged (k is still rotated in place).
    """
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    offset, ids = _positions(positions)
    if ids is not None and not isinstance(ids, Tensor):  # A list or a NumPy array, now int64.
        ids = torch.as_tensor(np.asarray(ids), device=q.device)
    if not isinstance(slot_mapping, Tensor):
        slot_mapping = torch.as_tensor(np.asarray(_index("slot_mapping", slot_mapping)), device=q.device)
    if cache_dtype is not None and cache_dtype not in ("e4m3fn", "e5m2"):
        raise _fail("cache_dtype", repr(cache_dtype), 'must be "e4m3fn", "e5m2" or None (the model\'s dtype)')
    if q_out_dtype is not None and q_out_dtype not in ("e4m3fn", "e5m2"):
        raise _fail("q_out_dtype", repr(q_out_dtype), 'must be "e4m3fn", "e5m2" or None (the format of a float8 q_out)')
    if q_scale is not None and not isinstance(q_scale, Tensor):
        from ._append import _scale
        q_scale = _scale("q_scale", q_scale, q_out if q_out is not None else q)  # A checked float32 [1] tensor.
    _as_rope_error(torch.ops.rope.append_kv_, q, k, v, k_cache, v_cache, slot_mapping, config.key, offset, ids,
                   k_scale, v_scale, cos_sin_cache, kv_layout, cache_dtype or "", backend or "",
                   _integer("max_position", max_position), q_out, q_scale, q_out_dtype or "")
    return (q if q_out is None else q_out), k
