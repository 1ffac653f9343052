"""DeepSeek's multi-head latent attention (V2, V3, R1) against HuggingFace's own code: the
rotary window of q's head ([nope | pe], rope.Config's rotary_offset), k_pe as one head shared
by every q head, HF's de-interleaved output order (style "interleaved_to_half", HF's
``apply_rotary_pos_emb_interleave``), DeepSeek's YaRN (rope_type "yarn" as HF's configs write
it, and "deepseek_yarn" as vLLM names it) and the softmax multiplier against
DeepseekV3Attention.scaling. A tiny random DeepseekV3Config, nothing downloaded. On the host
backends here; on CUDA too where there is a GPU."""

import math

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")
pytest.importorskip("transformers", reason="transformers is not installed "
                    "(scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")

import rope  # noqa: E402
from rope import ops  # noqa: E402
from test_torch_op import DEVICES, backends_for  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf  # noqa: E402

NOPE, PE = 32, 16  # qk_nope_head_dim, qk_rope_head_dim (DeepSeek-V3: 128, 64)
HEADS = 4

# DeepSeek-V3's rope_parameters, as its config.json writes them (rope_type "yarn").
V3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
           "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
# mscale != mscale_all_dim: cos and sin then carry their ratio (about 0.90 here).
UNEQUAL_ROPE = dict(V3_ROPE, mscale=0.707, mscale_all_dim=1.0)


def hf_config(rope_parameters):
    return DeepseekV3Config(vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=NOPE, qk_rope_head_dim=PE,
                            v_head_dim=NOPE, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                            first_k_dense_replace=1, max_position_embeddings=163840, rope_interleave=True,
                            rope_parameters=dict(rope_parameters))


def rope_config(rope_parameters, **window):
    """rope's Config of the same RoPE: HF's dict as is, HF's order."""
    return rope.Config(head_dim=window.pop("head_dim", PE), style="interleaved_to_half",
                       scaling={k: v for k, v in rope_parameters.items()}, **window)


def inputs(device, dtype, seed=5, batch=2, seq=9):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(batch, HEADS, seq, NOPE + PE, generator=g) * 2 - 1).to(device, dtype)
    k_pe = (torch.rand(batch, 1, seq, PE, generator=g) * 2 - 1).to(device, dtype)
    # Positions past the original context (4096), each sequence its own.
    position_ids = (5000 + torch.arange(seq) + 37 * torch.arange(batch)[:, None]).to(device)
    return q, k_pe, position_ids


def hf_forward(rope_parameters, q, k_pe, position_ids, compute_dtype):
    """What DeepseekV3Attention does to q and k_pe: its rotary embedding's cos/sin (in the model's
    dtype, as HF returns them), split q, rotate the pe part with apply_rotary_pos_emb_interleave."""
    config = hf_config(rope_parameters)
    embedding = hf.DeepseekV3RotaryEmbedding(config=config).to(q.device)
    probe = torch.zeros(1, dtype=compute_dtype, device=q.device)
    cos, sin = embedding(probe, position_ids)
    q_pass, q_rot = torch.split(q.to(compute_dtype), [NOPE, PE], dim=-1)
    q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q_rot, k_pe.to(compute_dtype), cos.to(compute_dtype),
                                                      sin.to(compute_dtype))
    return torch.cat((q_pass, q_rot), dim=-1), k_rot


def check(got, want, rel_l2, max_abs):
    got = got.detach().double().cpu().numpy()
    want = want.detach().double().cpu().numpy()
    assert np.isfinite(got).all()
    error = np.abs(got - want)
    assert error.max() <= max_abs, f"max abs {error.max():.3g} > {max_abs:.3g}"
    assert np.linalg.norm(got - want) <= rel_l2 * np.linalg.norm(want), "relative L2 error"


