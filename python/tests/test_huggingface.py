"""rope against HuggingFace transformers, on PyTorch tensors: the forward for every
scaling type (the HF config's rope_parameters dict given to rope.Config as is),
the backward against HF's apply_rotary_pos_emb differentiated by autograd in
float64, and the frequencies against transformers' own initialisation. On the
host backends here; on CUDA too where there is a GPU (marked cuda)."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")
pytest.importorskip("transformers", reason="transformers is not installed "
                    "(scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")

import hf_reference as hf  # noqa: E402
import rope  # noqa: E402
from rope import ops  # noqa: E402
from test_torch_op import DEVICES, backends_for, check  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402


def hf_case(name, device, batch=2, seq=24, head_dim=64, dtype=torch.float32):
    _, parameters, max_positions = next(c for c in hf.SCALING_CASES if c[0] == name)
    g = torch.Generator().manual_seed(3)
    q = (torch.rand(batch, 8, seq, head_dim, generator=g) * 2 - 1).to(device, dtype)
    k = (torch.rand(batch, 2, seq, head_dim, generator=g) * 2 - 1).to(device, dtype)
    # Positions from 900 on: past every original context above, so each scaling type matters.
    position_ids = (900 + torch.arange(seq) + 100 * torch.arange(batch)[:, None]).to(device)
    cos, sin = hf.cos_sin(head_dim, parameters, max_positions, position_ids, device=device)
    config = rope.Config(head_dim=head_dim, scaling=hf.rope_dict_for(parameters, max_positions))
    return q, k, position_ids, cos, sin, config


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [c[0] for c in hf.SCALING_CASES])
def test_forward_against_huggingface(device, name):
    q, k, position_ids, cos, sin, config = hf_case(name, device)
    want_q, want_k = hf.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    for backend in backends_for(device):
        got_q, got_k = ops.rope(q, k, config, positions=position_ids, backend=backend, max_position=1024)
        # Both sides compute theta and the angle in float32, at positions near 1000.
        check(got_q, want_q.cpu().numpy(), 2e-5, 3e-4)
        check(got_k, want_k.cpu().numpy(), 2e-5, 3e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["default", "linear-partial", "yarn", "llama3", "longrope"])
def test_backward_against_huggingface_autograd_in_float64(device, name):
    q, k, position_ids, cos, sin, config = hf_case(name, device)
    g = torch.Generator().manual_seed(4)
    grad_q = torch.randn(q.shape, generator=g).to(device)
    grad_k = torch.randn(k.shape, generator=g).to(device)
    # HuggingFace's function, differentiated by autograd in float64.
    q64, k64 = q.double().requires_grad_(), k.double().requires_grad_()
    out = hf.apply_rotary_pos_emb(q64, k64, cos.double(), sin.double())
    want_q, want_k = torch.autograd.grad(out, (q64, k64), (grad_q.double(), grad_k.double()))
    # rope's operator: the backward is its inverse rotation of the gradients.
    q32, k32 = q.clone().requires_grad_(), k.clone().requires_grad_()
    out = ops.rope(q32, k32, config, positions=position_ids, max_position=1024)
    got_q, got_k = torch.autograd.grad(out, (q32, k32), (grad_q, grad_k))
    check(got_q, want_q.cpu().numpy(), 2e-5, 5e-4)
    check(got_k, want_k.cpu().numpy(), 2e-5, 5e-4)


def test_config_accepts_a_huggingface_dict_as_is_and_agrees_on_frequencies():
    for name, parameters, max_positions in hf.SCALING_CASES:
        config = rope.Config(head_dim=64, scaling=hf.rope_dict_for(parameters, max_positions))
        assert config.scaling["rope_type"] == parameters["rope_type"]
        assert config.base == parameters["rope_theta"]
        assert config.rotary_dim == int(64 * parameters.get("partial_rotary_factor", 1.0))
        kind = parameters["rope_type"]
        if kind in ("default", "dynamic", "longrope"):
            continue  # default: no HF init function; dynamic, longrope: length-dependent (the forward test covers them)
        hf_config = hf.LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64,
                                   max_position_embeddings=max_positions, rope_parameters=dict(parameters))
        hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu")
        inv_freq, attention_factor = config.frequencies()
        np.testing.assert_allclose(inv_freq, hf_inv_freq.numpy(), rtol=3e-7, err_msg=name)
        assert abs(attention_factor - hf_factor) < 1e-6, name
