#!/usr/bin/env python3
"""Writes tests/golden/*.txt: RoPE inputs and outputs computed by HuggingFace transformers itself.

Run on a machine with PyTorch and transformers (the H200 machine has both):
    python3 scripts/make_golden_hf.py OUTDIR
The files are small text files; tests/golden_test.cpp reads them and checks
every rope backend against them. The functions called are transformers' own:
    half-split:  LlamaRotaryEmbedding (inv_freq, cos, sin) + llama's apply_rotary_pos_emb
    interleaved: GPT-J's create_sinusoidal_positions + apply_rotary_pos_emb (rotate_every_two)
so these vectors are independent of rope's code.
"""
import math
import os
import sys

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.gptj import modeling_gptj
from transformers.models.llama import modeling_llama

from hf_golden_common import llama_rotate, partial_rotary, write_case

HEADER = "RoPE golden vectors computed by HuggingFace transformers; see scripts/make_golden_hf.py"


def llama_config(head_dim, base, partial_rotary_factor=1.0):
    heads = 4
    common = dict(hidden_size=head_dim * heads, num_attention_heads=heads, head_dim=head_dim,
                  max_position_embeddings=4096)
    try:  # transformers >= 5 keeps RoPE settings in rope_parameters
        config = LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": base,
                                                        "partial_rotary_factor": partial_rotary_factor})
    except TypeError:
        config = LlamaConfig(**common, rope_theta=base, partial_rotary_factor=partial_rotary_factor)
    if partial_rotary_factor != 1.0:
        config.partial_rotary_factor = partial_rotary_factor
    return config


def llama_case(out, name, batch, q_heads, k_heads, seq, head_dim, base, partial=1.0, positions=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, seq, head_dim, generator=g)
    k = torch.randn(batch, k_heads, seq, head_dim, generator=g)
    if positions is None:
        position_ids = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    else:
        position_ids = positions
    config = llama_config(head_dim, base, partial)
    rotary = modeling_llama.LlamaRotaryEmbedding(config=config)
    rotary_dim = rotary.inv_freq.numel() * 2
    expected = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    assert torch.allclose(rotary.inv_freq.double(), expected, rtol=1e-6), "config's rope_theta was not taken"
    cos, sin = rotary(q, position_ids)  # [batch, seq, rotary_dim]
    q_out, k_out = llama_rotate(q, k, cos, sin, rotary_dim)
    meta = {
        "source": f"transformers {transformers.__version__} (torch {torch.__version__}): "
                  "LlamaRotaryEmbedding + modeling_llama.apply_rotary_pos_emb",
        "style": "neox", "layout": "bhsd", "base": repr(float(base)),
        "head_dim": head_dim, "rotary_dim": rotary_dim,
        "q_shape": f"{batch} {q_heads} {seq} {head_dim}", "k_shape": f"{batch} {k_heads} {seq} {head_dim}",
        "position_rows": position_ids.shape[0] if positions is not None else 0,
    }
    tensors = {"q": q, "k": k, "q_out": q_out, "k_out": k_out}
    if positions is not None:
        tensors = {"positions": position_ids.to(torch.float32), **tensors}
    write_case(os.path.join(out, name), HEADER, meta, tensors)


def gptj_case(out, name, batch, heads, seq, head_dim, rotary_dim, base, seed=0):
    # GPT-J keeps q/k as [batch, seq, heads, head_dim] when it applies RoPE, and
    # rotates the first rotary_dim features with interleaved pairs.
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=g)
    k = torch.randn(batch, seq, heads, head_dim, generator=g)
    embed_positions = modeling_gptj.create_sinusoidal_positions(seq, rotary_dim)
    if base != 10000.0:
        raise ValueError("GPT-J's create_sinusoidal_positions has base 10000 built in")
    position_ids = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    sincos = embed_positions[position_ids]
    sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
    def rotate(x):
        return partial_rotary(x, rotary_dim, lambda x_rot: modeling_gptj.apply_rotary_pos_emb(x_rot, sin, cos))
    meta = {
        "source": f"transformers {transformers.__version__} (torch {torch.__version__}): "
                  "gptj create_sinusoidal_positions + modeling_gptj.apply_rotary_pos_emb",
        "style": "gptj", "layout": "bshd", "base": repr(float(base)),
        "head_dim": head_dim, "rotary_dim": rotary_dim,
        "q_shape": f"{batch} {seq} {heads} {head_dim}", "k_shape": f"{batch} {seq} {heads} {head_dim}",
        "position_rows": 0,
    }
    write_case(os.path.join(out, name), HEADER, meta, {"q": q, "k": k, "q_out": rotate(q), "k_out": rotate(k)})


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    # The founding example's form (half-split, base 10000, positions 0..seq-1), small.
    llama_case(out, "hf_llama_neox_base10000.txt", batch=2, q_heads=4, k_heads=4, seq=16, head_dim=64, base=10000.0, seed=1)
    # Llama 3's base, head_dim 128, grouped-query k, explicit positions far from 0.
    ids = torch.tensor([[1000 + 3 * s for s in range(8)], [7 * s for s in range(8)]])
    llama_case(out, "hf_llama_gqa_base500000_positions.txt", batch=2, q_heads=4, k_heads=2, seq=8, head_dim=128,
               base=500000.0, positions=ids, seed=2)
    # Partial rotary (half of the head rotates), as Phi and StableLM configure it.
    llama_case(out, "hf_llama_partial_rotary.txt", batch=1, q_heads=2, k_heads=2, seq=12, head_dim=64, base=10000.0,
               partial=0.5, seed=3)
    # GPT-J: interleaved pairs, [batch, seq, heads, dim], rotary_dim 32 of 64.
    gptj_case(out, "hf_gptj_interleaved_partial.txt", batch=2, heads=3, seq=10, head_dim=64, rotary_dim=32,
              base=10000.0, seed=4)


if __name__ == "__main__":
    main()
