"""rope.apply: one RoPE call on the caller's own arrays, through DLPack.

What this file adds to the C++ call (rope._rope.apply) is Python's business:
the forms the positions come in, the CUDA stream of the framework that made
the tensors (and DLPack's stream handshake), and NumPy's bfloat16, which DLPack
cannot describe. Everything else (shapes, strides, dtypes, devices, aliasing)
is checked once, by the C++ library, before anything is written.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _rope
from ._config import Config, _fail, _integer

# DLPack device types whose memory rope's CUDA backends address (CUDA, CUDA managed).
_CUDA_DEVICE_TYPES = (2, 13)


def apply(q: Any, k: Any, config: Config, positions: Union[None, int, Any] = None, *,
          backend: Optional[str] = None, inverse: bool = False, out: Optional[Tuple[Any, Any]] = None,
          layout: Optional[str] = None, cu_seqlens: Any = None, starts: Any = None,
          cp: Optional[Tuple[int, int]] = None, cos_sin_cache: Any = None, max_position: int = 0,
          stream: Any = None) -> Tuple[Any, Any]:
    """Rotates q and k by RoPE, in place (default) or into ``out``.

    Args:
        q: queries: a NumPy array, PyTorch tensor or CuPy array (anything with
            ``__dlpack__``), float32, float16 or bfloat16, on the host or a CUDA
            device, any strides. 4-D in ``layout`` order, or 3-D for "thd".
        k: keys, same batch, seq and head_dim as q, heads dividing q's; None rotates q only.
        config: the model's RoPE (rope.Config).
        positions: None (0, 1, ..., seq-1), an int offset (KV-cache decode), or
            integer ids: [seq], [batch, seq], or with several axes (M-RoPE, axial)
            [axes, seq] or [axes, batch, seq]; a list, or a NumPy, PyTorch or
            CuPy array of any integer type and any strides (a slice, an
            ``expand()``ed row), converted to contiguous int64 where needed, on
            its own device. Floats and bools are refused, never rounded.
        backend: "cpu-naive", "cpu-eigen", "cuda-naive" or "cuda-optimized";
            None picks cuda-optimized for CUDA tensors and cpu-eigen (else
            cpu-naive) for host arrays.
        inverse: rotate by -angle (RoPE's backward pass).
        out: (q_out, k_out) for an out-of-place call (k_out None when k is None);
            q and k are then only read.
        layout: "bhsd" ([batch, heads, seq, dim], the default for 4-D), "bshd",
            or "thd" (packed [tokens, heads, dim], the default for 3-D).
        cu_seqlens: packed sequences: int64 [sequences + 1] boundaries over the seq axis.
        starts: packed sequences: int64 [sequences], each one's first position
            (default: ``positions`` as an int offset, else 0).
        cp: (size, rank): this rank's context-parallel shard (chunks rank and
            2*size-1-rank of every sequence), rotated at global positions.
        cos_sin_cache: a float32 [max_position, rotary_dim] table (cos of each
            pair, then sin), replacing rope's own angles: ``config``'s scaling
            and attention factor are not applied on top of it
            (``config.cos_sin_cache(rows)`` builds the table of ``config``).
        max_position: largest position + 1, needed with dynamic or longrope
            scaling when the ids live on a CUDA device (rope cannot read them).
        stream: the CUDA stream to launch on (an int handle, a torch.cuda.Stream,
            a cupy Stream or any object with ``__cuda_stream__``). Default: the
            current stream of the framework that made q (PyTorch, CuPy), else
            the default stream.

    Returns:
        (q, k) rotated in place, or ``out``. PyTorch tensors rotated in place
        (no ``stream``) go to rope.ops' kernel where its C++ library is loaded
        (the first such call loads it), without a DLPack export each; their
        version counters then move, as PyTorch's in-place operators' do.

    Raises:
        rope.Error: (a ValueError) naming the offending argument and its value;
            nothing has been written.
    """
    if not isinstance(config, Config):
        raise _fail("config", type(config).__name__, "must be a rope.Config")
    torch = sys.modules.get("torch")  # Loaded when any array is a PyTorch tensor.
    if (out is None and stream is None and torch is not None and type(q) is torch.Tensor
            and not torch.compiler.is_compiling()):
        # In place on PyTorch tensors: the operators' eager entry takes them as they are, without a
        # DLPack export each (python/torch_ops/eager.cpp); it declines, having done nothing, the
        # arguments it does not take (a tensor that autograd would track among them), and the way
        # below takes the call.
        entry = _torch_entry()
        if entry is not None and entry(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache,
                                       inverse, backend, max_position):
            return q, k
    if getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False):
        _refuse_autograd(q, "q")
        _refuse_autograd(k, "k")
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise _fail("out", type(out).__name__, "must be a pair (q_out, k_out)")
    result = (q, k) if out is None else tuple(out)
    if positions is None or type(positions) is int and -_INT64_MAX - 1 <= positions <= _INT64_MAX:
        offset, ids = positions or 0, None  # The common forms, checked without a call.
    else:
        offset, ids = _positions(positions)
    q_out, k_out = (None, None) if out is None else out
    if layout is None:
        layout = "thd" if getattr(q, "ndim", 4) == 3 else "bhsd"
    cp_size, cp_rank = (1, 0) if cp is None else _cp(cp)
    if type(max_position) is not int or not -_INT64_MAX - 1 <= max_position <= _INT64_MAX:
        max_position = _integer("max_position", max_position)
    if cu_seqlens is not None or starts is not None:
        cu_seqlens, starts = _index("cu_seqlens", cu_seqlens), _index("starts", starts)
    arrays = [q, k, q_out, k_out, ids, cu_seqlens, starts, cos_sin_cache]

    if stream is not None:
        # An explicit stream: DLPack's handshake asks each CUDA producer to make
        # that stream wait for the work it has queued on its own stream.
        handle = _stream_handle(stream)
        arrays = [_export_for_stream(a, handle) for a in arrays]
    else:
        handle = _current_stream(q)

    bits = 0
    for i, array in enumerate(arrays):
        if array is None:
            continue
        if torch is not None and stream is None and type(array) is torch.Tensor and not array.requires_grad:
            arrays[i] = _export_tensor(torch, array)
        elif i < 4 and isinstance(array, np.ndarray):  # q, k, q_out, k_out: bfloat16 travels as its uint16 bits.
            arrays[i], is_bf16 = _bfloat16_bits(array)
            bits |= int(is_bf16) << i

    q, k, q_out, k_out, ids, cu_seqlens, starts, cos_sin_cache = arrays
    _rope.apply(backend or "", config._native, q, k, q_out, k_out, layout, offset, ids, cu_seqlens, starts,
                cp_size, cp_rank, max_position, cos_sin_cache, bool(inverse), handle, bits)
    return result


# --- PyTorch tensors: the operators' eager entry ----------------------------------------
_ENTRY_UNSET = object()
_entry = _ENTRY_UNSET  # rope._torch_ops.apply_ once looked up, or None.


def _torch_entry() -> Any:
    """rope._torch_ops.apply_, loaded through rope.ops (which loads the C++ library only where it
    was built for this PyTorch), or None where there is none."""
    global _entry
    if _entry is _ENTRY_UNSET:
        try:
            from . import ops
        except ImportError:
            ops = None
        library = None if ops is None else ops._cpp_operator
        _entry = None if library is None else getattr(library, "apply_", None)
    return _entry


def _cp(cp: Any) -> Tuple[int, int]:
    """(cp_size, cp_rank) from ``cp``: None (unsharded) or a pair of ints."""
    if cp is None:
        return 1, 0
    if not isinstance(cp, (tuple, list)) or len(cp) != 2:
        raise _fail("cp", repr(cp), "must be a pair (size, rank)")
    return _integer("cp[0]", cp[0]), _integer("cp[1]", cp[1])


def list_backends() -> list:
    """Every backend rope knows, in teaching order, available here or not.

    Returns:
        rope.BackendInfo objects: name, description, device ("host" or "cuda"),
        available, and reason (why it is unavailable, "" if it is available).
    """
    return _rope.list_backends()


def _refuse_autograd(tensor: Any, name: str) -> None:
    """A PyTorch tensor that autograd tracks would silently lose its gradient here: refuse it."""
    if getattr(tensor, "requires_grad", False) and sys.modules["torch"].is_grad_enabled():
        raise _fail(name, "a tensor that requires grad",
                    "rope.apply is not differentiable: use rope.ops.rope (its backward is the inverse rotation), "
                    "or call rope.apply under torch.no_grad()")


# --- Positions ------------------------------------------------------------------------
def _positions(positions: Any, name: str = "positions") -> Tuple[int, Any]:
    """(offset, ids): an int is an offset; anything else is integer ids (see _index)."""
    if positions is None:
        return 0, None
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, (bool, np.bool_)):
        return _integer(name, positions), None
    if isinstance(positions, (bool, float, np.bool_, np.floating)):
        raise _fail(name, type(positions).__name__, _NOT_INTEGERS)
    return 0, _index(name, positions)


_NOT_INTEGERS = "must be integers (any integer dtype): never rounded"
_INT64_MAX = (1 << 63) - 1


def _index(name: str, values: Any) -> Any:
    """Integer ids as users hold them (a list, a NumPy array or a PyTorch/CuPy tensor of any integer
    type and strides) as the contiguous int64 array rope reads, converted on the array's own device
    (and, for PyTorch, on its current stream, the one the call runs on). Anything but integers is a
    rope.Error naming ``name``: a float position is never rounded. Other objects pass unchanged (the
    C++ call names what it cannot use)."""
    if values is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        if values.dtype == torch.bool or values.is_floating_point() or values.is_complex():
            raise _fail(name, str(values.dtype).replace("torch.", ""), _NOT_INTEGERS)
        return values if values.dtype == torch.int64 and values.is_contiguous() else values.to(torch.int64).contiguous()
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(values, cupy.ndarray):
        if values.dtype.kind not in "iu":
            raise _fail(name, values.dtype.name, _NOT_INTEGERS)
        return cupy.ascontiguousarray(values, dtype=cupy.int64)
    if not isinstance(values, (list, tuple, range, np.ndarray)):
        return values
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(array.shape, dtype=np.int64)
    if array.dtype == object:  # Python ints beyond int64 (or a mixture NumPy could not type)
        for value in array.flat:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(name, type(value).__name__, _NOT_INTEGERS)
            _integer(name, value)
    if array.dtype.kind not in "iu":
        raise _fail(name, array.dtype.name, _NOT_INTEGERS)
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and int(array.max()) > _INT64_MAX:
        _integer(name, int(array.max()))
    return np.ascontiguousarray(array, dtype=np.int64)


# --- Streams ----------------------------------------------------------------------------
def _stream_handle(stream: Any) -> int:
    """The cudaStream_t of ``stream`` as an int: PyTorch, CuPy, the CUDA stream protocol, or an int."""
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):  # The CUDA stream protocol: (version, handle).
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, attribute):
            return int(getattr(stream, attribute))
    raise _fail("stream", type(stream).__name__, "must be an int handle, a torch.cuda.Stream or a cupy Stream")


def _current_stream(q: Any) -> int:
    """The stream the framework that made ``q`` is working on, so rope's kernel follows its work."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        if not q.is_cuda:
            return 0
        # PyTorch's raw handle, as its compiled code reads it (no Stream object made); the public way otherwise.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return raw(q.get_device()) if raw is not None else torch.cuda.current_stream(q.device).cuda_stream
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(q, cupy.ndarray):
        return cupy.cuda.get_current_stream().ptr
    return 0


