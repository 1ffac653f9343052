#!/usr/bin/env python3
"""Writes tests/golden/: RoPE inputs and outputs computed by HuggingFace transformers itself.

    python3 scripts/make_golden_hf.py [OUTDIR]      (default: tests/golden; needs PyTorch and transformers 5)

OUTDIR/hf_*.txt: text RoPE (tests/golden_test.cpp); OUTDIR/scaling/: scaled RoPE (tests/scaling_test.cpp:
the frequency table and every backend); OUTDIR/multiaxis/: M-RoPE and axial RoPE (tests/golden_test.cpp).
The numbers come from transformers' own code, independent of rope's:
    half-split:  LlamaRotaryEmbedding + modeling_llama.apply_rotary_pos_emb
    interleaved: GPT-J's create_sinusoidal_positions + apply_rotary_pos_emb (rotate_every_two)
    scaled:      LlamaRotaryEmbedding (ROPE_INIT_FUNCTIONS[rope_type], and the dynamic / longrope updates
                 from max(position_ids) + 1), with positions past original_max_position_embeddings
    M-RoPE:      Qwen2-VL's, Qwen3-VL's and GLM-4.1V's text rotary modules and apply_rotary_pos_emb, on
                 distinct temporal, height and width rows (an image and a video after text)
    axial:       Qwen2VLVisionRotaryEmbedding + apply_rotary_pos_emb_vision, positions from
                 vision_utils.get_vision_position_ids (row, column; block-major over 2 x 2 merges)

A file is a comment line, then one `key: value` per line: text fields, per-pair lists (exact reprs) and
tensors (float32, in layout order), numbers separated by spaces. Beyond source, style, layout, base,
head_dim, rotary_dim, q_shape, k_shape, position_rows (rows of the positions line; 0: none) and the tensors:
    scaled:     rope_type, factor and the type's other fields, exactly as given; given_attention_factor (set
                in the config); position_offset (no positions line: the ids are position_offset + s);
                inv_freq, attention_factor (what transformers used, after its updates); seq_len
                (max(position_ids) + 1, what the updates looked at); max_position_embeddings (the config's)
    multi-axis: assignment (rope's AxisAssignment name); sections (pairs per axis); position_axes (the
                positions line holds ids [position_axes, position_rows, seq], rope::Positions::multi_axis's
                layout; position_rows 1: shared by the batch); layout thd: q and k are [tokens, heads,
                head_dim], their shapes written as "tokens heads head_dim 1"
"""
import inspect
import itertools
import math
import os
import sys

import torch
import transformers
from transformers import LlamaConfig, vision_utils
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.glm4v import modeling_glm4v
from transformers.models.glm4v.configuration_glm4v import Glm4vTextConfig
from transformers.models.gptj import modeling_gptj
from transformers.models.llama import modeling_llama
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

HEADER = "RoPE golden vectors computed by HuggingFace transformers; see scripts/make_golden_hf.py"
SCALED_HEADER = "Scaled " + HEADER
MULTI_AXIS_HEADER = "Multi-axis " + HEADER


# --- The format, the inputs, Llama's rotation -------------------------------------------------------------

