#!/usr/bin/env python3
"""Writes tests/golden/*.txt: RoPE inputs and outputs computed by HuggingFace transformers itself.

    python3 scripts/make_golden_hf.py [OUTDIR]      (default: tests/golden; needs PyTorch and transformers)

tests/golden_test.cpp checks every backend against them. The functions called are transformers' own,
so the vectors are independent of rope's code:
    half-split:  LlamaRotaryEmbedding (inv_freq, cos, sin) + llama's apply_rotary_pos_emb
    interleaved: GPT-J's create_sinusoidal_positions + apply_rotary_pos_emb (rotate_every_two)
"""
import os

import torch
from transformers.models.gptj import modeling_gptj
from transformers.models.llama import modeling_llama

from hf_golden_common import case_meta, llama_config, llama_rotate, output_folder, random_qk, shapes, write_case

HEADER = "RoPE golden vectors computed by HuggingFace transformers; see scripts/make_golden_hf.py"


def llama_case(out, name, batch, q_heads, k_heads, seq, head_dim, base, partial=1.0, positions=None, seed=0):
    q, k = random_qk(seed, (batch, q_heads, seq, head_dim), (batch, k_heads, seq, head_dim))
    position_ids = torch.arange(seq).unsqueeze(0).expand(batch, seq) if positions is None else positions
    rope = {"rope_type": "default", "rope_theta": base, **({"partial_rotary_factor": partial} if partial != 1 else {})}
    rotary = modeling_llama.LlamaRotaryEmbedding(config=llama_config(head_dim, rope))
    rotary_dim = rotary.inv_freq.numel() * 2
    expected = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    assert torch.allclose(rotary.inv_freq.double(), expected, rtol=1e-6), "config's rope_theta was not taken"
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


def main():
    out = output_folder("tests/golden")
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


if __name__ == "__main__":
    main()
