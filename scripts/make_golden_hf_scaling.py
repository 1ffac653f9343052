#!/usr/bin/env python3
"""Writes tests/golden/scaling/hf_scaling_*.txt: scaled RoPE computed by HuggingFace transformers itself.

    python3 scripts/make_golden_hf_scaling.py [OUTDIR]      (default: tests/golden/scaling)

tests/scaling_test.cpp checks rope's frequency table (inv_freq, attention_factor) and every backend's
output against them. The numbers come from transformers' own code, independent of rope's:
LlamaRotaryEmbedding (whose __init__ calls modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type] and whose
forward pass applies the dynamic / longrope updates from max(position_ids) + 1, cross-checked against
ROPE_INIT_FUNCTIONS called directly) and modeling_llama.apply_rotary_pos_emb. Positions reach a few
thousand while original_max_position_embeddings is 256 or 512, so every scaling type changes the result.

File format: that of scripts/make_golden_hf.py, plus
    rope_type, factor, original_max_position_embeddings and the type's other fields, exactly as given;
    given_attention_factor: an attention_factor set in the config (absent: the type's default);
    position_offset: without a positions line, the ids are position_offset + s in every sequence;
    inv_freq, attention_factor: what transformers used (after its dynamic / longrope update);
    seq_len: max(position_ids) + 1, the length those updates looked at;
    max_position_embeddings: the config's value (for the record).
"""
import inspect
import math
import os

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama import modeling_llama

from hf_golden_common import case_meta, llama_config, llama_rotate, output_folder, random_qk, shapes, write_case

HEADER = "Scaled RoPE golden vectors computed by HuggingFace transformers; see scripts/make_golden_hf_scaling.py"


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
    parameters = {"rope_theta": base, **rope_fields, **({"partial_rotary_factor": partial} if partial != 1 else {})}
    config = llama_config(head_dim, parameters, max_position_embeddings)
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
    default = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    changed = not torch.allclose(inv_freq.double(), default, rtol=1e-5) or attention_factor != 1.0
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
    write_case(os.path.join(out, name), HEADER, meta, tensors, lists)


def main():
    out = output_folder("tests/golden/scaling")
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


if __name__ == "__main__":
    main()
