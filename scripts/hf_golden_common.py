"""What scripts/make_golden_hf.py and scripts/make_golden_hf_scaling.py share.

The golden file format (one `key: value` per line; lists and tensors as
space-separated numbers) and HuggingFace's partial rotary: transformers rotates
the first rotary_dim features of each head and passes the rest through.
"""
import torch
from transformers.models.llama import modeling_llama


def numbers(values, fmt="{:.9g}"):
    """Space-separated numbers: floats to 9 significant digits, enough to round-trip a float32."""
    return " ".join(fmt.format(v) for v in values)


def write_case(path, header, meta, tensors, lists=None):
    """Writes one golden file: a comment line, then meta, lists (exact reprs) and tensors (as float32)."""
    with open(path, "w") as f:
        f.write(f"# {header}\n")
        for key, value in meta.items():
            f.write(f"{key}: {value}\n")
        for key, values in (lists or {}).items():
            f.write(f"{key}: {numbers(values, '{!r}')}\n")
        for name, t in tensors.items():
            f.write(f"{name}: " + numbers(t.detach().to(torch.float32).contiguous().view(-1).tolist()) + "\n")
    print("wrote", path)


def partial_rotary(x, rotary_dim, rotate):
    """`rotate` applied to the first rotary_dim features of the last axis; the rest passed through."""
    return torch.cat([rotate(x[..., :rotary_dim]), x[..., rotary_dim:]], dim=-1)


def llama_rotate(q, k, cos, sin, rotary_dim):
    """q and k rotated by Llama's own apply_rotary_pos_emb (half-split), with partial rotary."""
    q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin)
    return (torch.cat([q_rot, q[..., rotary_dim:]], dim=-1), torch.cat([k_rot, k[..., rotary_dim:]], dim=-1))
