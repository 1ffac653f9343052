"""rope in HuggingFace transformers models: one call patches a model's RoPE, one undoes it.

::

    import rope.hf
    patch = rope.hf.patch(model)   # model: a transformers model, loaded or built from its config
    ...                            # forward, generate, training: RoPE is rope.ops.rope
    patch.undo()                   # HF's own RoPE again (or: with rope.hf.patch(model): ...)

HF's attention calls ``apply_rotary_pos_emb(q, k, cos, sin)`` with the cos and
sin that the model's rotary-embedding module computed once per forward from
``position_ids``; the positions themselves never reach the attention. So the
patch changes two things:

- the rotary-embedding module of **this model** (an instance attribute
  ``forward``, nothing on its class) returns, instead of cos and sin, a small
  :class:`Angles` object carrying the call's ``position_ids`` and the model's
  rope.Config (built once, at patch time, from the model's ``rope_parameters``
  as HF gives them);
- the modeling module's ``apply_rotary_pos_emb`` (e.g.
  ``transformers.models.llama.modeling_llama``) is replaced by a dispatcher: an
  :class:`Angles` argument is rotated by ``rope.ops.rope`` (the differentiable
  operator: training works), a pair of tensors goes to HF's original function.

Why this is safe with several models and threads: the positions travel with
the forward call itself (no global or thread-local state holds them), so two
models, patched or not, can run at once in different threads; the dispatcher
serves unpatched models of the same family unchanged, and it is installed while
at least one model of that family is patched (a count, under a lock) and HF's
function is put back when the last patch is undone. Patching a model twice, or
undoing twice, is a rope.Error.

The model types rope knows are ``SUPPORTED``; those that need forms rope does not
have yet are ``PENDING`` (refused with the reason); any other type is refused
with its name. The scaling types are those of rope.Config except ``dynamic``,
whose HF implementation keeps state between calls (the longest length seen)
that a stateless operator cannot reproduce.
"""

from __future__ import annotations

import importlib
import math
import threading
import weakref
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from . import ops
from ._config import Config, Error, _fail

#: model_type -> (modeling module under transformers.models, M-RoPE form: None, "contiguous", "interleaved").
#: The text configs of the vision-language models (``qwen2_vl_text``...) are accepted as their model.
SUPPORTED: Dict[str, Tuple[str, Optional[str]]] = {
    "llama": ("llama", None),
    "mistral": ("mistral", None),
    "qwen2": ("qwen2", None),
    "qwen3": ("qwen3", None),
    "qwen2_vl": ("qwen2_vl", "contiguous"),
    "qwen2_5_vl": ("qwen2_5_vl", "contiguous"),
    "qwen3_vl": ("qwen3_vl", "interleaved"),
    "phi3": ("phi3", None),
    "gpt_neox": ("gpt_neox", None),
}

#: model_type -> why rope does not patch it yet.
PENDING: Dict[str, str] = {
    "gemma3": "Gemma 3 gives each layer type its own RoPE (sliding and full attention) and normalises q and k "
              "(QK-norm) next to the rotation; rope has neither form yet",
    "deepseek_v3": "DeepSeek-V3's multi-head latent attention (MLA) rotates a separate rope part of q and k "
                   "through apply_rotary_pos_emb_interleave, which this drop-in does not patch yet (rope.Config has "
                   "the forms: rotary_offset, style 'interleaved_to_half', rope_type 'deepseek_yarn')",
}


