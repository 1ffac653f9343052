"""rope.apply_qk_norm against HuggingFace's own modules: tiny random Qwen3, Gemma 3 (text)
and OLMo 2 attention blocks built from their configs (no download), whose q_norm / k_norm,
rotary embedding and apply_rotary_pos_emb run in bfloat16 on the CPU.

- The HF rounding modes (hf_qwen3, hf_gemma3, hf_olmo2) give HF's bf16 output bit for bit
  with HF's own cos/sin handed over as the table (rope then rounds them where HF does);
  with rope's own angles (theta_i more accurate than HF's float32 pow) a few elements move
  by one bf16 ulp.
- In float32 storage the HF modes give HF's float32 output bit for bit: every bit of the
  mean shows there, so this checks that the squares are added in PyTorch's order.
- The float32 mode is within one bf16 ulp of the float64 result (HF's norm modules run in
  float64, cos/sin of float64 angles) rounded to bf16.
- The packed qkv form gives the same bits as q and k given apart; v is untouched or copied.
On the host backends here; on CUDA too where there is a GPU (marked cuda)."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")
pytest.importorskip("transformers", reason="transformers is not installed "
                    "(scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")

import rope  # noqa: E402
from test_torch_op import DEVICES, backends_for  # noqa: E402
from transformers import Gemma3TextConfig, Olmo2Config, Qwen3Config  # noqa: E402
from transformers.models.gemma3 import modeling_gemma3  # noqa: E402
from transformers.models.olmo2 import modeling_olmo2  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BATCH, SEQ = 4, 2, 64, 2, 40
POSITION_START = 300  # past bf16's exact integers (256): angles that need care


class Model:
    """One attention block of a model: its norms, rotary embedding and rotation, run as HF runs them."""

    def __init__(self, name):
        self.name = name
        common = dict(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, rms_norm_eps=1e-6, max_position_embeddings=4096, num_hidden_layers=1,
                      intermediate_size=64, vocab_size=32)
        g = torch.Generator().manual_seed(7)
        if name == "qwen3":
            config = Qwen3Config(**common)
            self.module, self.attention = modeling_qwen3, modeling_qwen3.Qwen3Attention(config, layer_idx=0)
            self.rotary = modeling_qwen3.Qwen3RotaryEmbedding(config)
            self.kind, self.rounding, self.weight_centre = "per_head", "hf_qwen3", 1.0
        elif name == "gemma3":
            config = Gemma3TextConfig(**common, layer_types=["full_attention"])
            self.module, self.attention = modeling_gemma3, modeling_gemma3.Gemma3Attention(config, layer_idx=0)
            self.rotary = modeling_gemma3.Gemma3RotaryEmbedding(config)
            self.kind, self.rounding, self.weight_centre = "per_head_gemma", "hf_gemma3", 0.0
        else:
            config = Olmo2Config(**common)
            self.module, self.attention = modeling_olmo2, modeling_olmo2.Olmo2Attention(config, layer_idx=0)
            self.rotary = modeling_olmo2.Olmo2RotaryEmbedding(config)
            self.kind, self.rounding, self.weight_centre = "across_heads", "hf_olmo2", 1.0
        self.config = config
        for norm in (self.attention.q_norm, self.attention.k_norm):  # random weights, not HF's ones / zeros
            # bf16 values, so the bf16 and the float64 model hold the same weights.
            weight = self.weight_centre + 0.5 * torch.randn(norm.weight.shape, generator=g)
            norm.weight.data = weight.to(torch.bfloat16).float()
        parameters = config.rope_parameters
        if name == "gemma3":
            parameters = parameters["full_attention"]
        self.rope_config = rope.Config(head_dim=HEAD_DIM, scaling=dict(parameters))

    def rotary_call(self, x, position_ids):
        if self.name == "gemma3":
            return self.rotary(x, position_ids, "full_attention")
        return self.rotary(x, position_ids)

    def reference(self, q_proj, k_proj, position_ids, dtype):
        """HF's q and k after norm and RoPE, [batch, heads, seq, head_dim], computed in ``dtype``
        from the projections q_proj [batch, seq, HEADS * HEAD_DIM], k_proj."""
        attention = self.attention.to(dtype)
        q_proj, k_proj = q_proj.to(dtype), k_proj.to(dtype)
        shape = (BATCH, SEQ, -1, HEAD_DIM)
        with torch.no_grad():
            if self.name == "olmo2":  # the norm over the whole projection, then the heads
                q = attention.q_norm(q_proj).view(shape).transpose(1, 2)
                k = attention.k_norm(k_proj).view(shape).transpose(1, 2)
            else:
                q = attention.q_norm(q_proj.view(shape)).transpose(1, 2)
                k = attention.k_norm(k_proj.view(shape)).transpose(1, 2)
            cos, sin = self.rotary_call(q_proj, position_ids)
            return self.module.apply_rotary_pos_emb(q, k, cos, sin)

    def table(self, rows):
        """HF's own float32 cos/sin for positions 0..rows-1, in rope's table layout [rows, cos | sin]."""
        with torch.no_grad():
            cos, sin = self.rotary_call(torch.zeros(1, dtype=torch.float32), torch.arange(rows)[None])
        return torch.cat([cos[0, :, :HEAD_DIM // 2], sin[0, :, :HEAD_DIM // 2]], dim=-1).contiguous()

    def weights(self, dtype):
        return (self.attention.q_norm.weight.detach().to(dtype).contiguous(),
                self.attention.k_norm.weight.detach().to(dtype).contiguous())


MODELS = ["qwen3", "gemma3", "olmo2"]


def inputs(seed=11):
    g = torch.Generator().manual_seed(seed)
    q_proj = (torch.randn(BATCH, SEQ, HEADS * HEAD_DIM, generator=g) * 2).to(torch.bfloat16)
    k_proj = (torch.randn(BATCH, SEQ, KV_HEADS * HEAD_DIM, generator=g) * 2).to(torch.bfloat16)
    position_ids = POSITION_START + torch.arange(SEQ)[None].repeat(BATCH, 1) + 37 * torch.arange(BATCH)[:, None]
    return q_proj, k_proj, position_ids


def run_rope(model, q_proj, k_proj, position_ids, rounding, device, backend, table=None, dtype=torch.bfloat16):
    """rope's fused call on the projections as bshd views, out of place into NaN-poisoned tensors."""
    q = q_proj.view(BATCH, SEQ, HEADS, HEAD_DIM).to(device, dtype)
    k = k_proj.view(BATCH, SEQ, KV_HEADS, HEAD_DIM).to(device, dtype)
    out = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
    q_weight, k_weight = (w.to(device) for w in model.weights(dtype))
    rope.apply_qk_norm(q, k, q_weight, k_weight, model.rope_config, position_ids.to(device), kind=model.kind,
                       rounding=rounding, eps=1e-6, out=out, layout="bshd", backend=backend,
                       cos_sin_cache=None if table is None else table.to(device))
    return out[0].transpose(1, 2).cpu(), out[1].transpose(1, 2).cpu()


