#!/usr/bin/env python3
"""Writes tests/golden/multiaxis/hf_*.txt: multi-axis RoPE computed by HuggingFace transformers itself.

Run on a machine with PyTorch and transformers >= 5.17 (the H200 machine has both):
    python3 scripts/make_golden_hf_multiaxis.py [OUTDIR]      (default: tests/golden/multiaxis)
tests/golden_test.cpp reads the files and checks every backend (default and
precise angle modes) and the float64 oracle against them.

The numbers come from transformers' own modules, so they are independent of rope's code:
    M-RoPE, contiguous sections (Qwen2-VL, Qwen2.5-VL):
        Qwen2VLRotaryEmbedding (forward -> recomposition_frequencies) + modeling_qwen2_vl.apply_rotary_pos_emb
    M-RoPE, interleaved sections (Qwen3-VL):
        Qwen3VLTextRotaryEmbedding (forward -> recomposition_frequencies) + modeling_qwen3_vl.apply_rotary_pos_emb
    M-RoPE, contiguous sections with interleaved pairs and partial rotary (GLM-4.1V):
        Glm4vTextRotaryEmbedding + modeling_glm4v.apply_rotary_pos_emb (rotate_half_llm)
    axial 2-D vision RoPE (Qwen2-VL's vision tower, rope_type "axial"):
        Qwen2VLVisionRotaryEmbedding + modeling_qwen2_vl.apply_rotary_pos_emb_vision, positions from
        transformers.vision_utils.get_vision_position_ids (row, column; block-major over 2 x 2 merges)
Inputs are float32 with distinct temporal / height / width rows (an image and a video after text),
so a kernel that reads only the first row, or pairs features the wrong way, cannot match.

File format: that of scripts/make_golden_hf.py (one `key: value` per line; q, k,
q_out, k_out and positions are space-separated numbers in layout order), plus
    assignment: mrope, mrope-interleaved or axial (rope's AxisAssignment names);
    sections: the pairs of each axis (HF's mrope_section; axial: head_dim / 4 per axis);
    position_axes, position_rows: the positions line holds ids [position_axes, position_rows, seq]
        (position_rows 1: shared by the batch), i.e. rope::Positions::multi_axis's layout;
    layout thd: q and k are [tokens, heads, head_dim] (q_shape written as "tokens heads head_dim 1").
"""
import os
import sys

import torch
import transformers
from transformers import vision_utils
from transformers.models.glm4v import modeling_glm4v
from transformers.models.glm4v.configuration_glm4v import Glm4vTextConfig
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

from hf_golden_common import write_case

HEADER = "Multi-axis RoPE golden vectors computed by HuggingFace transformers; see scripts/make_golden_hf_multiaxis.py"


def source(what):
    return f"transformers {transformers.__version__} (torch {torch.__version__}): {what}"


# --- Position ids of multimodal prompts -------------------------------------------------------

class Prompt:
    """M-RoPE position ids of one prompt, built as Qwen2-VL's get_rope_index builds them:
    text advances the temporal, height and width rows together; a vision block of
    frames x height x width tokens after `start` has temporal start + frame * interval,
    height start + row, width start + column; text after it goes on from the largest
    position so far + 1."""

    def __init__(self):
        self.rows = [[], [], []]

    def next(self):
        return max((max(row) + 1 for row in self.rows if row), default=0)

    def text(self, tokens):
        start = self.next()
        for row in self.rows:
            row.extend(range(start, start + tokens))
        return self

    def vision(self, frames, height, width, interval=1):
        start = self.next()
        for f in range(frames):
            for y in range(height):
                for x in range(width):
                    self.rows[0].append(start + f * interval)
                    self.rows[1].append(start + y)
                    self.rows[2].append(start + x)
        return self


def mrope_position_ids(prompts):
    """[3, batch, seq] int64 ids of prompts of equal length."""
    lengths = {len(p.rows[0]) for p in prompts}
    assert len(lengths) == 1, f"prompts of different lengths {lengths}"
    return torch.tensor([[p.rows[axis] for p in prompts] for axis in range(3)], dtype=torch.int64)


def prompts():
    """An image after text, and a 2-frame video (temporal interval 2) after 1000 text tokens' worth of positions."""
    image = Prompt().text(3).vision(1, 2, 3).text(4)     # 13 tokens
    video = Prompt().text(2).vision(2, 2, 2, 2).text(3)  # 13 tokens
    for axis in range(3):  # the video's prompt starts at position 1000 (a long text before it)
        video.rows[axis] = [p + 1000 for p in video.rows[axis]]
    return [image, video]


def check_distinct_rows(position_ids):
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.equal(position_ids[a], position_ids[b]), f"position rows {a} and {b} are equal"


# --- M-RoPE -----------------------------------------------------------------------------------