def _export_tensor(torch: Any, tensor: Any) -> Any:
    """A torch.Tensor (not a subclass, which may export otherwise) that does not require grad as a
    DLPack capsule, from torch.utils.dlpack.to_dlpack: PyTorch's C function, which its method
    ``__dlpack__()`` calls after checks in Python that cost more than the export itself (the tensor
    requires grad, a CUDA tensor is on the current device, ...). Where the export fails (a sparse
    tensor, a meta tensor), the tensor itself: its ``__dlpack__()`` is then called on import, and its
    refusal is part of rope's message. (A complex tensor with the conjugate bit, which ``__dlpack__()``
    refuses, is exported and refused by its dtype.)"""
    try:
        return torch.utils.dlpack.to_dlpack(tensor)
    except (RuntimeError, BufferError):
        return tensor


def _export_for_stream(array: Any, handle: int) -> Any:
    """A CUDA array as a DLPack capsule made for ``handle`` (host arrays and None unchanged).

    The capsule owns a reference to its producer, so the memory stays valid
    until rope has imported it and the call has returned.
    """
    if array is None or not hasattr(array, "__dlpack_device__"):
        return array
    if array.__dlpack_device__()[0] not in _CUDA_DEVICE_TYPES:
        return array
    # DLPack: 1 is the legacy default stream; 0 is ambiguous and not allowed.
    return array.__dlpack__(stream=handle if handle != 0 else 1)


# --- bfloat16 NumPy arrays -----------------------------------------------------------------
def _bfloat16_bits(array: Any) -> Tuple[Any, bool]:
    """An ml_dtypes.bfloat16 NumPy array as a uint16 view of the same memory (DLPack has no
    code for NumPy's extension dtypes); the C++ side reads those bits as bfloat16."""
    # The kind first: NumPy's own dtypes are never "V" (void) as extension dtypes are, and reading
    # it is far cheaper than the dtype's name.
    if isinstance(array, np.ndarray) and array.dtype.kind == "V" and array.dtype.name == "bfloat16":
        return array.view(np.uint16), True
    return array, False
