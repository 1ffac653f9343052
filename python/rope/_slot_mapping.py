"""Slot mappings from other engines' page metadata: FlashInfer's two forms and flash-attn's block table.

A slot mapping is int64 ``[tokens]``: slot = page * page_size + offset in the page, and -1 for a
padding token (rotated, not written), the form vLLM and rope's fused KV-cache write take. These
wrappers convert integer arrays to contiguous int64 (FlashInfer and flash-attn use int32), allocate
the result beside the inputs and pick the stream, as rope.apply does; the C++ library
(rope/slot_mapping.hpp) checks and converts.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from . import _rope
from ._apply import _current_stream, _export_for_stream, _index, _stream_handle
from ._config import _integer


def slot_mapping_from_flashinfer_indptr(append_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any,
                                        *, page_size: int, pages: int, out: Any = None, stream: Any = None) -> Any:
    """The slot mapping of FlashInfer's ``append_paged_kv_cache`` metadata (with ``append_indptr``).

    Request b owns pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, its last page filled to
    ``kv_last_page_len[b]``; its step's tokens ``append_indptr[b]:append_indptr[b+1]`` are the last
    ones of its sequence (FlashInfer's ``get_batch_indices_positions``). Tokens past
    ``append_indptr[-1]`` (only with ``out``) are padding: -1.

    Args:
        append_indptr: ``[batch + 1]`` integers, 0 first, non-decreasing.
        kv_indptr: ``[batch + 1]`` integers, offsets into kv_indices.
        kv_indices: page indices, each in ``[0, pages)``.
        kv_last_page_len: ``[batch]`` integers, each in ``[0, page_size]``.
        page_size: slots per page.
        pages: pages in the cache.
        out: int64 ``[tokens]`` to write (same library and device as the inputs); None allocates
            ``[append_indptr[-1]]`` (reading that element: a synchronisation for a CUDA tensor).
        stream: the CUDA stream to launch on (as for rope.apply); default: the current stream of
            the framework that made the arrays.

    Returns:
        The slot mapping (``out`` when given): a NumPy array, or a tensor of the inputs' library and device.

    Raises:
        rope.Error: (a ValueError) naming the array, index and value out of range (host arrays;
            CUDA arrays get -1 for such tokens instead); nothing has been written.
    """
    arrays = [_index("append_indptr", append_indptr), _index("kv_indptr", kv_indptr),
              _index("kv_indices", kv_indices), _index("kv_last_page_len", kv_last_page_len)]
    if out is None:
        out = _new_like(arrays[1], _last(arrays[0]))
    return _run(_rope.slot_mapping_from_flashinfer_indptr, arrays, out, page_size, pages, stream)


def slot_mapping_from_flashinfer_positions(batch_indices: Any, positions: Any, kv_indptr: Any, kv_indices: Any,
                                           *, page_size: int, pages: int, out: Any = None,
                                           stream: Any = None) -> Any:
    """The slot mapping of FlashInfer's ``batch_indices`` and ``positions``; batch index -1 is padding (-1).

    Token t goes to position ``positions[t]`` of request ``batch_indices[t]``, in page
    ``kv_indices[kv_indptr[b] + positions[t] // page_size]``.

    Args:
        batch_indices: ``[tokens]`` integers, each -1 or in ``[0, batch)``.
        positions: ``[tokens]`` integers, each within the request's pages.
        kv_indptr: ``[batch + 1]`` integers, offsets into kv_indices.
        kv_indices: page indices, each in ``[0, pages)``.
        page_size: slots per page.
        pages: pages in the cache.
        out: int64 ``[tokens]`` to write; None allocates it.
        stream: the CUDA stream to launch on (as for rope.apply).

    Returns:
        The slot mapping (``out`` when given).

    Raises:
        rope.Error: as slot_mapping_from_flashinfer_indptr.
    """
    arrays = [_index("batch_indices", batch_indices), _index("positions", positions),
              _index("kv_indptr", kv_indptr), _index("kv_indices", kv_indices)]
    if out is None:
        out = _new_like(arrays[2], len(arrays[0]))
    return _run(_rope.slot_mapping_from_flashinfer_positions, arrays, out, page_size, pages, stream)


def slot_mapping_from_block_table(block_table: Any, cache_seqlens: Any, cu_seqlens_q: Any, *, page_size: int,
                                  pages: int, out: Any = None, stream: Any = None) -> Any:
    """The slot mapping of flash-attn's ``flash_attn_with_kvcache`` metadata.

    Token j of request b (``cu_seqlens_q[b] + j``) goes to position ``cache_seqlens[b] + j``, in page
    ``block_table[b, position // page_size]``. Tokens past ``cu_seqlens_q[-1]`` (only with ``out``)
    are padding: -1.

    Args:
        block_table: ``[batch, max_blocks_per_seq]`` integers, page indices in ``[0, pages)``.
        cache_seqlens: ``[batch]`` integers, tokens cached before this step.
        cu_seqlens_q: ``[batch + 1]`` integers, 0 first, non-decreasing: the step's tokens per request.
        page_size: slots per page (flash-attn's page_block_size).
        pages: pages in the cache (flash-attn's num_blocks).
        out: int64 ``[tokens]`` to write; None allocates ``[cu_seqlens_q[-1]]``.
        stream: the CUDA stream to launch on (as for rope.apply).

    Returns:
        The slot mapping (``out`` when given).

    Raises:
        rope.Error: as slot_mapping_from_flashinfer_indptr.
    """
    arrays = [_index("block_table", block_table), _index("cache_seqlens", cache_seqlens),
              _index("cu_seqlens_q", cu_seqlens_q)]
    if out is None:
        out = _new_like(arrays[1], _last(arrays[2]))
    return _run(_rope.slot_mapping_from_block_table, arrays, out, page_size, pages, stream)


def _last(indptr: Any) -> int:
    """The last entry of an offsets array (0 when it has none: the C++ call names the bad shape)."""
    return int(indptr[-1]) if len(indptr) > 0 else 0


def _new_like(reference: Any, tokens: int) -> Any:
    """An int64 [tokens] array of the library and device of ``reference``."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(reference, torch.Tensor):
        return torch.empty(tokens, dtype=torch.int64, device=reference.device)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(reference, cupy.ndarray):
        return cupy.empty(tokens, dtype=cupy.int64)
    return np.empty(tokens, dtype=np.int64)


def _run(convert: Any, arrays: list, out: Any, page_size: int, pages: int, stream: Any) -> Any:
    """Calls the C++ converter on ``arrays`` and ``out`` with the stream rope.apply would use."""
    page_size = _integer("page_size", page_size)
    pages = _integer("pages", pages)
    passed = arrays + [out]
    if stream is not None:
        handle = _stream_handle(stream)
        passed = [_export_for_stream(a, handle) for a in passed]
    else:
        handle = _current_stream(out)
    convert(*passed, page_size, pages, handle)
    return out
