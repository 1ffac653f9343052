"""rope.Config: what a model's RoPE is, from keywords or from a HuggingFace config's dict.

A HuggingFace model config describes RoPE in a dict: ``rope_parameters`` in
transformers 5, ``rope_scaling`` (plus ``rope_theta`` and
``partial_rotary_factor`` beside it) in transformers 4. Config accepts that
dict as it is, as ``scaling=``: every key rope knows maps to a field of
rope::RopeConfig (the table ``_SCALING_KEYS`` below), and a key rope does not
know is a rope.Error naming it, never silently ignored, because a setting rope
dropped would give a model a RoPE it was not trained with.
"""

from __future__ import annotations

import json
import operator
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from . import _rope

if TYPE_CHECKING:
    import numpy

Error = _rope.Error

# Key of the HF dict -> (field it sets, how its value is read). "config." fields
# belong to RopeConfig itself; the others to RopeConfig::scaling.
_SCALING_KEYS = {
    "rope_type": ("type", str),
    "type": ("type", str),  # transformers 4's older spelling of rope_type
    "factor": ("factor", float),
    "original_max_position_embeddings": ("original_max_position_embeddings", int),
    "attention_factor": ("attention_factor", float),
    "beta_fast": ("beta_fast", float),
    "beta_slow": ("beta_slow", float),
    "truncate": ("truncate", bool),
    "mscale": ("mscale", float),
    "mscale_all_dim": ("mscale_all_dim", float),
    "low_freq_factor": ("low_freq_factor", float),
    "high_freq_factor": ("high_freq_factor", float),
    "short_factor": ("short_factor", list),
    "long_factor": ("long_factor", list),
    "rope_theta": ("config.base", float),
    "partial_rotary_factor": ("config.partial_rotary_factor", float),
    "mrope_section": ("config.mrope_section", list),
    "mrope_interleaved": ("config.mrope_interleaved", bool),
}

# rope_type values that mean "no frequency scaling" (M-RoPE models write "mrope"
# in transformers 4; their sections are given by mrope_section).
_UNSCALED_TYPES = {"default": "default", "none": "default", "mrope": "default"}


def _fail(parameter: str, value: Any, reason: str) -> "Error":
    """A rope.Error worded as the C++ library words its own: ``parameter = value: reason``."""
    return Error(f"rope::Error: {parameter} = {value}: {reason}")


def _integer(parameter: str, value: Any) -> int:
    """``value`` as a Python int that fits rope's int64 fields, or a rope.Error naming ``parameter``.

    An int, a NumPy integer, or a float with an integral value (JSON configs write 8192.0);
    a number beyond int64 is refused here rather than by the binding's own TypeError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        number = operator.index(value)
    except TypeError:
        raise _fail(parameter, repr(value), "must be an integer") from None
    if not -(1 << 63) <= number < (1 << 63):
        raise _fail(parameter, number, "must fit in int64 (|value| < 2**63)")
    return number


def _read(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (float, int, bool, str, list of numbers), or a rope.Error naming ``key``."""
    where = f"scaling[{key!r}]"
    if kind is int:
        return _integer(where, value)
    if kind is list and not key.endswith("_factor") and isinstance(value, (list, tuple)):
        return [_integer(where, v) for v in value]
    try:
        if kind is bool:
            if not isinstance(value, (bool, int)):
                raise TypeError
            return bool(value)
        if kind is list:
            return [float(v) for v in value]
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise _fail(where, repr(value), f"must be {'a list of numbers' if kind is list else kind.__name__}") from None


def _parse_scaling(scaling: Mapping[str, Any]) -> dict:
    """The HF dict as {field: value} in rope's terms, checking every key."""
    fields: dict = {}
    for key, value in scaling.items():
        if isinstance(value, Mapping):
            raise _fail(f"scaling[{key!r}]", "a dict",
                        "one RoPE per call: pass the dict of one layer type, e.g. rope_parameters['full_attention']")
        if key not in _SCALING_KEYS:
            raise _fail(f"scaling[{key!r}]", repr(value),
                        "unknown key; rope reads " + ", ".join(_SCALING_KEYS))
        if value is None:  # HF writes null for an unset optional (e.g. attention_factor)
            continue
        field, kind = _SCALING_KEYS[key]
        parsed = _read(key, value, kind)
        if field in fields and fields[field] != parsed:
            raise _fail(f"scaling[{key!r}]", repr(value), f"disagrees with {fields[field]!r} given for the same field")
        fields[field] = parsed
    return fields


