"""HuggingFace transformers as the reference: its own rotary embedding and apply_rotary_pos_emb.

The cos/sin come from transformers' LlamaRotaryEmbedding (which calls
modeling_rope_utils' ROPE_INIT_FUNCTIONS[rope_type] and applies the dynamic and
longrope updates from max(position_ids) + 1), the rotation from Llama's
apply_rotary_pos_emb (half-split, [batch, heads, seq, dim]). rope gets the same
``rope_parameters`` dict, as is. Positions reach past the original context, so
every scaling type changes the result.
"""

import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama

ORIGINAL = 256  # original_max_position_embeddings: small, so positions below exceed it

# (name, rope_parameters as a transformers 5 config holds them, max_position_embeddings)
SCALING_CASES = [
    ("default", {"rope_type": "default", "rope_theta": 10000.0}, 4096),
    # Partial rotary (Llama's default init ignores partial_rotary_factor; the scaled types read it).
    ("linear-partial", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.5},
     4096),
    ("linear", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 4096),
    # dynamic reads its original context from max_position_embeddings (HF); rope from the dict.
    ("dynamic", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, ORIGINAL),
    ("yarn", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
              "original_max_position_embeddings": ORIGINAL}, 4096),
    ("yarn-deepseek", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                       "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                       "original_max_position_embeddings": ORIGINAL}, 4096),
    ("llama3", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 4096),
    ("longrope", {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 8.0,
                  "original_max_position_embeddings": ORIGINAL,
                  "short_factor": [1.0 + 0.05 * i for i in range(32)],
                  "long_factor": [1.0 + 0.5 * i for i in range(32)]}, 4096),
]


def rope_dict_for(rope_parameters, max_position_embeddings):
    """What rope.Config gets: the dict as is, plus dynamic's original context (HF takes it from the config)."""
    fields = dict(rope_parameters)
    if fields["rope_type"] == "dynamic":
        fields["original_max_position_embeddings"] = max_position_embeddings
    return fields


def cos_sin(head_dim, rope_parameters, max_position_embeddings, position_ids, device="cpu"):
    """transformers' cos and sin [batch, seq, rotary_dim] (float32) for ``position_ids`` [batch, seq]."""
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=4, head_dim=head_dim,
                         max_position_embeddings=max_position_embeddings, rope_parameters=dict(rope_parameters))
    embedding = modeling_llama.LlamaRotaryEmbedding(config=config).to(device)
    probe = torch.zeros(1, dtype=torch.float32, device=device)
    return embedding(probe, position_ids.to(device))


def apply_rotary_pos_emb(q, k, cos, sin):
    """Llama's rotation, with partial rotary: the first cos.shape[-1] features rotate, the rest pass through."""
    rotary_dim = cos.shape[-1]
    q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin)
    return torch.cat([q_rot, q[..., rotary_dim:]], dim=-1), torch.cat([k_rot, k[..., rotary_dim:]], dim=-1)