def random_qk(seed, q_shape, k_shape):
    """q and k of standard normal values from a generator seeded with @p seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*q_shape, generator=g), torch.randn(*k_shape, generator=g)


def case_meta(what, style, layout, base, head_dim, rotary_dim, **more):
    """The text fields every golden file starts with; @p what: the transformers code that computed it."""
    return {"source": f"transformers {transformers.__version__} (torch {torch.__version__}): {what}",
            "style": style, "layout": layout, "base": repr(float(base)), "head_dim": head_dim,
            "rotary_dim": rotary_dim, **more}


def shapes(q, k):
    return {"q_shape": " ".join(map(str, q.shape)), "k_shape": " ".join(map(str, k.shape))}


def numbers(values, fmt="{:.9g}"):
    """Space-separated numbers: floats to 9 significant digits, enough to round-trip a float32."""
    return " ".join(fmt.format(v) for v in values)


def write_case(path, header, meta, tensors, lists=None):
    """Writes one golden file: the comment line @p header, then meta, lists and tensors."""
    with open(path, "w") as f:
        f.write(f"# {header}\n")
        for key, value in meta.items():
            f.write(f"{key}: {value}\n")
        for key, values in (lists or {}).items():
            f.write(f"{key}: {numbers(values, '{!r}')}\n")
        for name, t in tensors.items():
            f.write(f"{name}: " + numbers(t.detach().to(torch.float32).contiguous().view(-1).tolist()) + "\n")
    print("wrote", path)


def llama_config(head_dim, rope_parameters, partial=1.0, max_position_embeddings=4096):
    """A 4-head LlamaConfig whose RoPE settings are @p rope_parameters (transformers 5's form)."""
    if partial != 1.0:
        rope_parameters = {**rope_parameters, "partial_rotary_factor": partial}
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=4, head_dim=head_dim,
                       max_position_embeddings=max_position_embeddings, rope_parameters=dict(rope_parameters))


def default_inv_freq(base, rotary_dim):
    """theta_i = base^(-2i / rotary_dim) in float64: the unscaled frequencies."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def llama_rotate(q, k, cos, sin, rotary_dim):
    """q and k rotated by Llama's own apply_rotary_pos_emb (half-split); features past rotary_dim pass through."""
    q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin)
    return torch.cat([q_rot, q[..., rotary_dim:]], dim=-1), torch.cat([k_rot, k[..., rotary_dim:]], dim=-1)


# --- Text RoPE: Llama (half-split) and GPT-J (interleaved) --------------------------------------------------

def llama_case(out, name, batch, q_heads, k_heads, seq, head_dim, base, partial=1.0, positions=None, seed=0):
    q, k = random_qk(seed, (batch, q_heads, seq, head_dim), (batch, k_heads, seq, head_dim))
    position_ids = torch.arange(seq).unsqueeze(0).expand(batch, seq) if positions is None else positions
    config = llama_config(head_dim, {"rope_type": "default", "rope_theta": base}, partial)
    rotary = modeling_llama.LlamaRotaryEmbedding(config=config)
    rotary_dim = rotary.inv_freq.numel() * 2
    assert torch.allclose(rotary.inv_freq.double(), default_inv_freq(base, rotary_dim), rtol=1e-6), \
        "config's rope_theta was not taken"
    cos, sin = rotary(q, position_ids)  # [batch, seq, rotary_dim]
    q_out, k_out = llama_rotate(q, k, cos, sin, rotary_dim)
    meta = case_meta("LlamaRotaryEmbedding + modeling_llama.apply_rotary_pos_emb", "neox", "bhsd", base, head_dim,
                     rotary_dim, **shapes(q, k), position_rows=0 if positions is None else position_ids.shape[0])
    tensors = {} if positions is None else {"positions": position_ids.to(torch.float32)}
    write_case(os.path.join(out, name), HEADER, meta, {**tensors, "q": q, "k": k, "q_out": q_out, "k_out": k_out})


def gptj_case(out, name, batch, heads, seq, head_dim, rotary_dim, seed=0):
    """GPT-J: q and k as [batch, seq, heads, head_dim], the first rotary_dim features in interleaved pairs.
    Its create_sinusoidal_positions has base 10000 built in."""
    q, k = random_qk(seed, (batch, seq, heads, head_dim), (batch, seq, heads, head_dim))
    sincos = modeling_gptj.create_sinusoidal_positions(seq, rotary_dim)[torch.arange(seq).expand(batch, seq)]
    sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)

    def rotate(x):
        return torch.cat([modeling_gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos), x[..., rotary_dim:]], -1)
    meta = case_meta("gptj create_sinusoidal_positions + modeling_gptj.apply_rotary_pos_emb", "gptj", "bshd",
                     10000.0, head_dim, rotary_dim, **shapes(q, k), position_rows=0)
    write_case(os.path.join(out, name), HEADER, meta, {"q": q, "k": k, "q_out": rotate(q), "k_out": rotate(k)})


