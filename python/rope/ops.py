"""rope as PyTorch operators: torch.ops.rope.apply_ (in place) and torch.ops.rope.apply (functional).

Importing this module (``rope.ops``; ``import rope`` alone never imports torch)
registers two operators:

- ``rope::apply_`` rotates q and k in place. Its schema declares the mutation
  (``Tensor(a0!) q, Tensor(a1!)? k``), so torch.compile orders it correctly
  against every other use of q and k, and it returns nothing. For inference
  (no autograd). It is registered in C++ (python/torch_ops/: TORCH_LIBRARY, loaded
  from rope/_torch_ops.so), so a call goes from Python through PyTorch's C++
  dispatcher to rope's kernel with no Python in between; registered in Python
  (torch.library.custom_op) every call ran Python dispatch code. In plain
  eager code rope_ calls the same C++ kernel without the dispatcher
  (rope._torch_ops.rope_, python/torch_ops/eager.cpp). Where the
  library was not built (PyTorch missing at build time, e.g. ``pip install .``
  in an isolated build environment) or was built for another PyTorch version,
  the same schema is registered with custom_op instead (``CPP_OPERATOR`` says which).
- ``rope::apply`` returns the rotated q and k as new tensors. It is
  differentiable: RoPE is a rotation R, linear in q and k, so the gradient of
  the loss with respect to q is R^T times the gradient with respect to the
  output, and R^T is the inverse rotation. Its backward is therefore the same
  operator with ``inverse`` flipped, applied to the incoming gradients
  (``register_autograd``). With an attention factor a (yarn, longrope) the
  forward is a R and the backward a R^T: rope's inverse direction keeps the factor.
  A custom_op: its cost per call is Python's, next to an allocation of the outputs.

Both have a fake (meta) implementation: given tensors without data, it says
what the outputs look like, so torch.compile(fullgraph=True) traces through
the call instead of breaking the graph.

The rope.Config travels through the operator as its ``key`` (a JSON string:
operators take tensors, numbers and strings); the C++ kernel and
``Config.from_key`` read it with the same C++ code, once per key, cached. The
cos/sin table and the ids are not differentiated. A bad argument raises
rope.Error (a ValueError) from rope and from rope_ in eager code; the C++
torch.ops.rope.apply_ raises ValueError with the same message.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from . import _rope
from ._config import Config, _fail

# DLPack capsules straight from PyTorch's C++ side: the same capsule
# Tensor.__dlpack__() returns, without its Python-level checks (which refuse
# tensors that require grad; here autograd is this operator's own business).
# The capsule owns a reference to the tensor: the memory lives until rope is done.
_to_dlpack = getattr(torch._C, "_to_dlpack", None) or torch.utils.dlpack.to_dlpack


def _capsule(tensor: Optional[Tensor]) -> Any:
    return None if tensor is None else _to_dlpack(tensor)


def _current_stream(device: torch.device) -> int:
    """PyTorch's current CUDA stream on ``device``, as the cudaStream_t integer."""
    return torch.cuda.current_stream(device).cuda_stream


# The same without building a torch.cuda.Stream object, where PyTorch has it (less host
# time per call, which a decode step notices).
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    def _current_stream(device: torch.device) -> int:  # noqa: F811
        return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else -1)


def _launch(q: Tensor, k: Optional[Tensor], q_out: Optional[Tensor], k_out: Optional[Tensor],
            config: "_rope.RopeConfig", offset: int, ids: Optional[Tensor], cu_seqlens: Optional[Tensor],
            starts: Optional[Tensor], cp_size: int, cp_rank: int, cos_sin_cache: Optional[Tensor], layout: str,
            inverse: bool, backend: str, max_position: int) -> None:
    """One rope call on PyTorch tensors, on PyTorch's current stream of q's device."""
    stream = _current_stream(q.device) if q.is_cuda else 0
    _rope.apply(backend, config, _capsule(q), _capsule(k), _capsule(q_out), _capsule(k_out), layout, offset,
                _capsule(ids), _capsule(cu_seqlens), _capsule(starts), cp_size, cp_rank, max_position,
                _capsule(cos_sin_cache), inverse, stream, 0)