def bits(t):
    return t.contiguous().view(torch.int16 if t.dtype != torch.float32 else torch.int32).numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_hf_rounding_with_hfs_angles_is_huggingfaces_bf16_bit_for_bit(device, name):
    model = Model(name)
    q_proj, k_proj, position_ids = inputs()
    want_q, want_k = model.reference(q_proj, k_proj, position_ids, torch.bfloat16)
    table = model.table(int(position_ids.max()) + 1)  # HF's float32 cos/sin: rope rounds them where HF does
    for backend in backends_for(device):
        got_q, got_k = run_rope(model, q_proj, k_proj, position_ids, model.rounding, device, backend, table)
        for got, want in ((got_q, want_q), (got_k, want_k)):
            differ = np.count_nonzero(bits(got) != bits(want))
            assert differ == 0, f"{backend}: {differ} of {want.numel()} elements differ from HF's bf16"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_hf_rounding_in_float32_is_huggingfaces_float32_bit_for_bit(device, name):
    """In float32 nothing rounds to a smaller type: every bit of x_hat shows, so this is where the
    sum of squares must be added in PyTorch's CPU order (every backend adds in that order)."""
    model = Model(name)
    q_proj, k_proj, position_ids = inputs(seed=15)
    want_q, want_k = model.reference(q_proj, k_proj, position_ids, torch.float32)
    table = model.table(int(position_ids.max()) + 1)
    for backend in backends_for(device):
        got_q, got_k = run_rope(model, q_proj, k_proj, position_ids, model.rounding, device, backend, table,
                                dtype=torch.float32)
        for got, want in ((got_q, want_q), (got_k, want_k)):
            differ = np.count_nonzero(bits(got) != bits(want))
            assert differ == 0, f"{backend}: {differ} of {want.numel()} elements differ from HF's float32"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_hf_rounding_with_ropes_angles_differs_only_where_the_angles_do(device, name):
    """rope's theta_i is rounded once from double; HF computes base^(2i/d) in float32, so some of its
    cos/sin differ from rope's in float32's last bits: a few elements move by one bf16 ulp, no more."""
    model = Model(name)
    q_proj, k_proj, position_ids = inputs()
    want_q, want_k = model.reference(q_proj, k_proj, position_ids, torch.bfloat16)
    for backend in backends_for(device):
        got_q, got_k = run_rope(model, q_proj, k_proj, position_ids, model.rounding, device, backend)
        for got, want in ((got_q, want_q), (got_k, want_k)):
            differ = np.count_nonzero(bits(got) != bits(want))
            assert differ <= want.numel() // 200, f"{backend}: {differ} elements differ"
            # One ulp of the rotation's operands (normalised values below 4: 2^-6), also where
            # x cos - y sin cancels to a small result.
            assert (got.double() - want.double()).abs().max().item() <= 2.0 ** -6, backend


