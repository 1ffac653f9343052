"""rope: Rotary Position Embedding on NumPy arrays, PyTorch tensors and CuPy arrays.

The C++ library's backends (cpu-naive, cpu-eigen, cuda-naive, cuda-optimized)
called on the caller's own memory, through DLPack, without a copy::

    import numpy as np, rope
    config = rope.Config(head_dim=64, base=10000.0, style="neox")
    q = np.random.rand(1, 8, 16, 64).astype(np.float32)   # [batch, heads, seq, head_dim]
    k = np.random.rand(1, 2, 16, 64).astype(np.float32)
    rope.apply(q, k, config, positions=5)                # in place, positions 5..20

rope.ops (imported on first use, it needs PyTorch) registers the PyTorch
operators torch.ops.rope.apply_ (in place) and torch.ops.rope.apply
(functional, differentiable, torch.compile-able). rope.hf (also on first use)
patches a HuggingFace transformers model to use them for its RoPE.

rope.append_kv rotates q and k and appends the rotated k and v to paged KV
caches at each token's slot (a serving engine's decode step, FP8 caches too);
rope.ops.append_kv_ is the same call as a PyTorch operator.

Errors are rope.Error, a ValueError whose message names the argument and its
value; when one is raised, nothing has been written.
"""

from . import _rope
from ._append import append_kv
from ._apply import apply, list_backends
from ._config import Config
from ._qk_norm import apply_qk_norm, apply_qk_norm_packed
from ._slot_mapping import (slot_mapping_from_block_table, slot_mapping_from_flashinfer_indptr,
                            slot_mapping_from_flashinfer_positions)
from ._rerotate import rerotate, rerotate_cache

Error = _rope.Error
BackendInfo = _rope.BackendInfo

__all__ = ["Config", "Error", "BackendInfo", "apply", "append_kv", "apply_qk_norm", "apply_qk_norm_packed",
           "rerotate", "rerotate_cache", "list_backends",
           "slot_mapping_from_flashinfer_indptr", "slot_mapping_from_flashinfer_positions",
           "slot_mapping_from_block_table", "ops", "hf"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # rope.ops and rope.hf import torch: only when asked for, so that `import rope` works without it.
    if name in ("ops", "hf"):
        import importlib

        return importlib.import_module(".ops", __name__)
    raise AttributeError(f"module 'rope' has no attribute {name!r}")