def text_cases(out):
    # The founding example's form (half-split, base 10000, positions 0..seq-1), small.
    llama_case(out, "hf_llama_neox_base10000.txt", batch=2, q_heads=4, k_heads=4, seq=16, head_dim=64, base=10000.0,
               seed=1)
    # Llama 3's base, head_dim 128, grouped-query k, explicit positions far from 0.
    ids = torch.tensor([[1000 + 3 * s for s in range(8)], [7 * s for s in range(8)]])
    llama_case(out, "hf_llama_gqa_base500000_positions.txt", batch=2, q_heads=4, k_heads=2, seq=8, head_dim=128,
               base=500000.0, positions=ids, seed=2)
    # Partial rotary (half of the head rotates), as Phi and StableLM configure it.
    llama_case(out, "hf_llama_partial_rotary.txt", batch=1, q_heads=2, k_heads=2, seq=12, head_dim=64, base=10000.0,
               partial=0.5, seed=3)
    # GPT-J: interleaved pairs, [batch, seq, heads, dim], rotary_dim 32 of 64.
    gptj_case(out, "hf_gptj_interleaved_partial.txt", batch=2, heads=3, seq=10, head_dim=64, rotary_dim=32, seed=4)


# --- Scaled RoPE ------------------------------------------------------------------------------------------

def check_taken(config, rope_fields):
    """Fails if transformers dropped or changed a field: a golden file must describe what was computed."""
    taken = config.rope_parameters
    for key, value in rope_fields.items():
        if key not in taken or taken[key] != value:
            raise RuntimeError(f"transformers {transformers.__version__} dropped or changed {key!r}: {taken}")
    if rope_fields.get("truncate") is False and "truncate" not in inspect.getsource(ROPE_INIT_FUNCTIONS["yarn"]):
        raise RuntimeError(f"transformers {transformers.__version__}'s yarn ignores `truncate`")