# --- rope::apply_: in place ------------------------------------------------------------------
def _load_cpp_operator() -> Any:
    """Imports rope._torch_ops, which registers rope::apply_ in C++; the module, or None where it cannot be used.

    The library is tied to the PyTorch it was compiled against (PyTorch's C++ API
    changes between versions): it is imported only into that version, else a warning
    says so and the operator is registered in Python. ROPE_PYTHON_OPERATOR=1 asks
    for the Python registration (to compare the two).
    """
    here = pathlib.Path(__file__).resolve().parent
    library = here / "_torch_ops.so"
    if os.environ.get("ROPE_PYTHON_OPERATOR") == "1" or not library.exists():
        return None
    stamp = here / "_torch_ops.torch_version"
    built_for = stamp.read_text().strip() if stamp.exists() else "an unknown version"
    if built_for != torch.__version__:
        warnings.warn(f"rope: {library.name} was built for PyTorch {built_for}, this is PyTorch {torch.__version__}: "
                      "torch.ops.rope.apply_ is registered in Python instead (slower per call); reinstall rope "
                      "against this PyTorch to get the C++ operator", RuntimeWarning)
        return None
    from . import _torch_ops  # Loading it runs its TORCH_LIBRARY registration.
    return _torch_ops


_cpp_operator = _load_cpp_operator()

#: The path of the C++ operator library in use, or None where rope::apply_ is registered in Python.
CPP_OPERATOR: Optional[str] = None if _cpp_operator is None else str(pathlib.Path(_cpp_operator.__file__).resolve())

# rope_'s way into the C++ kernel in eager code (python/torch_ops/eager.cpp), where the library is loaded.
_eager_entry = None if _cpp_operator is None else _cpp_operator.rope_


def _apply_in_place(q: Tensor, k: Optional[Tensor], config: str, offset: int, ids: Optional[Tensor],
                    cu_seqlens: Optional[Tensor], starts: Optional[Tensor], cp_size: int, cp_rank: int,
                    cos_sin_cache: Optional[Tensor], layout: str, inverse: bool, backend: str,
                    max_position: int) -> None:
    """rope::apply_ in Python: the kernel where the C++ library is not loaded."""
    _launch(q, k, None, None, Config.from_key(config)._native, offset, ids, cu_seqlens, starts, cp_size, cp_rank,
            cos_sin_cache, layout, inverse, backend, max_position)


def _apply_in_place_fake(q, k, config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, cos_sin_cache, layout,
                         inverse, backend, max_position):
    return None  # Nothing new: q and k are changed where they are.


if CPP_OPERATOR is None:
    torch.library.custom_op("rope::apply_", mutates_args=("q", "k"))(_apply_in_place).register_fake(
        _apply_in_place_fake)
else:
    torch.library.register_fake("rope::apply_")(_apply_in_place_fake)


