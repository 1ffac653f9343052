"""rope.hf on real transformers models: tiny random-initialised models built from their
configs (nothing downloaded), one per supported family, patched and compared with the
same model unpatched.

The metric for logits: max |patched - HF| / max |HF|, over every logit of the batch,
at most 1e-5 in float32, at positions up to 1,523 (generation goes to 2,020). Both
sides form the angles in float32 as position x inv_freq, but HF computes inv_freq in
float32 arithmetic (up to about 2 ulp off in a pair) and rope rounds it once from
double; the angles drift apart in proportion to the position, so at ~3,700 llama3
and Qwen3 (head_dim 128) exceed 1e-5 on these models (up to 1.8e-5), while a float64
rotation of the same model is about 2e-5 from either.

Greedy generation: every token of 20 decode steps identical (with HF's KV cache, so
decode positions go through the patched path). The weights are initialised with 5x
HF's default standard deviation so that attention is sharp enough for a wrong rotation
to move the logits far beyond the tolerance (test_a_wrong_rope_fails_the_metric).
"""

import pathlib
import re
import threading

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")

import rope  # noqa: E402
import rope.hf  # noqa: E402

TOLERANCE = 1e-5
VOCAB = 96
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=8192, initializer_range=0.1, bos_token_id=1,
            eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
THETA = {"rope_type": "default", "rope_theta": 10000.0}
VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, num_heads=2, hidden_size=64, mlp_ratio=2),
    "qwen2_5_vl": dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                       fullatt_block_indexes=[0]),
    "qwen3_vl": dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                     deepstack_visual_indexes=[0], num_position_embeddings=16),
}


def build(family, rope_parameters=None, seed=0, **extra):
    """A tiny random-initialised model of ``family`` in float32 eval mode, same weights for the same seed."""
    text = dict(TINY, **extra)
    if family in VISION:
        # M-RoPE sections of 8 pairs (head_dim 16); Qwen3-VL interleaves them (T H W T H W T T), the others
        # give each axis a contiguous run.
        parameters = rope_parameters or dict(THETA, mrope_section=[4, 2, 2] if family == "qwen3_vl" else [2, 3, 3])
        config = transformers.AutoConfig.for_model(
            family, text_config=dict(text, head_dim=16, rope_parameters=parameters), vision_config=VISION[family],
            image_token_id=3, video_token_id=4, vision_start_token_id=5)
        factory = transformers.AutoModelForImageTextToText
    else:
        if family == "gpt_neox":
            text.pop("num_key_value_heads")
            text["intermediate_size"] = 128
        parameters = rope_parameters or dict(THETA, **({"partial_rotary_factor": 0.5} if family == "phi3" else {}))
        config = transformers.AutoConfig.for_model(family, **text, rope_parameters=parameters)
        factory = transformers.AutoModelForCausalLM
    torch.manual_seed(seed)
    return factory.from_config(config, dtype=torch.float32).eval()


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "phi3", "gpt_neox"]
MROPE = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}