def float64_reference(model, q_proj, k_proj, position_ids):
    """HF's norm modules in float64, and the rotation with cos/sin from float64 angles
    (HF's rotary embedding computes them in float32)."""
    parameters = model.config.rope_parameters
    base = (parameters["full_attention"] if model.name == "gemma3" else parameters)["rope_theta"]
    attention = model.attention.to(torch.float64)
    shape = (BATCH, SEQ, -1, HEAD_DIM)
    with torch.no_grad():
        if model.name == "olmo2":
            q = attention.q_norm(q_proj.double()).view(shape).transpose(1, 2)
            k = attention.k_norm(k_proj.double()).view(shape).transpose(1, 2)
        else:
            q = attention.q_norm(q_proj.double().view(shape)).transpose(1, 2)
            k = attention.k_norm(k_proj.double().view(shape)).transpose(1, 2)
        theta = base ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
        angles = position_ids.double()[..., None] * theta
        angles = torch.cat([angles, angles], dim=-1)
        return model.module.apply_rotary_pos_emb(q, k, angles.cos(), angles.sin())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_float32_mode_within_one_ulp_of_float64(device, name):
    model = Model(name)
    # The precise angles: at positions near 340 the default float32 angle is off by up to
    # position * 6e-8 radians (chapter 7), more than one ulp of results near zero.
    parameters = model.config.rope_parameters
    model.rope_config = rope.Config(head_dim=HEAD_DIM, precise_angles=True,
                                    scaling=dict(parameters["full_attention"] if name == "gemma3" else parameters))
    q_proj, k_proj, position_ids = inputs(seed=12)
    hf_q, _ = model.reference(q_proj, k_proj, position_ids, torch.bfloat16)
    want_q, want_k = float64_reference(model, q_proj, k_proj, position_ids)
    for backend in backends_for(device):
        got_q, got_k = run_rope(model, q_proj, k_proj, position_ids, "float32", device, backend)
        for got, want in ((got_q, want_q), (got_k, want_k)):
            rounded = want.to(torch.bfloat16).double()
            # One ulp of the rounded result (bf16: 8 significant bits), and at least 2e-6: float32's own
            # rounding of values of order 1, visible where x cos - y sin cancels to nearly 0.
            ulp = torch.pow(2.0, torch.floor(torch.log2(rounded.abs().clamp_min(1e-30))) - 7).clamp_min(2e-6)
            worst = ((got.double() - rounded).abs() / ulp).max().item()
            assert worst <= 1.0, f"{backend}: {worst:.2f} ulp"
        # The float32 mode is the more accurate one, and it is not HF's bf16: they differ somewhere.
        assert np.count_nonzero(bits(got_q) != bits(hf_q)) > 0