# --- rope::apply: functional, differentiable ---------------------------------------------------
def _outputs_like(q: Tensor, k: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    # k None (rotate q only): an empty tensor stands for its output, operators return tensors.
    return torch.empty_like(q), (q.new_empty(0) if k is None else torch.empty_like(k))


@torch.library.custom_op("rope::apply", mutates_args=())
def _apply_functional(q: Tensor, k: Optional[Tensor], config: str, offset: int, ids: Optional[Tensor],
                      cu_seqlens: Optional[Tensor], starts: Optional[Tensor], cp_size: int, cp_rank: int,
                      cos_sin_cache: Optional[Tensor], layout: str, inverse: bool, backend: str,
                      max_position: int) -> Tuple[Tensor, Tensor]:
    q_out, k_out = _outputs_like(q, k)
    _launch(q, k, q_out, None if k is None else k_out, Config.from_key(config)._native, offset, ids, cu_seqlens,
            starts, cp_size, cp_rank, cos_sin_cache, layout, inverse, backend, max_position)
    return q_out, k_out


@_apply_functional.register_fake
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


_apply_functional.register_autograd(_backward, setup_context=_setup_context)


# --- What users call ------------------------------------------------------------------------------
def _arguments(q: Tensor, config: Config, positions: Any, layout: Optional[str], cu_seqlens: Optional[Tensor],
               starts: Optional[Tensor], cp: Optional[Tuple[int, int]], backend: Optional[str]) -> tuple:
    """The operator's (offset, ids, cu_seqlens, starts, cp_size, cp_rank, layout, backend) from rope.apply's forms."""
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    offset, ids = (int(positions), None) if isinstance(positions, int) else (0, positions)
    if ids is not None and not isinstance(ids, Tensor):
        ids = torch.as_tensor(ids, dtype=torch.int64, device=q.device)
    layout = layout or ("thd" if q.dim() == 3 else "bhsd")
    cp_size, cp_rank = (1, 0) if cp is None else cp
    # "": the C++ side picks by device (cuda-optimized on CUDA, cpu-eigen or cpu-naive on the host).
    return offset, ids, cu_seqlens, starts, cp_size, cp_rank, layout, backend or ""


def rope_(q: Tensor, k: Optional[Tensor], config: Config, positions: Any = None, *, layout: Optional[str] = None,
          cu_seqlens: Optional[Tensor] = None, starts: Optional[Tensor] = None, cp: Optional[Tuple[int, int]] = None,
          cos_sin_cache: Optional[Tensor] = None, inverse: bool = False, backend: Optional[str] = None,
          max_position: int = 0) -> Tuple[Tensor, Optional[Tensor]]:
    """Rotates q and k in place (torch.ops.rope.apply_; not differentiable); returns (q, k).

    The arguments are rope.apply's (positions: None, an int offset or an int64
    ids tensor; layout, cu_seqlens, starts, cp, cos_sin_cache, inverse,
    backend, max_position). The kernel runs on PyTorch's current stream. Under
    torch.compile (or any tracing) the call is the operator torch.ops.rope.apply_;
    in plain eager code the same kernel is called without PyTorch's dispatcher
    (its q and k version counters move as the operator's do). A bad argument
    raises rope.Error, before q or k is written.
    """
    # Plain eager code: rope's C++ entry (python/torch_ops/eager.cpp) takes the arguments as
    # given and runs the operator's kernel without PyTorch's dispatcher, which costs host time
    # on every call even for PyTorch's own operators (a decode step notices it). It
    # returns False, having done nothing, where PyTorch must see the call (a mode, a tensor
    # subclass) or an argument needs Python's conversion first (positions as a list); so does
    # the check for torch.compile, where the call must be the operator in the graph.
    # What each path costs: bench/results/h200-python-op-cost.csv, chapter 9.
    if _eager_entry is not None and not torch.compiler.is_compiling() and _eager_entry(
            q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend, max_position):
        return q, k
    offset, ids, cu, st, cp_size, cp_rank, layout, backend = _arguments(q, config, positions, layout, cu_seqlens,
                                                                         starts, cp, backend)
    if _cpp_operator is None and _eager(q):
        # No C++ library: the kernel through rope._rope and DLPack, still without the dispatcher
        # (through it, the Python-registered operator runs Python code on every call).
        _launch(q, k, None, None, config._native, offset, ids, cu, st, cp_size, cp_rank, cos_sin_cache, layout,
                bool(inverse), backend, int(max_position))
    else:
        torch.ops.rope.apply_(q, k, config.key, offset, ids, cu, st, cp_size, cp_rank, cos_sin_cache, layout,
                              bool(inverse), backend, int(max_position))
    return q, k


# How many TorchDispatchModes are active (PyTorch-internal; without it, always take the operator).
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)


def _eager(q: Tensor) -> bool:
    """True when nothing (torch.compile, a tensor subclass, a dispatch or function mode) would see the call."""
    return (_dispatch_modes is not None and type(q) is Tensor and not torch.compiler.is_compiling()
            and not torch._C._is_torch_function_mode_enabled() and _dispatch_modes() == 0)


def rope(q: Tensor, k: Optional[Tensor], config: Config, positions: Any = None, *, layout: Optional[str] = None,
         cu_seqlens: Optional[Tensor] = None, starts: Optional[Tensor] = None, cp: Optional[Tuple[int, int]] = None,
         cos_sin_cache: Optional[Tensor] = None, inverse: bool = False, backend: Optional[str] = None,
         max_position: int = 0) -> Tuple[Tensor, Optional[Tensor]]:
    """The rotated q and k as new tensors, through torch.ops.rope.apply: differentiable
    (the backward is the inverse rotation of the gradient) and torch.compile-able.

    Returns (q_rotated, k_rotated), k_rotated None when k is None. Arguments as rope_.
    """
    offset, ids, cu, st, cp_size, cp_rank, layout, backend = _arguments(q, config, positions, layout, cu_seqlens,
                                                                         starts, cp, backend)
    q_out, k_out = torch.ops.rope.apply(q, k, config.key, offset, ids, cu, st, cp_size, cp_rank, cos_sin_cache,
                                        layout, bool(inverse), backend, int(max_position))
    return q_out, (None if k is None else k_out)
