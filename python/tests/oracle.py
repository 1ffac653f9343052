"""RoPE in float64 with NumPy: what the Python tests compare rope against.

Written from the formula, independently of rope: its own frequencies, its own
pairing, its own rotation, its own reading of every positions form. Nothing
here calls rope. Tensors are handled in logical order [batch, heads, seq, dim];
``to_logical`` turns any layout into it.
"""

import numpy as np


# --- Layouts ------------------------------------------------------------------------------
def to_logical(x, layout):
    """[batch, heads, seq, dim] float64 from an array in ``layout`` (thd: batch 1)."""
    x = np.asarray(x, dtype=np.float64)
    if layout == "bshd":
        return x.transpose(0, 2, 1, 3)
    if layout == "thd":
        return x.transpose(1, 0, 2)[None]
    return x


# --- Frequencies --------------------------------------------------------------------------
def theta(rotary_dim, base, linear_factor=1.0):
    """theta_i = base^(-2i/d) / factor, i = 0 .. d/2 - 1 (RoFormer; linear scaling divides)."""
    i = np.arange(rotary_dim // 2, dtype=np.float64)
    return base ** (-2.0 * i / rotary_dim) / linear_factor


def pair_axes(pairs, assignment="single", sections=()):
    """The position axis each pair turns with (M-RoPE, axial), as the model papers define it."""
    if assignment == "single":
        return np.zeros(pairs, dtype=np.int64)
    if assignment in ("mrope", "axial"):  # contiguous runs: sections[0] pairs on axis 0, ...
        return np.repeat(np.arange(len(sections)), sections)
    # mrope-interleaved (Qwen3-VL): height on j % 3 == 1, width on j % 3 == 2, within 3*section.
    axes = np.zeros(pairs, dtype=np.int64)
    for j in range(pairs):
        if j % 3 == 1 and j < 3 * sections[1]:
            axes[j] = 1
        elif j % 3 == 2 and j < 3 * sections[2]:
            axes[j] = 2
    return axes


def axial_theta(base, sections):
    """Axial RoPE: each axis a RoPE of its own over 2*sections[a] features (index restarts)."""
    return np.concatenate([base ** (-np.arange(n, dtype=np.float64) / n) for n in sections])


# --- Positions ----------------------------------------------------------------------------
def offset_positions(batch, seq, offset=0):
    """[1, batch, seq]: offset, offset+1, ... for every sequence."""
    return np.broadcast_to(np.arange(offset, offset + seq, dtype=np.int64), (1, batch, seq))


def ids_positions(ids, batch, axes=1):
    """[axes, batch, seq] from ids shaped [seq], [batch, seq], [axes, seq] or [axes, batch, seq]."""
    ids = np.asarray(ids, dtype=np.int64)
    if axes == 1:
        ids = ids[None]
    if ids.ndim == 2:
        ids = ids[:, None, :]
    return np.broadcast_to(ids, (ids.shape[0], batch, ids.shape[-1]))


def cp_shard(full_positions, cp_size, rank):
    """The positions a context-parallel rank holds: chunks rank and 2*cp_size-1-rank of 2*cp_size."""
    chunks = np.split(np.asarray(full_positions), 2 * cp_size)
    return np.concatenate([chunks[rank], chunks[2 * cp_size - 1 - rank]])


def packed_positions(cu_seqlens, starts=None, cp_size=1, rank=0):
    """[1, 1, tokens]: token t of sequence b at t - cu_seqlens[b] + starts[b], per shard when cp_size > 1."""
    pieces = []
    for b in range(len(cu_seqlens) - 1):
        length = cu_seqlens[b + 1] - cu_seqlens[b]
        start = 0 if starts is None else starts[b]
        full = start + np.arange(length * cp_size, dtype=np.int64)
        pieces.append(cp_shard(full, cp_size, rank) if cp_size > 1 else full)
    return np.concatenate(pieces)[None, None, :]


# --- The rotation ---------------------------------------------------------------------------
def pairs_of(style, rotary_dim):
    """(first, second) feature index of each pair: half-split (i, i + d/2) or interleaved (2i, 2i+1)."""
    i = np.arange(rotary_dim // 2)
    return (i, i + rotary_dim // 2) if style == "neox" else (2 * i, 2 * i + 1)


def rotate_cos_sin(x, cos, sin, style, rotary_dim, inverse=False):
    """x [b, h, s, d] with pair i of token (b, s) turned by cos/sin [b, s, pairs]; the rest passed through."""
    first, second = pairs_of(style, rotary_dim)
    cos, sin = cos[:, None], sin[:, None]  # the same for every head
    if inverse:
        sin = -sin
    out = np.array(x, dtype=np.float64, copy=True)
    a, b = out[..., first].copy(), out[..., second].copy()
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


def rope(x, positions, theta_per_pair, style="neox", rotary_dim=None, inverse=False, axes_of_pairs=None, scale=1.0):
    """RoPE of x [b, h, s, d] at positions [axes, b, s]: angle = position(axis of pair) * theta_i."""
    rotary_dim = rotary_dim or x.shape[-1]
    pairs = rotary_dim // 2
    axes_of_pairs = np.zeros(pairs, dtype=np.int64) if axes_of_pairs is None else axes_of_pairs
    positions = np.asarray(positions, dtype=np.float64)
    batch, seq = x.shape[0], x.shape[2]
    angles = np.empty((batch, seq, pairs))
    for i in range(pairs):
        angles[:, :, i] = np.broadcast_to(positions[axes_of_pairs[i]], (batch, seq)) * theta_per_pair[i]
    return rotate_cos_sin(x, scale * np.cos(angles), scale * np.sin(angles), style, rotary_dim, inverse)


def rope_from_table(x, positions, table, style="neox", rotary_dim=None, inverse=False):
    """RoPE of x [b, h, s, d] with cos/sin read from a [rows, rotary_dim] table (cos then sin)."""
    rotary_dim = rotary_dim or x.shape[-1]
    pairs = rotary_dim // 2
    rows = np.broadcast_to(np.asarray(positions)[0], (x.shape[0], x.shape[2]))
    table = np.asarray(table, dtype=np.float64)
    return rotate_cos_sin(x, table[rows, :pairs], table[rows, pairs:], style, rotary_dim, inverse)


# --- Distances ------------------------------------------------------------------------------
def relative_l2(got, want):
    """||got - want|| / ||want|| (inf when got holds a NaN: an unwritten output fails)."""
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return np.inf
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def max_abs(got, want):
    got = np.asarray(got, dtype=np.float64)
    return float(np.max(np.abs(got - want))) if np.all(np.isfinite(got)) else np.inf


# Tolerances (relative L2, max abs) against float64, by storage type, for
# positions below ~1000 and values in [-1, 1): float32 angles carry a relative
# rounding near 6e-8, so an absolute angle error up to ~6e-5 radians at position
# 1000 (the max-abs bound), ~1e-6 relative on average; float16 and bfloat16 add
# the rounding of the stored result (2^-11 and 2^-8 relative per element).
TOLERANCE = {"float32": (5e-6, 1.5e-4), "float16": (1e-3, 4e-3), "bfloat16": (8e-3, 3e-2)}
