#!/usr/bin/env python3
"""Writes tests/golden/multiaxis/hf_*.txt: multi-axis RoPE computed by HuggingFace transformers itself.

    python3 scripts/make_golden_hf_multiaxis.py [OUTDIR]      (default: tests/golden/multiaxis; transformers >= 5.17)

tests/golden_test.cpp checks every backend (both angle modes) and the float64 oracle against them.
The numbers come from transformers' own modules, independent of rope's code:
    M-RoPE, contiguous sections (Qwen2-VL, Qwen2.5-VL):
        Qwen2VLRotaryEmbedding (forward -> recomposition_frequencies) + modeling_qwen2_vl.apply_rotary_pos_emb
    M-RoPE, interleaved sections (Qwen3-VL):
        Qwen3VLTextRotaryEmbedding (forward -> recomposition_frequencies) + modeling_qwen3_vl.apply_rotary_pos_emb
    M-RoPE, contiguous sections with interleaved pairs and partial rotary (GLM-4.1V):
        Glm4vTextRotaryEmbedding + modeling_glm4v.apply_rotary_pos_emb (rotate_half_llm)
    axial 2-D vision RoPE (Qwen2-VL's vision tower, rope_type "axial"):
        Qwen2VLVisionRotaryEmbedding + modeling_qwen2_vl.apply_rotary_pos_emb_vision, positions from
        transformers.vision_utils.get_vision_position_ids (row, column; block-major over 2 x 2 merges)
The temporal, height and width rows differ (an image and a video after text): a kernel that reads only
the first row, or pairs features the wrong way, cannot match. File format: that of make_golden_hf.py, plus
    assignment: mrope, mrope-interleaved or axial (rope's AxisAssignment names);
    sections: the pairs of each axis (HF's mrope_section; axial: head_dim / 4 per axis);
    position_axes, position_rows: the positions line holds ids [position_axes, position_rows, seq]
        (position_rows 1: shared by the batch), i.e. rope::Positions::multi_axis's layout;
    layout thd: q and k are [tokens, heads, head_dim] (q_shape written as "tokens heads head_dim 1").
"""
import itertools
import os

import torch
from transformers import vision_utils
from transformers.models.glm4v import modeling_glm4v
from transformers.models.glm4v.configuration_glm4v import Glm4vTextConfig
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

from hf_golden_common import case_meta, output_folder, random_qk, shapes, write_case

HEADER = "Multi-axis RoPE golden vectors computed by HuggingFace transformers; see scripts/make_golden_hf_multiaxis.py"


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


# The text towers: file, config, rotary module, apply function, assignment, style, rope_parameters, seed.
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
    write_case(os.path.join(out, name), HEADER, meta, tensors)


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
    write_case(os.path.join(out, "hf_axial_qwen2vl_vision.txt"), HEADER, meta, tensors)


def main():
    out = output_folder("tests/golden/multiaxis")
    for case in MROPE_CASES:
        mrope_case(out, *case)
    qwen2_vl_vision_case(out)


if __name__ == "__main__":
    main()