class Angles:
    """What a patched rotary-embedding module returns (twice, in place of cos and sin): the
    positions of one forward call and the model's rope.Config. The patched
    ``apply_rotary_pos_emb`` rotates q and k by them; anything else that reads cos or sin
    gets this object instead of a tensor and fails loudly rather than silently.
    """

    __slots__ = ("config", "position_ids", "backend", "_ids")

    def __init__(self, config: Config, position_ids: Optional[torch.Tensor], backend: Optional[str]) -> None:
        self.config = config
        self.position_ids = position_ids
        self.backend = backend
        self._ids: Dict[int, Tuple[Any, int]] = {}  # batch -> (ids, max_position): once per forward, not per layer

    def ids_for(self, batch: int) -> Tuple[Any, int]:
        """The positions as rope's ``positions`` for q of ``batch`` sequences, and ``max_position``."""
        if batch not in self._ids:
            self._ids[batch] = self._convert(batch)
        return self._ids[batch]

    def _convert(self, batch: int) -> Tuple[Any, int]:
        ids = self.position_ids
        if ids is None:
            return None, 0
        axes = self.config.axes
        # HF: [batch or 1, seq]; M-RoPE [axes, batch or 1, seq]. A batch of 1 is shared by every
        # sequence (HF broadcasts its cos and sin): rope's one-row forms, [seq] or [axes, seq].
        if axes > 1:
            if ids.dim() != 3 or ids.shape[0] != axes:
                raise _fail("position_ids", tuple(ids.shape), f"must be [{axes}, batch, seq] for this M-RoPE model")
            if ids.shape[1] == 1 and batch != 1:
                ids = ids[:, 0]
        elif ids.dim() == 2 and ids.shape[0] == 1 and batch != 1:
            ids = ids[0]
        ids = ids.to(torch.int64).contiguous()
        # Only length-dependent scaling reads it (longrope here); on a device rope cannot read the ids.
        needs_length = self.config.scaling["rope_type"] == "longrope" and ids.numel() > 0
        return ids, (int(ids.max()) + 1 if needs_length else 0)