def scaling_case(out, name, rope_fields, head_dim=64, base=10000.0, partial=1.0, ids=None, offset=None,
                 batch=2, q_heads=2, k_heads=1, seq=4, max_position_embeddings=None, seed=0):
    """q, k [batch, heads, seq, head_dim] rotated by transformers with @p rope_fields; positions are
    explicit @p ids [batch, seq] or @p offset + s in every sequence."""
    rope_type = rope_fields["rope_type"]
    original_max = rope_fields.get("original_max_position_embeddings")
    if max_position_embeddings is None:
        # The checkpoint convention: the extended context is factor x the original one. Some transformers
        # versions derive yarn's and longrope's factor from this ratio; exact, it is the factor in the file.
        max_position_embeddings = int(round(rope_fields["factor"] * original_max)) if original_max else 4096
    config = llama_config(head_dim, {"rope_theta": base, **rope_fields}, partial, max_position_embeddings)
    check_taken(config, rope_fields)

    q, k = random_qk(seed, (batch, q_heads, seq, head_dim), (batch, k_heads, seq, head_dim))
    if ids is not None:
        position_ids = torch.tensor(ids, dtype=torch.int64)
        assert position_ids.shape == (batch, seq)
    else:
        position_ids = (offset + torch.arange(seq, dtype=torch.int64)).unsqueeze(0).expand(batch, seq)
    seq_len = int(position_ids.max()) + 1

    rotary = modeling_llama.LlamaRotaryEmbedding(config=config)
    cos, sin = rotary(q, position_ids)  # The forward pass applies the dynamic / longrope update.
    inv_freq = rotary.inv_freq.detach().clone().to(torch.float32)
    attention_factor = float(rotary.attention_scaling)
    rotary_dim = inv_freq.numel() * 2
    assert rotary_dim == int(head_dim * partial), f"rotary_dim {rotary_dim} != head_dim * partial_rotary_factor"

    # The same frequencies from the init function itself, given the call's length.
    direct_inv_freq, direct_attention = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), seq_len=seq_len)
    assert torch.allclose(direct_inv_freq.to(torch.float32), inv_freq, rtol=1e-6, atol=0), \
        f"{name}: LlamaRotaryEmbedding's inv_freq differs from ROPE_INIT_FUNCTIONS[{rope_type!r}]"
    assert math.isclose(float(direct_attention), attention_factor, rel_tol=1e-12), \
        f"{name}: attention factors differ: {direct_attention} vs {attention_factor}"
    # The scaling must matter here (but for dynamic within the original context), else the file tests nothing.
    changed = not torch.allclose(inv_freq.double(), default_inv_freq(base, rotary_dim), rtol=1e-5)
    changed = changed or attention_factor != 1.0
    expect_default = name.endswith("_short.txt") and rope_type == "dynamic"
    assert changed != expect_default, f"{name}: scaling {'changed' if changed else 'did not change'} the frequencies"

    q_out, k_out = llama_rotate(q, k, cos, sin, rotary_dim)
    meta = case_meta(f"LlamaRotaryEmbedding (ROPE_INIT_FUNCTIONS[{rope_type}]) + modeling_llama.apply_rotary_pos_emb",
                     "neox", "bhsd", base, head_dim, rotary_dim, **shapes(q, k),
                     position_rows=batch if ids is not None else 0)
    if ids is None:
        meta["position_offset"] = offset
    lists = {}
    for key, value in rope_fields.items():
        if key in ("short_factor", "long_factor"):
            lists[key] = value
        elif key == "attention_factor":
            meta["given_attention_factor"] = repr(float(value))
        elif key == "truncate":
            meta[key] = "true" if value else "false"
        else:
            meta[key] = value if isinstance(value, str) else repr(value)
    meta.update(max_position_embeddings=max_position_embeddings, seq_len=seq_len,
                attention_factor=repr(attention_factor))
    tensors = {"inv_freq": inv_freq, **({"positions": position_ids.to(torch.float32)} if ids is not None else {})}
    tensors.update(q=q, k=k, q_out=q_out, k_out=k_out)
    write_case(os.path.join(out, name), SCALED_HEADER, meta, tensors, lists)