def inputs(family, batch=2, seq=24, seed=1):
    """Token ids, and position ids far from 0 (up to 1,523; each axis its own for M-RoPE)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, VOCAB, (batch, seq), generator=g)
    start = torch.tensor([[900], [1500]])[:batch]
    positions = start + torch.arange(seq)
    if family in MROPE:  # temporal, height, width: three different grids
        positions = torch.stack([positions, positions // 4 + 7, positions % 5 + 40 * torch.arange(batch)[:, None]])
    return ids, positions


@pytest.fixture
def rope_calls(monkeypatch):
    """The calls of rope.ops.rope made while the test runs (proof the patched path is rope's)."""
    calls = []
    real = rope.ops.rope

    def counted(q, k, config, *args, **kwargs):
        calls.append((tuple(q.shape), config))
        return real(q, k, config, *args, **kwargs)

    monkeypatch.setattr(rope.ops, "rope", counted)
    return calls


def relative_error(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


def logits(model, ids, positions):
    with torch.no_grad():
        return model(input_ids=ids, position_ids=positions).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_huggingface_and_undo_restores_it_exactly(family, rope_calls):
    model = build(family)
    ids, positions = inputs(family)
    want = logits(model, ids, positions)
    want_default = logits(model, ids, None)  # positions 0.. (for M-RoPE: HF's own text positions)
    with rope.hf.patch(model) as patch:
        assert rope.hf.is_patched(model) and patch.active
        got = logits(model, ids, positions)
        got_default = logits(model, ids, None)
    assert len(rope_calls) == 2 * TINY["num_hidden_layers"]  # each layer of both forwards went through rope
    assert rope_calls[0][1] == patch.configs[0]
    assert not rope.hf.is_patched(model)
    assert relative_error(got, want) <= TOLERANCE
    assert relative_error(got_default, want_default) <= TOLERANCE
    # Undone: HF's own code again, bit for bit.
    assert torch.equal(logits(model, ids, positions), want)
    assert torch.equal(logits(model, ids, None), want_default)


def test_a_wrong_rope_fails_the_metric():
    # The same weights, rope_theta 10000 against 500000: the metric sees the difference.
    ids, positions = inputs("llama")
    a = logits(build("llama"), ids, positions)
    b = logits(build("llama", dict(THETA, rope_theta=500000.0)), ids, positions)
    assert relative_error(b, a) > 100 * TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_huggingface_over_20_steps(family, rope_calls):
    model = build(family)
    prompt, _ = inputs(family, seq=8, seed=2)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0  # the first prompt left-padded: its own positions in the batch
    prompt[0, :3] = 0
    settings = dict(attention_mask=mask, max_new_tokens=20, min_new_tokens=20, do_sample=False, use_cache=True)
    with torch.no_grad():
        want = model.generate(prompt, **settings)
        with rope.hf.patch(model):
            got = model.generate(prompt, **settings)
    assert got.shape == (2, 28)
    assert len(rope_calls) == 20 * TINY["num_hidden_layers"]  # the prefill and 19 decode steps
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", sorted(MROPE))
def test_greedy_tokens_match_huggingface_with_an_image(family):
    # An image of 4 x 6 patches (2 x 3 tokens after merging) between text tokens: HF's
    # get_rope_index gives the image tokens their (t, h, w) grid positions, the text after it
    # positions shifted back (rope_deltas), which the decode steps continue from.
    model = build(family)
    vision = model.config.vision_config
    grid = torch.tensor([[1, 4, 6]])
    g = torch.Generator().manual_seed(7)
    pixels = torch.randn(int(grid.prod()), 3 * vision.temporal_patch_size * vision.patch_size ** 2, generator=g)
    image_tokens = int(grid.prod()) // vision.spatial_merge_size ** 2
    text = torch.randint(6, VOCAB, (1, 10), generator=g)
    ids = torch.cat([text[:, :4], torch.tensor([[5] + [3] * image_tokens]), text[:, 4:]], dim=1)
    inputs = dict(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=(ids == 3).int(),
                  max_new_tokens=20, min_new_tokens=20, do_sample=False)
    seen = []
    with torch.no_grad():
        want = model.generate(**inputs)
        with rope.hf.patch(model) as patch:
            rotary = patch._rotaries[0]
            hook = rotary.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
            got = model.generate(**inputs)
            hook.remove()
    assert not torch.equal(seen[0][1], seen[0][2])  # the image's rows and columns: the axes differ
    assert torch.equal(got, want)


# Scaling types, given to the model as HF users write them: positions beyond the original context.
SCALINGS = {
    "llama3": ("llama", dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=512)),
    "yarn": ("llama", dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=1024)),
    "linear": ("qwen2", dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    "longrope": ("phi3", dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
                              short_factor=[1.0, 1.1, 1.3, 2.0], long_factor=[1.0, 2.5, 6.0, 12.0],
                              original_max_position_embeddings=1024)),
}


@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_models_match_huggingface(name):
    family, parameters = SCALINGS[name]
    model = build(family, dict(parameters))
    ids, positions = inputs(family)
    short = positions - 890  # within the original context: longrope's short factors
    want = [logits(model, ids, p) for p in (positions, short)]
    with rope.hf.patch(model) as patch:
        assert patch.configs[0].scaling["rope_type"] == name
        got = [logits(model, ids, p) for p in (positions, short)]
    for g, w in zip(got, want):
        assert relative_error(g, w) <= TOLERANCE


def test_generation_from_a_long_prompt_with_yarn():
    # 2,000 prompt tokens (yarn beyond its original 1,024), then 20 decode steps from position 2,000.
    model = build("llama", dict(SCALINGS["yarn"][1]))
    prompt = torch.randint(6, VOCAB, (1, 2000), generator=torch.Generator().manual_seed(5))
    settings = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    with torch.no_grad():
        want = model.generate(prompt, **settings)
        with rope.hf.patch(model):
            got = model.generate(prompt, **settings)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["qwen3", "qwen2_vl", "gpt_neox"])
def test_gradients_flow_and_match_huggingface(family, rope_calls):
    model = build(family).train()
    ids, positions = inputs(family)

    def gradients():
        model.zero_grad()
        out = model(input_ids=ids, position_ids=positions, labels=ids)
        out.loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    want = gradients()
    with rope.hf.patch(model):
        got = gradients()
    assert len(rope_calls) == TINY["num_hidden_layers"]
    assert got.keys() == want.keys()
    # q and k projections get their gradient only through the rotation.
    assert any("q_proj" in n or "query_key_value" in n for n in got)
    for name in want:
        assert relative_error(got[name], want[name]) <= 1e-4, name