# float32: both sides form the angle in float32 at positions near 5000 (about 3e-4 radians of
# rounding); HF's cos/sin in float32 too. bfloat16: rope rounds once from float32, HF after every
# operation of the rotation with cos/sin rounded to bfloat16 first: a few bf16 ulps at values below 2.
TOLERANCES = {torch.float32: (3e-5, 5e-4), torch.bfloat16: (1e-2, 2 ** -5)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("parameters", [V3_ROPE, UNEQUAL_ROPE], ids=["v3", "mscale-unequal"])
@pytest.mark.parametrize("rope_type", ["yarn", "deepseek_yarn"])
def test_window_and_k_pe_against_huggingface(device, dtype, parameters, rope_type):
    q, k_pe, position_ids = inputs(device, dtype)
    # HF in float64 from the same stored inputs (the reference), and in the model's dtype (what HF ships).
    want_q, want_k = hf_forward(parameters, q, k_pe, position_ids, torch.float64)
    hf_q, hf_k = hf_forward(parameters, q, k_pe, position_ids, dtype)
    rel, tol = TOLERANCES[dtype]
    ours = dict(parameters, rope_type=rope_type)
    window = rope_config(ours, head_dim=NOPE + PE, rotary_offset=NOPE, rotary_dim=PE)
    single = rope_config(ours)
    for backend in backends_for(device):
        # q's whole head with the window; k_pe (one head) on its own config.
        got_q, _ = ops.rope(q, None, window, positions=position_ids, backend=backend)
        got_k, _ = ops.rope(k_pe, None, single, positions=position_ids, backend=backend)
        # vLLM's form: q's pe part as a strided view, with k_pe's one head broadcast over q's heads.
        view_q, view_k = ops.rope(q[..., NOPE:], k_pe, single, positions=position_ids, backend=backend)
        for got, want, shipped in ((got_q, want_q, hf_q), (got_k, want_k, hf_k), (view_q, want_q[..., NOPE:], hf_q[..., NOPE:]),
                                   (view_k, want_k, hf_k)):
            check(got, want, rel, tol)
            check(got, shipped.double(), rel, 2 * tol)
        # The NoPE part keeps its bits.
        assert torch.equal(got_q[..., :NOPE], q[..., :NOPE])
        # In place, through rope_ on a copy: the same bits as out of place.
        in_place = q.clone()
        ops.rope_(in_place, None, window, positions=position_ids, backend=backend)
        assert torch.equal(in_place, got_q)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_against_huggingface_autograd_in_float64(device):
    """The gradient through HF's order: rope's backward (the inverse rotation, which reads the
    de-interleaved order and writes the interleaved one) against autograd through HF's
    apply_rotary_pos_emb_interleave in float64."""
    q, k_pe, position_ids = inputs(device, torch.float32, seed=11)
    g = torch.Generator().manual_seed(12)
    grad_q = torch.randn(q.shape, generator=g).to(device)
    grad_k = torch.randn(k_pe.shape, generator=g).to(device)
    q64, k64 = q.double().requires_grad_(), k_pe.double().requires_grad_()
    want_q, want_k = torch.autograd.grad(hf_forward(V3_ROPE, q64, k64, position_ids, torch.float64), (q64, k64),
                                         (grad_q.double(), grad_k.double()))
    window = rope_config(V3_ROPE, head_dim=NOPE + PE, rotary_offset=NOPE, rotary_dim=PE)
    for backend in backends_for(device):
        q32, k32 = q.clone().requires_grad_(), k_pe.clone().requires_grad_()
        out_q, _ = ops.rope(q32, None, window, positions=position_ids, backend=backend)
        out_k, _ = ops.rope(k32, None, rope_config(V3_ROPE), positions=position_ids, backend=backend)
        got_q, got_k = torch.autograd.grad((out_q, out_k), (q32, k32), (grad_q, grad_k))
        check(got_q, want_q, 3e-5, 5e-4)
        check(got_k, want_k, 3e-5, 5e-4)
        assert torch.equal(got_q[..., :NOPE], grad_q[..., :NOPE])  # The NoPE part passes its gradient as is.


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_numpy_entry_point_in_place(dtype):
    """rope.apply on NumPy arrays, in place: HF's order over q's window, the NoPE part untouched."""
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    q, k_pe, position_ids = inputs("cpu", torch_dtype, seed=7)
    want_q, want_k = hf_forward(V3_ROPE, q, k_pe, position_ids, torch.float64)
    from conftest import numpy_dtype
    q_np = q.float().numpy().astype(numpy_dtype(dtype))
    # k as one 48-wide head beside q's heads: the window applies to both.
    k_np = np.concatenate([q_np[:, :1, :, :NOPE], k_pe.float().numpy().astype(numpy_dtype(dtype))], axis=-1)
    nope_before = q_np[..., :NOPE].copy()
    config = rope_config(V3_ROPE, head_dim=NOPE + PE, rotary_offset=NOPE, rotary_dim=PE)
    for backend in backends_for("cpu"):
        q_run, k_run = q_np.copy(), k_np.copy()
        rope.apply(q_run, k_run, config, position_ids.numpy(), backend=backend)
        rel, tol = TOLERANCES[torch_dtype]
        check(torch.from_numpy(q_run.astype(np.float64)), want_q, rel, tol)
        check(torch.from_numpy(k_run[..., NOPE:].astype(np.float64)), want_k, rel, tol)
        assert (q_run[..., :NOPE].view(np.uint8) == nope_before.view(np.uint8)).all()


def test_frequencies_and_magnitude_against_huggingface():
    for parameters in (V3_ROPE, UNEQUAL_ROPE):
        embedding = hf.DeepseekV3RotaryEmbedding(config=hf_config(parameters))
        for rope_type in ("yarn", "deepseek_yarn"):
            inv_freq, attention_factor = rope_config(dict(parameters, rope_type=rope_type)).frequencies()
            np.testing.assert_allclose(inv_freq, embedding.inv_freq.numpy(), rtol=3e-7)
            assert abs(attention_factor - embedding.attention_scaling) < 1e-6


@pytest.mark.parametrize("parameters", [V3_ROPE, UNEQUAL_ROPE, dict(V3_ROPE, mscale_all_dim=0.0)],
                         ids=["v3", "mscale-unequal", "no-mscale-all-dim"])
def test_softmax_multiplier_against_deepseek_v3_attention(parameters):
    attention = hf.DeepseekV3Attention(hf_config(parameters), layer_idx=0)
    for rope_type in ("yarn", "deepseek_yarn"):
        config = rope_config(dict(parameters, rope_type=rope_type))
        assert math.isclose((NOPE + PE) ** -0.5 * config.softmax_scale_multiplier, attention.scaling, rel_tol=1e-12)
    if parameters is V3_ROPE:  # DeepSeek-V3's own: (0.1 ln 40 + 1)^2
        assert abs(rope_config(V3_ROPE).softmax_scale_multiplier - 1.8738) < 1e-4
    assert rope.Config(head_dim=PE).softmax_scale_multiplier == 1.0


def test_config_reads_back_and_round_trips():
    config = rope_config(dict(V3_ROPE, rope_type="deepseek_yarn"), head_dim=NOPE + PE, rotary_offset=NOPE)
    assert (config.rotary_offset, config.rotary_dim, config.style) == (NOPE, PE, "interleaved_to_half")
    assert config.scaling["rope_type"] == "deepseek_yarn" and config.scaling["mscale_all_dim"] == 1.0
    assert rope.Config.from_key(config.key) == config
    assert "rotary_offset=32" in repr(config)


@pytest.mark.parametrize("window, message", [
    (dict(rotary_offset=-1), "rotary_offset = -1: must be >= 0"),
    (dict(rotary_offset=40, rotary_dim=16), "rotary_offset = 40: plus rotary_dim = 16 must not exceed head_dim = 48"),
    (dict(rotary_offset=48), "rotary_offset = 48: must be < head_dim = 48"),
])
def test_bad_window_names_the_parameter(window, message):
    with pytest.raises(rope.Error, match=message):
        rope.Config(head_dim=NOPE + PE, **window)


def test_bad_deepseek_yarn_names_the_parameter():
    with pytest.raises(rope.Error, match="scaling.mscale = -1: must be >= 0"):
        rope_config(dict(V3_ROPE, rope_type="deepseek_yarn", mscale=-1.0))
    with pytest.raises(rope.Error, match="rope_type = deepseek: expected"):
        rope_config(dict(V3_ROPE, rope_type="deepseek"))
    with pytest.raises(rope.Error, match="style = deepseek: expected"):
        rope.Config(head_dim=PE, style="deepseek")