def scaled_cases(out):
    # Explicit ids well past the original context (256 or 512), two rows.
    far = [[0, 1, 300, 4095], [17, 255, 1024, 3000]]

    # linear: every theta_i / factor.
    scaling_case(out, "hf_scaling_linear.txt", {"rope_type": "linear", "factor": 4.0}, ids=far, seed=11)

    # dynamic NTK, within the original context: max(position_ids) + 1 = 512 = original, unscaled.
    scaling_case(out, "hf_scaling_dynamic_short.txt",
                 {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 512},
                 ids=[[0, 1, 100, 300], [2, 50, 399, 511]], max_position_embeddings=512, seed=12)
    # dynamic NTK past it (positions 2000..2003, original 256), with partial rotary (dim = 32 of 64).
    scaling_case(out, "hf_scaling_dynamic_long.txt",
                 {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 256},
                 partial=0.5, offset=2000, max_position_embeddings=256, seed=13)

    # yarn with transformers' defaults (beta_fast 32, beta_slow 1, truncate, attention 0.1 ln(factor) + 1).
    scaling_case(out, "hf_scaling_yarn.txt",
                 {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
                 head_dim=128, ids=far, seed=14)
    # yarn as DeepSeek configures it: mscale / mscale_all_dim, other betas, no truncation.
    scaling_case(out, "hf_scaling_yarn_mscale_notruncate.txt",
                 {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                  "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False, "mscale": 0.707, "mscale_all_dim": 1.0},
                 ids=far, seed=15)
    # yarn with an explicit attention_factor and partial rotary (dim = 48 of 64).
    scaling_case(out, "hf_scaling_yarn_attention_factor.txt",
                 {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256,
                  "attention_factor": 0.8},
                 partial=0.75, ids=far, seed=16)

    # llama3 (Llama 3.1's factor 8, low 1, high 4, base 500000) with a small original context.
    scaling_case(out, "hf_scaling_llama3.txt",
                 {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 512},
                 head_dim=128, base=500000.0, ids=far, seed=17)

    # longrope: per-pair factors; short ones while max(position_ids) + 1 <= original (256 here, exactly),
    # long ones past it. Attention factor sqrt(1 + ln(4) / ln(256)) from factor = 1024 / 256.
    pairs = 32
    short_factor = [round(1.0 + 0.5 * (i / (pairs - 1)) ** 2, 4) for i in range(pairs)]
    long_factor = [round(1.0 + 15.0 * (i / (pairs - 1)) ** 1.5, 4) for i in range(pairs)]
    longrope = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 256,
                "short_factor": short_factor, "long_factor": long_factor}
    scaling_case(out, "hf_scaling_longrope_short.txt", longrope, ids=[[0, 1, 128, 255], [3, 64, 200, 254]], seed=18)
    scaling_case(out, "hf_scaling_longrope_long.txt", longrope, offset=1000, seed=19)



# --- Multi-axis RoPE ---------------------------------------------------------------------------------------

def prompt_ids(parts, start=0):
    """M-RoPE ids [3][tokens] of one prompt, built as Qwen2-VL's get_rope_index builds them. A part is text
    (a token count: the three rows advance together) or vision (frames, height, width, interval: temporal
    at + frame x interval, height at + row, width at + column), where `at` is the largest id so far + 1."""
    rows = [[], [], []]
    for part in parts:
        at = max((max(row) + 1 for row in rows if row), default=start)
        if isinstance(part, int):
            for row in rows:
                row.extend(range(at, at + part))
            continue
        frames, height, width, interval = part
        for f, y, x in itertools.product(range(frames), range(height), range(width)):
            for row, step in zip(rows, (f * interval, y, x)):
                row.append(at + step)
    return rows


def mrope_position_ids():
    """[3, 2, 13] int64: an image after text, and a 2-frame video (interval 2) after 1000 positions of text."""
    prompts = [prompt_ids([3, (1, 2, 3, 1), 4]), prompt_ids([2, (2, 2, 2, 2), 3], start=1000)]
    ids = torch.tensor([[prompt[axis] for prompt in prompts] for axis in range(3)], dtype=torch.int64)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert not torch.equal(ids[a], ids[b]), f"position rows {a} and {b} are equal"
    return ids


# The M-RoPE text towers: file, config, rotary module, apply function, assignment, style, rope_parameters, seed.
# head_dim 128 each; GLM-4.1V rotates half of it (64) in interleaved pairs (rotate_half_llm).
MROPE_CASES = [
    ("hf_mrope_qwen2vl_contiguous.txt", Qwen2VLTextConfig, modeling_qwen2_vl.Qwen2VLRotaryEmbedding,
     modeling_qwen2_vl.apply_rotary_pos_emb, "mrope", "neox", {"rope_theta": 1e6, "mrope_section": [16, 24, 24]}, 21),
    ("hf_mrope_qwen3vl_interleaved.txt", Qwen3VLTextConfig, modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding,
     modeling_qwen3_vl.apply_rotary_pos_emb, "mrope-interleaved", "neox",
     {"rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True}, 22),
    ("hf_mrope_glm4v_interleaved_pairs.txt", Glm4vTextConfig, modeling_glm4v.Glm4vTextRotaryEmbedding,
     modeling_glm4v.apply_rotary_pos_emb, "mrope", "gptj",
     {"rope_theta": 10000.0, "mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5}, 23),
]


def mrope_case(out, name, config_class, rotary_class, apply, assignment, style, rope_parameters, seed):
    """q, k [batch, heads, seq, 128] rotated by transformers' @p rotary_class module and @p apply function."""
    config = config_class(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                          rope_parameters={"rope_type": "default", **rope_parameters})
    rotary = rotary_class(config=config)
    sections = rope_parameters["mrope_section"]
    assert list(rotary.mrope_section) == sections, f"config's mrope_section was not taken: {rotary.mrope_section}"
    rotary_dim = rotary.inv_freq.numel() * 2
    assert sum(sections) == rotary_dim // 2, "partial_rotary_factor was not taken"
    position_ids = mrope_position_ids()
    batch, seq = position_ids.shape[1:]
    q, k = random_qk(seed, (batch, 2, seq, 128), (batch, 1, seq, 128))
    cos, sin = rotary(q, position_ids)  # [batch, seq, rotary_dim], sections already recomposed
    q_out, k_out = apply(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    meta = case_meta(f"{rotary_class.__name__} + {apply.__module__}.{apply.__name__}", style, "bhsd",
                     rope_parameters["rope_theta"], 128, rotary_dim, assignment=assignment,
                     sections=" ".join(map(str, sections)), **shapes(q, k), position_axes=3, position_rows=batch)
    tensors = {"positions": position_ids.to(torch.float32), "q": q, "k": k, "q_out": q_out, "k_out": k_out}
    write_case(os.path.join(out, name), MULTI_AXIS_HEADER, meta, tensors)


def qwen2_vl_vision_case(out):
    """Qwen2-VL's vision tower: head_dim 80, rope_type axial, theta 10000: inv_freq over head_dim / 2 = 40
    features (20 pairs), the row's then the column's angles, duplicated over the two halves of the head."""
    heads, head_dim = 2, 80
    config = Qwen2VLVisionConfig(embed_dim=heads * head_dim, num_heads=heads,
                                 rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    rotary = modeling_qwen2_vl.Qwen2VLVisionRotaryEmbedding(config=config)
    # An image of 4 x 4 patches and a 2-frame video of 2 x 2, merged in 2 x 2 blocks.
    grid_thw = torch.tensor([[1, 4, 4], [2, 2, 2]])
    position_ids = vision_utils.get_vision_position_ids(grid_thw, spatial_merge_size=2)  # [tokens, 2]: row, column
    assert not torch.equal(position_ids[:, 0], position_ids[:, 1])
    tokens = position_ids.shape[0]
    q, k = random_qk(24, (tokens, heads, head_dim), (tokens, heads, head_dim))
    cos, sin = rotary(q, position_ids)  # [tokens, head_dim]
    q_out, k_out = modeling_qwen2_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    pairs_per_axis = rotary.inv_freq.numel()
    assert 2 * 2 * pairs_per_axis == head_dim
    meta = case_meta("Qwen2VLVisionRotaryEmbedding + modeling_qwen2_vl.apply_rotary_pos_emb_vision", "neox", "thd",
                     10000.0, head_dim, head_dim, assignment="axial", sections=f"{pairs_per_axis} {pairs_per_axis}",
                     q_shape=f"{tokens} {heads} {head_dim} 1", k_shape=f"{tokens} {heads} {head_dim} 1",
                     position_axes=2, position_rows=1)
    positions = position_ids.t().contiguous().to(torch.float32)  # [2, tokens]: rope's [axes, seq]
    tensors = {"positions": positions, "q": q, "k": k, "q_out": q_out, "k_out": k_out}
    write_case(os.path.join(out, "hf_axial_qwen2vl_vision.txt"), MULTI_AXIS_HEADER, meta, tensors)


def multi_axis_cases(out):
    for case in MROPE_CASES:
        mrope_case(out, *case)
    qwen2_vl_vision_case(out)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    torch.set_num_threads(1)
    for cases, folder in ((text_cases, ""), (scaled_cases, "scaling"), (multi_axis_cases, "multiaxis")):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        cases(os.path.join(root, folder))


if __name__ == "__main__":
    main()