def test_models_patched_and_not_run_side_by_side_in_threads():
    # One patched model and one not, of the same family, each in its own thread: the
    # positions travel with each call, so neither sees the other's.
    patched, plain = build("qwen2", seed=0), build("qwen2", seed=1)
    ids, positions = inputs("qwen2")
    want = {"patched": logits(patched, ids, positions), "plain": logits(plain, ids, positions)}
    results, errors = {}, []

    def run(name, model):
        try:
            for _ in range(6):
                results.setdefault(name, []).append(logits(model, ids, positions))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    with rope.hf.patch(patched):
        threads = [threading.Thread(target=run, args=(n, m)) for n, m in (("patched", patched), ("plain", plain))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    assert all(torch.equal(out, want["plain"]) for out in results["plain"])  # never touched by the patch
    assert all(relative_error(out, want["patched"]) <= TOLERANCE for out in results["patched"])


def test_patching_twice_or_undoing_twice_is_refused_and_hf_function_comes_back():
    from transformers.models.llama import modeling_llama
    original = modeling_llama.apply_rotary_pos_emb
    a, b = build("llama", seed=0), build("llama", seed=1)
    first = rope.hf.patch(a)
    with pytest.raises(rope.Error, match="already patched"):
        rope.hf.patch(a)
    second = rope.hf.patch(b)
    assert modeling_llama.apply_rotary_pos_emb is not original
    first.undo()
    assert modeling_llama.apply_rotary_pos_emb is not original  # b still needs it
    with pytest.raises(rope.Error, match="already undone"):
        first.undo()
    with pytest.raises(rope.Error, match="not patched"):
        rope.hf.unpatch(a)
    rope.hf.unpatch(b)
    assert not second.active
    assert modeling_llama.apply_rotary_pos_emb is original


def test_unknown_model_type_is_refused_with_its_name():
    config = transformers.AutoConfig.for_model("olmo", **TINY)  # a RoPE model rope.hf does not know
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(rope.Error, match="model_type = olmo: rope.hf does not know this model type"):
        rope.hf.patch(model)
    assert not rope.hf.is_patched(model)


@pytest.mark.parametrize("model_type, why", [("gemma3_text", "QK-norm"), ("deepseek_v3", "MLA")])
def test_pending_model_types_are_refused_with_the_reason(model_type, why):
    extra = dict(head_dim=16) if model_type == "gemma3_text" else dict(
        kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=2)
    config = transformers.AutoConfig.for_model(model_type, **TINY, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(rope.Error, match=f"model_type = {model_type}: .*{why}"):
        rope.hf.patch(model)


def test_dynamic_scaling_is_refused():
    model = build("llama", dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))
    with pytest.raises(rope.Error, match="dynamic"):
        rope.hf.patch(model)
    assert not rope.hf.is_patched(model)


def test_the_docs_example_runs():
    # docs/python.md, section "rope.hf": its code blocks, run as written.
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    section = page[page.index('<!-- BEGIN section "rope.hf"'):page.index('<!-- END section "rope.hf"')]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), namespace)


# --- CUDA, bfloat16 -------------------------------------------------------------------------------
def stepwise_logits(model, sequence, prompt_length):
    """The logits of each decode step along ``sequence`` (teacher-forced), through the KV cache:
    [batch, steps, vocab], step i predicting sequence[:, prompt_length + i]."""
    out = model(input_ids=sequence[:, :prompt_length], use_cache=True)
    steps, cache = [out.logits[:, -1]], out.past_key_values
    for t in range(prompt_length, sequence.shape[1] - 1):
        out = model(input_ids=sequence[:, t:t + 1], past_key_values=cache, use_cache=True)
        steps.append(out.logits[:, -1])
        cache = out.past_key_values
    return torch.stack(steps, dim=1).float()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_on_cuda_tokens_agree_wherever_huggingface_bf16_and_fp32_agree(family):
    # Along HF's float32 greedy tokens (20 decode steps, KV cache), each step's token from
    # HF in float32, HF in bfloat16 and rope in bfloat16. Where HF's own bfloat16 run picks
    # float32's token, by a margin beyond its own error at that step (a near tie is noise
    # for any bfloat16 run), rope must pick it too; and rope's logits are no further from
    # float32's than HF's bfloat16 ones.
    model = build(family).cuda()
    prompt, _ = inputs(family, seq=8, seed=2)
    prompt = prompt.cuda()
    with torch.no_grad():
        reference = model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False)
        want = stepwise_logits(model, reference, 8)
        model = model.to(torch.bfloat16)
        hf = stepwise_logits(model, reference, 8)
        with rope.hf.patch(model):
            got = stepwise_logits(model, reference, 8)
    tokens = reference[:, 8:]
    top2 = want.topk(2, dim=-1).values
    decided = top2[..., 0] - top2[..., 1] > 2 * (hf - want).abs().amax(dim=-1)
    trusted = (hf.argmax(dim=-1) == tokens) & decided
    assert trusted.sum() >= tokens.numel() // 2, "HF's bfloat16 run agrees too rarely to compare"
    assert torch.equal(got.argmax(dim=-1)[trusted], tokens[trusted])
    assert relative_error(got, want) <= 1.5 * relative_error(hf, want)