@pytest.mark.parametrize("device", DEVICES)
def test_packed_qkv_matches_separate_views_and_leaves_v(device):
    model = Model("qwen3")
    q_proj, k_proj, position_ids = inputs(seed=13)
    g = torch.Generator().manual_seed(14)
    v_proj = torch.randn(BATCH, SEQ, KV_HEADS * HEAD_DIM, generator=g).to(torch.bfloat16)
    want_q, want_k = model.reference(q_proj, k_proj, position_ids, torch.bfloat16)
    tokens = BATCH * SEQ
    q_weight, k_weight = (w.to(device) for w in model.weights(torch.bfloat16))
    ids = position_ids.reshape(-1).to(device)  # packed: one row of ids over all tokens
    table = model.table(int(position_ids.max()) + 1).to(device)  # HF's angles, for HF's bits
    for backend in backends_for(device):
        for copy_v in (False, True):
            # One buffer [tokens, (HEADS + 2 KV_HEADS) * HEAD_DIM] with 8 spare columns per row.
            full = torch.cat([q_proj.reshape(tokens, -1), k_proj.reshape(tokens, -1), v_proj.reshape(tokens, -1),
                              torch.full((tokens, 8), 7.0, dtype=torch.bfloat16)], dim=1).to(device)
            qkv = full[:, :-8]  # a view whose rows are longer than its width
            before = qkv.clone()
            v_out = torch.full((tokens, KV_HEADS, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=device)
            rope.apply_qk_norm_packed(qkv, HEADS, KV_HEADS, q_weight, k_weight, model.rope_config, ids,
                                      kind=model.kind, rounding=model.rounding, backend=backend,
                                      cos_sin_cache=table, v_out=v_out if copy_v else None)
            got = qkv.cpu()
            q_part = got[:, :HEADS * HEAD_DIM].reshape(BATCH, SEQ, HEADS, HEAD_DIM).transpose(1, 2)
            k_part = got[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].reshape(
                BATCH, SEQ, KV_HEADS, HEAD_DIM).transpose(1, 2)
            assert np.array_equal(bits(q_part), bits(want_q)), backend
            assert np.array_equal(bits(k_part), bits(want_k)), backend
            v_part = slice((HEADS + KV_HEADS) * HEAD_DIM, None)
            assert np.array_equal(bits(got[:, v_part]), bits(before[:, v_part].cpu())), "v changed"
            assert torch.all(full[:, -8:] == 7.0), "row padding changed"
            if copy_v:
                assert np.array_equal(bits(v_out.cpu().reshape(tokens, -1)), bits(before[:, v_part].cpu()))


def test_bad_input_names_the_argument_and_writes_nothing():
    model = Model("qwen3")
    q_proj, k_proj, _ = inputs()
    q = q_proj.view(BATCH, SEQ, HEADS, HEAD_DIM).clone()
    k = k_proj.view(BATCH, SEQ, KV_HEADS, HEAD_DIM).clone()
    q_weight, k_weight = model.weights(torch.bfloat16)
    q_before, k_before = q.clone(), k.clone()
    cases = [
        (dict(q_weight=q_weight[:-1]), "q_weight.size"),
        (dict(eps=0.0), "eps"),
        (dict(eps=float("nan")), "eps"),
        (dict(eps=-1.0), "eps"),
        (dict(kind="across_heads"), "q_weight.size"),
        (dict(kind="rms"), "kind"),
        (dict(rounding="hf_llama"), "rounding"),
        (dict(q_weight=q_weight.half()), "q_weight.dtype"),
    ]
    for change, parameter in cases:
        call = dict(q_weight=q_weight, k_weight=k_weight, eps=1e-6, kind="per_head", rounding="hf_qwen3")
        call.update(change)
        with pytest.raises(rope.Error, match=parameter.replace(".", r"\.")):
            rope.apply_qk_norm(q, k, call["q_weight"], call["k_weight"], model.rope_config, kind=call["kind"],
                               rounding=call["rounding"], eps=call["eps"], layout="bshd")
        assert torch.equal(q, q_before) and torch.equal(k, k_before)
    qkv = torch.randn(5, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(torch.bfloat16)
    qkv_before = qkv.clone()
    with pytest.raises(rope.Error, match=r"qkv\.width"):
        rope.apply_qk_norm_packed(qkv, HEADS, KV_HEADS + 1, q_weight, k_weight, model.rope_config)
    assert torch.equal(qkv, qkv_before)