class Config:
    """What a model's RoPE is: rope::RopeConfig, built from keywords and a HuggingFace dict.

    Args:
        head_dim: features per head (the last axis of q and k).
        rotary_dim: features that rotate, from ``rotary_offset`` on (partial
            rotary); None or 0 means the rest of the head. A ``partial_rotary_factor`` in
            ``scaling`` gives int(head_dim * factor), as HuggingFace computes it.
        rotary_offset: first feature of the rotary window ``[rotary_offset, rotary_offset +
            rotary_dim)``; the features outside it keep their bits. DeepSeek's MLA q head is
            ``[nope 128 | pe 64]``: ``rotary_offset=128, rotary_dim=64`` (default 0).
        base: ``rope_theta`` (default 10000); may come from ``scaling['rope_theta']``.
        style: ``"neox"`` (half-split, HuggingFace's rotate_half), ``"gptj"`` (interleaved),
            ``"interleaved_to_half"`` (HF's DeepSeek ``apply_rotary_pos_emb_interleave``:
            pairs (2i, 2i+1) read, written to (i, i + rotary_dim/2)), or its reverse
            ``"half_to_interleaved"``. The inverse rotation (the backward pass) of a style
            that reorders reads where its forward wrote: the exact transpose.
        scaling: a HuggingFace ``rope_parameters`` / ``rope_scaling`` dict, as is:
            rope_type (or type), factor, original_max_position_embeddings,
            attention_factor, beta_fast, beta_slow, truncate, mscale (rope_type
            ``"deepseek_yarn"``: DeepSeek's YaRN, see ``softmax_scale_multiplier``),
            mscale_all_dim, low_freq_factor, high_freq_factor, short_factor,
            long_factor, rope_theta, partial_rotary_factor, mrope_section,
            mrope_interleaved. Any other key raises rope.Error.
        precise_angles: form each angle in double and reduce it before sin/cos
            (accurate at any position; default off, as HuggingFace computes).
        mrope_section: M-RoPE pairs per axis (temporal, height, width), e.g. [16, 24, 24].
        mrope_interleaved: Qwen3-VL's interleaved M-RoPE instead of contiguous sections.
        axial_sections: axial (vision) RoPE: pairs per axis, each axis a RoPE of its own.

    Raises:
        rope.Error: naming the first field out of range or the unknown key.
    """

    def __init__(self, head_dim: int, rotary_dim: Optional[int] = None, base: Optional[float] = None,
                 style: str = "neox", scaling: Optional[Mapping[str, Any]] = None, precise_angles: bool = False,
                 mrope_section: Optional[Sequence[int]] = None, mrope_interleaved: bool = False,
                 axial_sections: Optional[Sequence[int]] = None, rotary_offset: int = 0) -> None:
        fields = _parse_scaling(scaling or {})
        # A keyword and a dict entry for the same thing must agree.
        base = _agree("base", base, "rope_theta", fields.pop("config.base", None))
        factor = fields.pop("config.partial_rotary_factor", None)
        head_dim = _integer("head_dim", head_dim)
        from_factor = None if factor is None else int(head_dim * factor)
        rotary_dim = _agree("rotary_dim", rotary_dim or None, "partial_rotary_factor", from_factor)
        mrope_section = _agree("mrope_section", list(mrope_section) if mrope_section else None, "mrope_section",
                               fields.pop("config.mrope_section", None))
        mrope_interleaved = bool(mrope_interleaved or fields.pop("config.mrope_interleaved", False))

        native = _rope.RopeConfig()
        native.head_dim = head_dim
        native.rotary_dim = _integer("rotary_dim", rotary_dim or 0)
        native.rotary_offset = _integer("rotary_offset", rotary_offset or 0)
        try:
            native.base = float(10000.0 if base is None else base)
        except (TypeError, ValueError, OverflowError):
            raise _fail("base", repr(base), "must be a number") from None
        native.style = _rope.parse_style(style)
        native.precise_angles = bool(precise_angles)
        native.scaling = _native_scaling(fields)
        if mrope_section and axial_sections:
            raise _fail("axial_sections", list(axial_sections), "give mrope_section or axial_sections, not both")
        if mrope_section:
            native.assignment = (_rope.AxisAssignment.mrope_interleaved if mrope_interleaved
                                 else _rope.AxisAssignment.mrope_contiguous)
            native.sections = [_integer("mrope_section", s) for s in mrope_section]
        elif mrope_interleaved:
            raise _fail("mrope_interleaved", True, "needs mrope_section")
        elif axial_sections:
            native.assignment = _rope.AxisAssignment.axial
            native.sections = [_integer("axial_sections", s) for s in axial_sections]
        native.validate()
        self._set_native(native)

    def _set_native(self, native: "_rope.RopeConfig") -> None:
        self._native = native
        self._key = json.dumps(self._as_dict(), sort_keys=True)

    # --- What it is, read back -----------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Features per head."""
        return self._native.head_dim

    @property
    def rotary_dim(self) -> int:
        """Features that rotate (head_dim when the whole head does)."""
        return self._native.effective_rotary_dim()

    @property
    def rotary_offset(self) -> int:
        """First feature of the rotary window (0: the window starts the head)."""
        return self._native.rotary_offset

    @property
    def base(self) -> float:
        """rope_theta."""
        return self._native.base

    @property
    def style(self) -> str:
        """"neox" (half-split), "gptj" (interleaved), "interleaved_to_half" (HF's DeepSeek order) or
        "half_to_interleaved"."""
        return _rope.style_name(self._native.style)

    @property
    def scaling(self) -> dict:
        """The frequency scaling in HuggingFace's keys (only those its rope_type reads, plus rope_type)."""
        s = self._native.scaling
        kind = _rope.scaling_type_name(s.type)
        out: dict = {"rope_type": kind}
        if kind == "default":
            return out
        out["factor"] = s.factor
        if kind != "linear":
            out["original_max_position_embeddings"] = s.original_max_position_embeddings
        if s.attention_factor is not None:
            out["attention_factor"] = s.attention_factor
        if kind in ("yarn", "deepseek_yarn"):
            out.update(beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate, mscale=s.mscale,
                       mscale_all_dim=s.mscale_all_dim)
        if kind == "llama3":
            out.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
        if kind == "longrope":
            out.update(short_factor=list(s.short_factor), long_factor=list(s.long_factor))
        return out

    @property
    def softmax_scale_multiplier(self) -> float:
        """What DeepSeek's attention multiplies its softmax scale by: ``yarn_get_mscale(factor,
        mscale_all_dim) ** 2`` for rope_type deepseek_yarn and yarn (HF's DeepSeek configs say yarn),
        1 otherwise; about 1.874 for DeepSeek-V3 (factor 40, mscale_all_dim 1). rope cannot apply
        it (it belongs to the attention, ``scale = qk_head_dim ** -0.5 * multiplier``, as HF's
        DeepseekV3Attention.scaling): the caller must. Forgetting it is a known source of wrong
        outputs that raise no error."""
        return _rope.softmax_scale_multiplier(self._native.scaling)

    @property
    def precise_angles(self) -> bool:
        """Whether angles are formed in double and reduced before sin/cos."""
        return self._native.precise_angles

    @property
    def mrope_section(self) -> Optional[list]:
        """M-RoPE pairs per axis, or None."""
        a = self._native.assignment
        mrope = (_rope.AxisAssignment.mrope_contiguous, _rope.AxisAssignment.mrope_interleaved)
        return list(self._native.sections) if a in mrope else None

    @property
    def mrope_interleaved(self) -> bool:
        """Whether M-RoPE sections are interleaved (Qwen3-VL)."""
        return self._native.assignment == _rope.AxisAssignment.mrope_interleaved

    @property
    def axial_sections(self) -> Optional[list]:
        """Axial RoPE pairs per axis, or None."""
        axial = self._native.assignment == _rope.AxisAssignment.axial
        return list(self._native.sections) if axial else None

    @property
    def axes(self) -> int:
        """Position axes a token has: 1, or the number of sections (M-RoPE: 3)."""
        sections = self._native.sections
        return len(sections) if sections else 1

    def frequencies(self, max_position: int = 0) -> "tuple[list[float], float]":
        """``(inv_freq, attention_factor)``: theta_i (float32) and the factor on cos and sin that
        every backend uses for a call whose largest position + 1 is ``max_position``
        (it matters for dynamic and longrope only)."""
        return _rope.frequency_table(self._native, _integer("max_position", max_position))

    def cos_sin_cache(self, rows: int, max_position: int = 0) -> "numpy.ndarray":
        """The float32 ``[rows, rotary_dim]`` cos/sin table of this Config, in vLLM's layout
        (row ``p``: cos of each pair at position ``p``, then sin), for ``rope.apply``'s
        ``cos_sin_cache``; rope::make_cos_sin_cache.

        Every scaling type's frequencies and attention factor are in it (cos and sin
        times the attention factor, as vLLM folds in yarn's and longrope's), and the
        angles are computed as the backends compute them (``precise_angles`` included),
        so ``rope.apply(q, k, config, cos_sin_cache=config.cos_sin_cache(rows))`` rotates
        as ``rope.apply(q, k, config)`` does. With several axes (M-RoPE, axial) each pair
        reads the row of its own axis's position.

        Args:
            rows: positions the table covers, 0 to ``rows - 1`` (vLLM's max_position); > 0,
                and ``rows * rotary_dim`` at most 2**31.
            max_position: dynamic and longrope scaling only, and required there: the largest
                position + 1 of the calls the table serves (their frequencies depend on it).

        Raises:
            rope.Error: naming ``rows`` or ``max_position`` and its value when out of range.
        """
        return _rope.cos_sin_cache(self._native, _integer("rows", rows), _integer("max_position", max_position))

    # --- Identity: the PyTorch operator passes a Config as this string ---------------
    @property
    def key(self) -> str:
        """A JSON string that describes this Config completely; ``Config.from_key(key)`` rebuilds it."""
        return self._key

    @staticmethod
    def from_key(key: str) -> "Config":
        """The Config whose ``key`` is ``key`` (cached: the PyTorch operator calls it on every call)."""
        return _config_from_key(key)

    def _as_dict(self) -> dict:
        return dict(head_dim=self.head_dim, rotary_dim=self.rotary_dim, rotary_offset=self.rotary_offset,
                    base=self.base, style=self.style,
                    scaling=self.scaling, precise_angles=self.precise_angles, mrope_section=self.mrope_section,
                    mrope_interleaved=self.mrope_interleaved, axial_sections=self.axial_sections)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        fields = {k: v for k, v in self._as_dict().items() if v not in (None, False)}
        if fields["scaling"] == {"rope_type": "default"}:
            del fields["scaling"]
        return "rope.Config(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def _agree(name: str, given: Any, key: str, from_dict: Any) -> Any:
    """The value of a setting given as a keyword, in the dict, or both (then they must agree)."""
    if given is not None and from_dict is not None and given != from_dict:
        raise _fail(name, given, f"disagrees with scaling[{key!r}] (which gives {from_dict}): give one of them")
    return from_dict if given is None else given


def _native_scaling(fields: dict) -> "_rope.Scaling":
    """rope::Scaling from the parsed dict fields."""
    scaling = _rope.Scaling()
    kind = fields.pop("type", "default")
    scaling.type = _rope.parse_scaling_type(_UNSCALED_TYPES.get(kind, kind))
    for field, value in fields.items():
        setattr(scaling, field, value)  # Ranges are rope's to check: RopeConfig.validate() names the field.
    return scaling


@lru_cache(maxsize=256)
def _config_from_key(key: str) -> Config:
    # Read in C++ (python/src/config_key.cpp), by the same code as the PyTorch
    # operator's C++ kernel reads it: the two cannot disagree on what a key means.
    config = Config.__new__(Config)
    config._set_native(_rope.config_from_key(key))
    return config