def _rotate(q: torch.Tensor, k: torch.Tensor, angles: Angles, unsqueeze_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    # HF's unsqueeze_dim says where q's heads axis is: 1 for [batch, heads, seq, dim], 2 for [batch, seq, heads, dim].
    layouts = {1: "bhsd", 2: "bshd", -3: "bhsd", -2: "bshd"}
    if unsqueeze_dim not in layouts:
        raise _fail("unsqueeze_dim", unsqueeze_dim,
                    "must be 1 (q as [batch, heads, seq, dim]) or 2 ([batch, seq, heads, dim])")
    ids, max_position = angles.ids_for(q.shape[0])
    return ops.rope(q, k, angles.config, positions=ids, layout=layouts[unsqueeze_dim], backend=angles.backend,
                    max_position=max_position)


# --- The modeling modules' apply_rotary_pos_emb: one dispatcher per module, counted --------------
_lock = threading.Lock()
_installed: Dict[str, Tuple[Any, Any, int]] = {}  # module name -> (HF's function, the dispatcher, patches alive)


def _dispatcher(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if isinstance(cos, Angles):
            # transformers 5 passes (q, k, cos, sin[, unsqueeze_dim]); older copies put position_ids first.
            unsqueeze_dim = kwargs.get("unsqueeze_dim", next((a for a in args if isinstance(a, int)), 1))
            return _rotate(q, k, cos, unsqueeze_dim)
        return original(q, k, cos, sin, *args, **kwargs)  # a model that is not patched: HF's own RoPE

    apply_rotary_pos_emb.__doc__ = "rope.hf's dispatcher: rope for a patched model, else HF's function:\n\n" + (
        original.__doc__ or "")
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _install(module_name: str) -> None:
    with _lock:
        if module_name in _installed:
            original, dispatcher, count = _installed[module_name]
            _installed[module_name] = (original, dispatcher, count + 1)
            return
        module = importlib.import_module(module_name)
        original = module.apply_rotary_pos_emb
        dispatcher = _dispatcher(original)
        module.apply_rotary_pos_emb = dispatcher
        _installed[module_name] = (original, dispatcher, 1)


def _uninstall(module_name: str) -> None:
    with _lock:
        original, dispatcher, count = _installed[module_name]
        if count > 1:
            _installed[module_name] = (original, dispatcher, count - 1)
            return
        del _installed[module_name]
        module = importlib.import_module(module_name)
        # Put HF's function back unless someone replaced ours since (theirs then stays; ours
        # still serves through it when it calls what it replaced).
        if module.apply_rotary_pos_emb is dispatcher:
            module.apply_rotary_pos_emb = original


# --- The model's rope.Config, from its rope_parameters -------------------------------------------
def config_for(model_type: str, rotary: torch.nn.Module) -> Config:
    """The rope.Config of a supported model's rotary-embedding module ``rotary`` (its ``config``
    is the model's text config), from ``rope_parameters`` as HF gives them, with HF's defaults
    where the dict leaves a value to the model config (head_dim, yarn's and longrope's factor,
    the M-RoPE sections).

    Raises:
        rope.Error: naming the model type and what rope cannot reproduce.
    """
    hf_config = rotary.config
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    if any(isinstance(v, Mapping) for v in parameters.values()):
        raise _fail("model_type", model_type, "one RoPE per layer type (rope_parameters is a dict of dicts): "
                    "rope.hf patches one RoPE per model")
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind == "dynamic":
        raise _fail("rope_parameters['rope_type']", kind, f"{model_type}: HF's dynamic NTK keeps the longest length "
                    "seen between calls (state a stateless operator cannot reproduce): not patched")
    if kind in ("yarn", "longrope") and parameters.get("factor") is None and parameters.get(
            "original_max_position_embeddings"):
        # HF's rule (modeling_rope_utils): the ratio of the two context lengths.
        parameters["factor"] = hf_config.max_position_embeddings / parameters["original_max_position_embeddings"]
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    form = SUPPORTED[model_type][1]
    sections = None
    if form is not None:
        # The module's own sections: HF falls back to a per-model default when the dict has none.
        sections = [int(s) for s in rotary.mrope_section]
        parameters.pop("mrope_section", None)
        parameters.pop("mrope_interleaved", None)  # Qwen3-VL interleaves whatever the dict says
    try:
        config = Config(head_dim=head_dim, scaling=parameters, mrope_section=sections,
                        mrope_interleaved=form == "interleaved")
    except Error as error:
        raise Error(f"{error} (model_type {model_type!r}, rope_parameters {parameters})") from None
    _check_frequencies(model_type, rotary, config)
    return config


def _check_frequencies(model_type: str, rotary: torch.nn.Module, config: Config) -> None:
    """The model's own inv_freq and attention scaling must be rope's: a setting rope reads
    differently from HF is refused here, at patch time, not found in the outputs."""
    inv_freq = getattr(rotary, "original_inv_freq", getattr(rotary, "inv_freq", None))
    if inv_freq is None or inv_freq.device.type == "meta":
        return
    ours, attention = config.frequencies()
    theirs = inv_freq.detach().float().cpu().tolist()
    # A model cast with .to(dtype) casts the buffer too: compare within that dtype's rounding.
    tolerance = 2e-7 if inv_freq.dtype in (torch.float32, torch.float64) else 2.0 * torch.finfo(inv_freq.dtype).eps
    if len(ours) != len(theirs) or any(abs(a - b) > tolerance * abs(b) for a, b in zip(ours, theirs)):
        raise _fail("model_type", model_type, f"rope's frequencies for {config!r} disagree with the model's "
                    "inv_freq: not patched")
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    if not math.isclose(attention, scaling, rel_tol=1e-6):
        raise _fail("model_type", model_type, f"rope's attention factor {attention} disagrees with the model's "
                    f"attention_scaling {scaling}: not patched")


# --- patch / unpatch -----------------------------------------------------------------------------
def _model_type(model: torch.nn.Module) -> str:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise _fail("model", type(model).__name__, "is not a transformers model (no config.model_type)")
    return model_type


def _family(model_type: str) -> str:
    base = model_type[:-len("_text")] if model_type.endswith("_text") else model_type
    if base in PENDING:
        raise _fail("model_type", model_type, PENDING[base] + ": not patched yet")
    if base not in SUPPORTED:
        raise _fail("model_type", model_type, "rope.hf does not know this model type; it patches "
                    + ", ".join(SUPPORTED))
    return base


def _rotary_modules(model: torch.nn.Module, package: str) -> list:
    """The model's rotary-embedding modules of the language model (a vision tower's are its own)."""
    return [m for m in model.modules() if type(m).__module__ == package and type(m).__name__.endswith(
        "RotaryEmbedding") and "Vision" not in type(m).__name__]


class Patch:
    """A model patched by :func:`patch`. ``undo()`` (or leaving a ``with`` block) restores HF's RoPE."""

    def __init__(self, model: torch.nn.Module, model_type: str, module_name: str, rotaries: list,
                 configs: list) -> None:
        self._model = weakref.ref(model)
        self.model_type = model_type
        self.module_name = module_name
        self._rotaries = rotaries
        #: The rope.Config of each patched rotary-embedding module.
        self.configs = configs
        self.active = True

    def undo(self) -> None:
        """Restores HF's RoPE on the model; a rope.Error if it was already undone."""
        with _lock:
            if not self.active:
                raise _fail("patch", self.model_type, "already undone")
            self.active = False
            model = self._model()
            if model is not None:
                _patches.pop(model, None)
        for rotary in self._rotaries:
            rotary.__dict__.pop("forward", None)
        _uninstall(self.module_name)

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self.undo()

    def __repr__(self) -> str:
        return f"rope.hf.Patch({self.model_type}, {'active' if self.active else 'undone'}, {self.configs})"


_patches: "weakref.WeakKeyDictionary[torch.nn.Module, Patch]" = weakref.WeakKeyDictionary()


def patch(model: torch.nn.Module, *, backend: Optional[str] = None) -> Patch:
    """Makes ``model`` (a transformers model, loaded or built from its config) rotate q and k with
    rope, in place; returns the :class:`Patch` whose ``undo()`` restores HF's RoPE.

    Args:
        model: a model of a type in ``SUPPORTED`` (any head: ForCausalLM, the base model,
            ForConditionalGeneration of the vision-language ones).
        backend: rope's backend (None: cuda-optimized on CUDA, cpu-eigen or cpu-naive on the host).

    Raises:
        rope.Error: a model type rope does not know or does not patch yet (named, with the
            reason), a RoPE setting rope does not reproduce, or a model already patched.
    """
    model_type = _model_type(model)
    family = _family(model_type)
    module_name = f"transformers.models.{SUPPORTED[family][0]}.modeling_{SUPPORTED[family][0]}"
    rotaries = _rotary_modules(model, module_name)
    if not rotaries:
        raise _fail("model", type(model).__name__, f"has no rotary-embedding module from {module_name}")
    configs = [config_for(family, rotary) for rotary in rotaries]
    with _lock:
        if model in _patches or any("forward" in r.__dict__ for r in rotaries):
            raise _fail("model", type(model).__name__, "is already patched (undo the patch first)")
        handle = Patch(model, model_type, module_name, rotaries, configs)
        _patches[model] = handle
    _install(module_name)
    for rotary, config in zip(rotaries, configs):
        rotary.forward = _rotary_forward(config, backend)
    return handle


def _rotary_forward(config: Config, backend: Optional[str]):
    def forward(x: torch.Tensor, position_ids: Optional[torch.Tensor] = None, *args: Any, **kwargs: Any):
        angles = Angles(config, position_ids, backend)
        return angles, angles  # where HF returns (cos, sin)

    return forward


def unpatch(model: torch.nn.Module) -> None:
    """Undoes :func:`patch` on ``model``; a rope.Error if it is not patched."""
    handle = _patches.get(model)
    if handle is None:
        raise _fail("model", type(model).__name__, "is not patched by rope.hf")
    handle.undo()


def is_patched(model: torch.nn.Module) -> bool:
    """Whether ``model`` is patched by :func:`patch` now."""
    return model in _patches
