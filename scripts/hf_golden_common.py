"""What the three scripts/make_golden_hf*.py share: the golden file format, the inputs, Llama's rotation.

A golden file is a comment line, then one `key: value` per line: text fields, per-pair lists (exact
reprs) and tensors (float32, in layout order), numbers separated by spaces.
"""
import os
import sys

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama


def output_folder(default):
    """The folder named on the command line (else @p default), created; torch on one thread."""
    out = sys.argv[1] if len(sys.argv) > 1 else default
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    return out


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


def llama_config(head_dim, rope_parameters, max_position_embeddings=4096):
    """A 4-head LlamaConfig whose RoPE settings are @p rope_parameters (transformers 5's form)."""
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=4, head_dim=head_dim,
                       max_position_embeddings=max_position_embeddings, rope_parameters=dict(rope_parameters))


def llama_rotate(q, k, cos, sin, rotary_dim):
    """q and k rotated by Llama's own apply_rotary_pos_emb (half-split); features past rotary_dim pass through."""
    q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin)
    return torch.cat([q_rot, q[..., rotary_dim:]], dim=-1), torch.cat([k_rot, k[..., rotary_dim:]], dim=-1)