def mrope_case(out, name, rotary, apply, config, assignment, sections, style, q_heads, k_heads, head_dim, seed):
    """q, k [batch, heads, seq, head_dim] rotated by transformers' `rotary` module and `apply` function."""
    position_ids = mrope_position_ids(prompts())
    check_distinct_rows(position_ids)
    batch, seq = position_ids.shape[1], position_ids.shape[2]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, seq, head_dim, generator=g)
    k = torch.randn(batch, k_heads, seq, head_dim, generator=g)
    assert list(rotary.mrope_section) == sections, f"config's mrope_section was not taken: {rotary.mrope_section}"
    rotary_dim = rotary.inv_freq.numel() * 2
    assert sum(sections) == rotary_dim // 2
    cos, sin = rotary(q, position_ids)  # [batch, seq, rotary_dim], sections already recomposed
    q_out, k_out = apply(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    base = config.rope_parameters["rope_theta"]
    meta = {
        "source": source(f"{type(rotary).__name__} + {apply.__module__}.{apply.__name__}"),
        "style": style, "layout": "bhsd", "base": repr(float(base)),
        "head_dim": head_dim, "rotary_dim": rotary_dim,
        "assignment": assignment, "sections": " ".join(str(s) for s in sections),
        "q_shape": f"{batch} {q_heads} {seq} {head_dim}", "k_shape": f"{batch} {k_heads} {seq} {head_dim}",
        "position_axes": 3, "position_rows": batch,
    }
    tensors = {"positions": position_ids.to(torch.float32), "q": q, "k": k, "q_out": q_out, "k_out": k_out}
    write_case(os.path.join(out, name), HEADER, meta, tensors)


def qwen2_vl_case(out):
    # Qwen2-VL's text tower: head_dim 128 (hidden 2 x 128), mrope_section [16, 24, 24], theta 1e6.
    sections = [16, 24, 24]
    config = Qwen2VLTextConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                "mrope_section": sections})
    rotary = modeling_qwen2_vl.Qwen2VLRotaryEmbedding(config=config)
    mrope_case(out, "hf_mrope_qwen2vl_contiguous.txt", rotary, modeling_qwen2_vl.apply_rotary_pos_emb, config,
               "mrope", sections, "neox", q_heads=2, k_heads=1, head_dim=128, seed=21)


def qwen3_vl_case(out):
    # Qwen3-VL's text tower: head_dim 128, interleaved mrope_section [24, 20, 20], theta 5e6.
    sections = [24, 20, 20]
    config = Qwen3VLTextConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                               rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                                "mrope_section": sections, "mrope_interleaved": True})
    rotary = modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding(config=config)
    mrope_case(out, "hf_mrope_qwen3vl_interleaved.txt", rotary, modeling_qwen3_vl.apply_rotary_pos_emb, config,
               "mrope-interleaved", sections, "neox", q_heads=2, k_heads=1, head_dim=128, seed=22)


def glm4v_case(out):
    # GLM-4.1V's text tower: head_dim 128, half of it rotary (64), mrope_section [8, 12, 12],
    # interleaved pairs (rotate_half_llm), theta 10000.
    sections = [8, 12, 12]
    config = Glm4vTextConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": sections, "partial_rotary_factor": 0.5})
    rotary = modeling_glm4v.Glm4vTextRotaryEmbedding(config=config)
    assert rotary.inv_freq.numel() == 32, "partial_rotary_factor was not taken"
    mrope_case(out, "hf_mrope_glm4v_interleaved_pairs.txt", rotary, modeling_glm4v.apply_rotary_pos_emb, config,
               "mrope", sections, "gptj", q_heads=2, k_heads=1, head_dim=128, seed=23)


# --- Axial vision RoPE ------------------------------------------------------------------------

def qwen2_vl_vision_case(out):
    # Qwen2-VL's vision tower: head_dim 80 (embed 2 x 80 here), rope_type axial, theta 10000:
    # inv_freq over head_dim / 2 = 40 features (20 pairs), the row's then the column's angles,
    # duplicated over the two halves of the head (pairs (i, i + 40)).
    heads, head_dim = 2, 80
    config = Qwen2VLVisionConfig(embed_dim=heads * head_dim, num_heads=heads,
                                 rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    rotary = modeling_qwen2_vl.Qwen2VLVisionRotaryEmbedding(config=config)
    # An image of 4 x 4 patches and a 2-frame video of 2 x 2, merged in 2 x 2 blocks.
    grid_thw = torch.tensor([[1, 4, 4], [2, 2, 2]])
    position_ids = vision_utils.get_vision_position_ids(grid_thw, spatial_merge_size=2)  # [tokens, 2]: row, column
    tokens = position_ids.shape[0]
    assert not torch.equal(position_ids[:, 0], position_ids[:, 1])
    g = torch.Generator().manual_seed(24)
    q = torch.randn(tokens, heads, head_dim, generator=g)
    k = torch.randn(tokens, heads, head_dim, generator=g)
    cos, sin = rotary(q, position_ids)  # [tokens, head_dim]
    q_out, k_out = modeling_qwen2_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    pairs_per_axis = rotary.inv_freq.numel()
    assert 2 * 2 * pairs_per_axis == head_dim
    meta = {
        "source": source("Qwen2VLVisionRotaryEmbedding + modeling_qwen2_vl.apply_rotary_pos_emb_vision"),
        "style": "neox", "layout": "thd", "base": repr(10000.0),
        "head_dim": head_dim, "rotary_dim": head_dim,
        "assignment": "axial", "sections": f"{pairs_per_axis} {pairs_per_axis}",
        "q_shape": f"{tokens} {heads} {head_dim} 1", "k_shape": f"{tokens} {heads} {head_dim} 1",
        "position_axes": 2, "position_rows": 1,
    }
    positions = position_ids.t().contiguous().to(torch.float32)  # [2, tokens]: rope's [axes, seq]
    tensors = {"positions": positions, "q": q, "k": k, "q_out": q_out, "k_out": k_out}
    write_case(os.path.join(out, "hf_axial_qwen2vl_vision.txt"), HEADER, meta, tensors)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/multiaxis"
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    qwen2_vl_case(out)
    qwen3_vl_case(out)
    glm4v_case(out)
    qwen2_vl_vision_case(out)


if __name__ == "__main__":
    main()
