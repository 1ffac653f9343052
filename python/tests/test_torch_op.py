"""The PyTorch operators (rope.ops): against the float64 oracle and HuggingFace,
with their registration checked by torch.library.opcheck, kept whole in a
torch.compile(fullgraph=True) graph, and differentiated (gradcheck; the backward as the
inverse rotation). test_huggingface.py compares them with transformers. On the
host backends here; on CUDA too where there is a GPU (marked cuda)."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (scripts/install-python-deps installs it unless ROPE_PYTHON_TORCH=0)")

import oracle  # noqa: E402
import rope  # noqa: E402
from rope import ops  # noqa: E402

CUDA = torch.cuda.is_available() and rope.list_backends()[3].available
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not CUDA, reason="needs a CUDA device and rope built with CUDA")])]


def backends_for(device):
    return [b.name for b in rope.list_backends() if b.available and b.device == ("cuda" if device == "cuda" else "host")]


def to_numpy(t):
    return t.detach().to("cpu", torch.float64).numpy()


def check(got, want, rel_tol=5e-6, abs_tol=1.5e-4):
    rel, worst = oracle.relative_l2(to_numpy(got), want), oracle.max_abs(to_numpy(got), want)
    assert rel < rel_tol and worst < abs_tol, f"relative L2 {rel:.3g}, max abs {worst:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, (5e-6, 1.5e-4)), (torch.bfloat16, (8e-3, 3e-2)),
                                             (torch.float16, (1e-3, 4e-3))])
def test_functional_and_in_place_against_oracle(device, dtype, tolerance):
    for backend in backends_for(device):
        g = torch.Generator().manual_seed(1)
        q = (torch.rand(2, 8, 16, 64, generator=g) * 2 - 1).to(device, dtype)
        k = (torch.rand(2, 2, 16, 64, generator=g) * 2 - 1).to(device, dtype)
        config = rope.Config(head_dim=64, rotary_dim=32, base=10000.0)
        q_rot, k_rot = ops.rope(q, k, config, positions=9, backend=backend)
        theta, positions = oracle.theta(32, 10000.0), oracle.offset_positions(2, 16, 9)
        check(q_rot, oracle.rope(to_numpy(q), positions, theta, rotary_dim=32), *tolerance)
        check(k_rot, oracle.rope(to_numpy(k), positions, theta, rotary_dim=32), *tolerance)
        q2, k2 = q.clone(), k.clone()
        assert ops.rope_(q2, k2, config, positions=9, backend=backend) == (q2, k2)
        assert torch.equal(q2, q_rot) and torch.equal(k2, k_rot)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_apply_on_torch_tensors_is_zero_copy(device):
    q = torch.rand(1, 4, 8, 32, device=device)
    pointer = q.data_ptr()
    before = q.clone()
    out_q, _ = rope.apply(q, None, rope.Config(head_dim=32), positions=3)
    assert out_q is q and q.data_ptr() == pointer and not torch.equal(q, before)


def test_a_tensor_that_requires_grad_names_the_way_out():
    # rope.apply is not differentiable: autograd would silently lose the gradient.
    q = torch.rand(1, 2, 4, 16, requires_grad=True)
    before = q.detach().clone()
    with pytest.raises(rope.Error, match="q = a tensor that requires grad: rope.apply is not differentiable: "
                                         "use rope.ops.rope"):
        rope.apply(q, None, rope.Config(head_dim=16))
    assert torch.equal(q.detach(), before)
    with torch.no_grad():
        rope.apply(q, None, rope.Config(head_dim=16), positions=1)
    assert not torch.equal(q.detach(), before)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    # Schema (the mutation of q and k declared), fake tensors, autograd registration, AOT dispatch.
    config = rope.Config(head_dim=32, scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 64})
    q, k = torch.randn(2, 4, 8, 32, device=device), torch.randn(2, 2, 8, 32, device=device)
    common = (config.key, 100, None, None, None, 1, 0, None, "bhsd", False, "", 0)
    torch.library.opcheck(torch.ops.rope.apply_.default, (q.clone(), k.clone(), *common))
    torch.library.opcheck(torch.ops.rope.apply.default, (q.clone().requires_grad_(), k.clone().requires_grad_(),
                                                         *common))
    ids = torch.randint(0, 300, (8,), device=device)
    torch.library.opcheck(torch.ops.rope.apply.default, (q.clone(), None, config.key, 0, ids, None, None, 1, 0, None,
                                                         "bhsd", True, "", 0))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_keeps_the_operators(device):
    config = rope.Config(head_dim=64, base=500000.0)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(str(graph_module.graph))
        return graph_module.forward

    def attention_scores(q, k, positions):
        q, k = ops.rope(q * 0.5, k, config, positions=positions)  # functional
        q2, k2 = q.clone(), k.clone()
        ops.rope_(q2, k2, config, positions=positions, inverse=True)  # in place: undoes the rotation
        return (q @ k.transpose(-1, -2)).softmax(-1), q2, k2

    q, k = torch.randn(1, 4, 16, 64, device=device), torch.randn(1, 4, 16, 64, device=device)
    ids = torch.arange(16, device=device) * 3
    want = attention_scores(q, k, ids)
    got = torch.compile(attention_scores, fullgraph=True, backend=recording_backend)(q, k, ids)
    assert len(graphs) == 1, "one graph: no graph break"
    assert "target=torch.ops.rope.apply]" in graphs[0] and "target=torch.ops.rope.apply_]" in graphs[0]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # And through PyTorch's own compiler (Inductor), end to end.
    torch._dynamo.reset()
    got = torch.compile(attention_scores, fullgraph=True)(q, k, ids)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(got[1], q * 0.5)  # the in-place inverse undid the functional forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}])
def test_gradcheck(device, style, scaling):
    # rope stores float32 at most, so the operator runs in float32 inside a float64
    # function: finite differences with eps 1e-3 are exact for a linear map up to
    # float32 rounding (~1e-4 relative), which the tolerances allow.
    config = rope.Config(head_dim=16, rotary_dim=12, style=style, scaling=scaling)

    def rotate(q, k):
        q_out, k_out = ops.rope(q.float(), k.float(), config, positions=20)
        return q_out.double(), k_out.double()

    q = torch.randn(1, 2, 5, 16, dtype=torch.float64, device=device, requires_grad=True)
    k = torch.randn(1, 1, 5, 16, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(rotate, (q, k), eps=1e-3, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_is_the_inverse_rotation_of_the_gradient(device):
    config = rope.Config(head_dim=32, style="gptj")
    q = torch.randn(2, 4, 8, 32, device=device, requires_grad=True)
    grad = torch.randn(2, 4, 8, 32, device=device)
    q_out, _ = ops.rope(q, None, config, positions=7)
    q_out.backward(grad)
    want = oracle.rope(to_numpy(grad), oracle.offset_positions(2, 8, 7), oracle.theta(32, 10000.0), "gptj",
                       inverse=True)
    check(q.grad, want)


# --- torch.ops.rope.apply_ registered in C++ (python/torch_ops/) --------------------------------
LIBRARY = pathlib.Path(rope.__file__).parent / "_torch_ops.so"
CPP_EXPECTED = os.environ.get("ROPE_EXPECT_CPP_OPERATOR") == "1" or LIBRARY.exists()


def test_in_place_operator_is_the_cpp_one_where_built():
    # Registered from Python (custom_op), every call costs Python dispatch (~17 us on the GPU
    # machine): where the library was built, the operator must be its C++ kernel.
    if not CPP_EXPECTED:
        pytest.skip("rope/_torch_ops.so was not built (PyTorch absent at build time): the Python operator is used")
    if os.environ.get("ROPE_PYTHON_OPERATOR") == "1":
        pytest.skip("ROPE_PYTHON_OPERATOR=1 asks for the Python operator")
    assert ops.CPP_OPERATOR == str(LIBRARY.resolve()), "rope/_torch_ops.so was built but rope.ops did not load it"
    for operator in ("rope::apply_", "rope::apply"):
        kernels = {line.split(":")[0]: line for line in torch._C._dispatch_dump(operator).splitlines()}
        for key in ("CPU", "CUDA"):  # A C++ kernel is callable unboxed; one registered from Python is boxed only.
            assert "unboxed" in kernels[key] and "operator" in kernels[key], (operator, kernels[key])


def test_cpp_and_python_read_every_config_key_alike():
    # The C++ kernel reads config.key itself (python/src/config_key.cpp): bit for bit the
    # same rotation as rope.apply with the Config object, for every kind of configuration.
    configs = [
        (rope.Config(head_dim=64, rotary_dim=48, style="gptj", base=500000.0, precise_angles=True), 1),
        (rope.Config(head_dim=64, scaling={"rope_type": "linear", "factor": 2.5}), 1),
        (rope.Config(head_dim=64, scaling={"rope_type": "dynamic", "factor": 2.0,
                                           "original_max_position_embeddings": 16}), 1),
        (rope.Config(head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                           "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0,
                                           "truncate": False}), 1),
        (rope.Config(head_dim=64, scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0}), 1),
        (rope.Config(head_dim=64, scaling={"rope_type": "longrope", "factor": 4.0,
                                           "original_max_position_embeddings": 32, "attention_factor": 1.2,
                                           "short_factor": [1.0 + i / 64 for i in range(32)],
                                           "long_factor": [1.0 + i / 8 for i in range(32)]}), 1),
        (rope.Config(head_dim=64, mrope_section=[8, 12, 12]), 3),
        (rope.Config(head_dim=64, mrope_section=[12, 10, 10], mrope_interleaved=True), 3),
        (rope.Config(head_dim=64, axial_sections=[16, 16]), 2),
    ]
    g = torch.Generator().manual_seed(3)
    for config, axes in configs:
        q, k = torch.randn(1, 4, 6, 64, generator=g), torch.randn(1, 2, 6, 64, generator=g)
        ids = torch.randint(0, 200, (axes, 6) if axes > 1 else (6,), generator=g)
        want_q, want_k = q.clone(), k.clone()
        rope.apply(want_q, want_k, config, positions=ids, backend="cpu-naive")
        torch.ops.rope.apply_(q, k, config.key, 0, ids, None, None, 1, 0, None, "bhsd", False, "cpu-naive", 0)
        assert torch.equal(q, want_q) and torch.equal(k, want_k), config


@pytest.mark.parametrize("case", ["k dtype", "q head_dim", "ids dtype", "config key", "layout"])
def test_bad_input_to_the_operator_names_it_and_writes_nothing(case):
    config = rope.Config(head_dim=32)
    q, k = torch.randn(1, 4, 8, 32), torch.randn(1, 2, 8, 32)
    ids, key, layout = None, config.key, "bhsd"
    if case == "k dtype":
        k, expected = k.double(), "k.dtype = float64: must be float32, float16 or bfloat16"
    elif case == "q head_dim":
        q, k, expected = torch.randn(1, 4, 8, 64), torch.randn(1, 2, 8, 64), "q head_dim = 64: must equal config.head_dim"
    elif case == "ids dtype":
        ids, expected = torch.arange(8, dtype=torch.float32), "positions = float32: must be integers"
    elif case == "config key":
        key, expected = key.replace('"neox"', '"llama"'), "style = llama"
    else:
        layout, expected = "hsd", "layout = hsd"
    q_before, k_before = q.clone(), k.clone()
    with pytest.raises(ValueError, match=re.escape(expected)):  # rope.Error from the Python operator, a ValueError
        torch.ops.rope.apply_(q, k, key, 0, ids, None, None, 1, 0, None, layout, False, "", 0)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)
    if case != "config key":  # rope.ops.rope_ takes a Config: its key cannot be wrong.
        with pytest.raises(rope.Error, match=re.escape(expected)):
            ops.rope_(q, k, config, positions=ids, layout=layout)
        assert torch.equal(q, q_before) and torch.equal(k, k_before)


def test_in_place_operator_moves_the_version_counters():
    # So autograd refuses a backward that would read a saved q or k after the rotation changed it.
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)
    versions = q._version, k._version
    torch.ops.rope.apply_(q, k, rope.Config(head_dim=16).key, 1, None, None, None, 1, 0, None, "bhsd", False, "", 0)
    assert (q._version, k._version) == (versions[0] + 1, versions[1] + 1)
    x = torch.randn(1, 2, 4, 16, requires_grad=True)
    y = x * 2
    saved = y.sin()  # sin saves y for its backward
    torch.ops.rope.apply_(y.detach(), None, rope.Config(head_dim=16).key, 1, None, None, None, 1, 0, None, "bhsd",
                          False, "", 0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


def test_eager_rope_is_the_cpp_kernel_without_the_dispatcher():
    # rope.ops.rope_ in eager code calls rope._torch_ops.rope_ (python/torch_ops/eager.cpp): the
    # operator's kernel with the same results, the same version-counter moves, rope.Error for bad input.
    if not CPP_EXPECTED:
        pytest.skip("rope/_torch_ops.so was not built (PyTorch absent at build time): rope_ calls the operator")
    if os.environ.get("ROPE_PYTHON_OPERATOR") == "1":
        pytest.skip("ROPE_PYTHON_OPERATOR=1 asks for the Python operator")
    config = rope.Config(head_dim=32, style="gptj", base=500.0)
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 4, 8, 32, generator=g), torch.randn(2, 2, 8, 32, generator=g)
    ids = torch.randint(0, 500, (8,), generator=g)
    want_q, want_k = q.clone(), k.clone()
    torch.ops.rope.apply_(want_q, want_k, config.key, 0, ids, None, None, 1, 0, None, "bhsd", False, "cpu-naive", 0)
    versions = q._version, k._version
    ops.rope_(q, k, config, positions=ids, backend="cpu-naive")
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert (q._version, k._version) == (versions[0] + 1, versions[1] + 1)
    # Inference tensors carry no version counter: rotated inside torch.inference_mode(); outside it
    # refused by both, as PyTorch refuses its own in-place operators there, before anything is written.
    with torch.inference_mode():
        a, b = torch.randn(1, 2, 4, 32, generator=g), torch.randn(1, 2, 4, 32, generator=g)
        want_a, want_b = a.clone(), b.clone()
        ops.rope_(a, b, config, positions=3)
        torch.ops.rope.apply_(want_a, want_b, config.key, 3, None, None, None, 1, 0, None, "bhsd", False, "", 0)
    assert torch.equal(a, want_a) and torch.equal(b, want_b)
    expected = "k = an inference tensor: is rotated in place outside torch.inference_mode()"
    for call in (lambda: ops.rope_(q, a, config, positions=3),
                 lambda: torch.ops.rope.apply_(q, a, config.key, 3, None, None, None, 1, 0, None, "bhsd", False, "",
                                               0)):
        with pytest.raises(ValueError, match=re.escape(expected)):
            call()
        assert torch.equal(q, want_q) and torch.equal(a, want_a)
    # Only torch tensors: anything else is named, and nothing is written.
    q_before = q.clone()
    with pytest.raises(rope.Error, match=re.escape("k = numpy.ndarray: must be a torch.Tensor")):
        ops.rope_(q, k.numpy(), config, positions=ids)
    assert torch.equal(q, q_before)


def test_rope_apply_takes_the_eager_entry_for_torch_tensors_and_dlpack_for_the_rest():
    # rope.apply in place on plain torch tensors calls rope._torch_ops.apply_ (eager.cpp): the operator's
    # kernel, whose version-counter move the DLPack way does not make. Every other call goes through
    # DLPack as before: an argument that is no torch.Tensor, out=, an explicit stream, and an inference
    # tensor outside torch.inference_mode() (rotated, as rope.apply always has).
    if not CPP_EXPECTED or os.environ.get("ROPE_PYTHON_OPERATOR") == "1":
        pytest.skip("rope/_torch_ops.so not loaded: rope.apply has no eager entry")
    config = rope.Config(head_dim=32, base=500.0)
    g = torch.Generator().manual_seed(11)
    q, k = torch.randn(2, 4, 8, 32, generator=g), torch.randn(2, 2, 8, 32, generator=g)
    want_q, want_k = q.clone(), k.clone()
    ops.rope_(want_q, want_k, config, positions=5, backend="cpu-naive")
    versions = q._version, k._version
    assert rope.apply(q, k, config, positions=5, backend="cpu-naive") == (q, k)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert (q._version, k._version) == (versions[0] + 1, versions[1] + 1)

    def through_dlpack(call, q, k):
        before = q._version
        call(q, k)
        assert q._version == before  # The DLPack way moves no counter.

    fresh = [(torch.randn(2, 4, 8, 32, generator=g), torch.randn(2, 2, 8, 32, generator=g)) for _ in range(3)]
    for (a, b), call in zip(fresh, (
            lambda a, b: rope.apply(a, b.numpy(), config, positions=5, backend="cpu-naive"),
            lambda a, b: rope.apply(a, b, config, positions=5, backend="cpu-naive", stream=0),
            lambda a, b: rope.apply(a.clone(), b.clone(), config, positions=5, backend="cpu-naive", out=(a, b)))):
        start_a, start_b = a.clone(), b.clone()
        through_dlpack(call, a, b)
        expected_a, expected_b = start_a.clone(), start_b.clone()
        ops.rope_(expected_a, expected_b, config, positions=5, backend="cpu-naive")
        assert torch.equal(a, expected_a) and torch.equal(b, expected_b)
    with torch.inference_mode():
        a, b = torch.randn(1, 2, 4, 32, generator=g), torch.randn(1, 2, 4, 32, generator=g)
        want_a, want_b = a.clone(), b.clone()
        ops.rope_(want_a, want_b, config, positions=3)
    rope.apply(a, b, config, positions=3)
    assert torch.equal(a, want_a) and torch.equal(b, want_b)
    # A bad call is refused by name through the entry, before anything is written.
    q_before = q.clone()
    with pytest.raises(rope.Error, match=re.escape("k heads = 3: must divide q heads = 4")):
        rope.apply(q, torch.randn(2, 3, 8, 32, generator=g), config)
    assert torch.equal(q, q_before) and q._version == versions[0] + 1


def test_eager_rope_leaves_to_the_dispatcher_what_pytorch_must_see():
    # rope.ops.rope_'s C++ entry declines a call that a mode or a tensor subclass must see, and
    # the argument forms that Python converts first: each such call goes through
    # torch.ops.rope.apply_ (the mode below records it), with the same result as the plain call.
    if not CPP_EXPECTED or os.environ.get("ROPE_PYTHON_OPERATOR") == "1":
        pytest.skip("rope/_torch_ops.so not loaded: rope_ has no C++ entry")
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []  # What the modes below saw, in order.

    def record_and_run(func, args, kwargs):
        calls.append(str(func))
        return func(*args, **(kwargs or {}))

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return record_and_run(func, args, kwargs)

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return record_and_run(func, args, kwargs)

    class Subclass(torch.Tensor):
        pass

    config = rope.Config(head_dim=16, base=300.0)
    g = torch.Generator().manual_seed(11)
    q0, k0 = torch.randn(1, 4, 6, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    ids = [5, 1, 4, 4, 0, 9]
    want_q, want_k = q0.clone(), k0.clone()
    torch.ops.rope.apply_(want_q, want_k, config.key, 0, torch.tensor(ids), None, None, 1, 0, None, "bhsd", False,
                          "cpu-naive", 0)
    for mode in (Recording(), Seen()):
        q, k = q0.clone(), k0.clone()
        calls.clear()
        with mode:
            ops.rope_(q, k, config, positions=torch.tensor(ids), backend="cpu-naive")
        assert any("rope.apply_" in call for call in calls), calls
        assert torch.equal(q, want_q) and torch.equal(k, want_k)
    # A subclass goes through __torch_function__ (the dispatcher's way); the data is rotated alike.
    q, k = q0.clone().as_subclass(Subclass), k0.clone()
    calls.clear()
    with Seen():
        ops.rope_(q, k, config, positions=torch.tensor(ids), backend="cpu-naive")
    assert any("rope.apply_" in call for call in calls), calls
    assert torch.equal(q.as_subclass(torch.Tensor), want_q) and torch.equal(k, want_k)
    # Positions as a list, cp as a list, a non-bool inverse: converted in Python, same results.
    q, k = q0.clone(), k0.clone()
    ops.rope_(q, k, config, positions=ids, cp=[1, 0], backend="cpu-naive")
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    ops.rope_(q, k, config, positions=torch.tensor(ids), inverse=1, backend="cpu-naive")
    assert torch.allclose(q, q0, atol=1e-6) and torch.allclose(k, k0, atol=1e-6)
    # The entry's own defaults: a 3-dimensional q is packed ("thd"), as rope.apply reads it.
    packed_q, packed_k = torch.randn(6, 4, 16, generator=g), torch.randn(6, 2, 16, generator=g)
    want_pq, want_pk = packed_q.clone(), packed_k.clone()
    rope.apply(want_pq, want_pk, config, positions=2, backend="cpu-naive")
    ops.rope_(packed_q, packed_k, config, positions=2, backend="cpu-naive")
    assert torch.equal(packed_q, want_pq) and torch.equal(packed_k, want_pk)
    # Not a tensor at all: rope.Error naming the argument, nothing written.
    q = q0.clone()
    with pytest.raises(rope.Error, match=re.escape("q = numpy.ndarray: must be a torch.Tensor")):
        ops.rope_(q.numpy(), k0, config)
    with pytest.raises(rope.Error, match=re.escape("cos_sin_cache = list: must be a torch.Tensor")):
        ops.rope_(q, None, config, cos_sin_cache=[1.0, 0.0])
    assert torch.equal(q, q0)


def test_eager_functional_rope_is_the_operator_without_the_dispatcher():
    # rope.ops.rope in eager code calls rope._torch_ops.rope (python/torch_ops/eager.cpp) where
    # autograd records nothing: new tensors holding the operator's results, q and k untouched,
    # rope.Error for bad input. A call autograd must record, or a mode must see, goes through
    # torch.ops.rope.apply (and its backward) as before.
    if not CPP_EXPECTED or os.environ.get("ROPE_PYTHON_OPERATOR") == "1":
        pytest.skip("rope/_torch_ops.so not loaded: rope has no C++ entry")
    from torch.utils._python_dispatch import TorchDispatchMode

    config = rope.Config(head_dim=32, base=700.0, scaling={"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 64})
    g = torch.Generator().manual_seed(13)
    q, k = torch.randn(2, 4, 8, 32, generator=g), torch.randn(2, 2, 8, 32, generator=g)
    q0, k0 = q.clone(), k.clone()
    ids = torch.randint(0, 300, (2, 8), generator=g, dtype=torch.int32)
    want_q, want_k = torch.ops.rope.apply(q, k, config.key, 0, ids, None, None, 1, 0, None, "bhsd", False,
                                          "cpu-naive", 0)
    assert not torch.equal(want_q, q0)
    got_q, got_k = ops.rope(q, k, config, positions=ids, backend="cpu-naive")
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # Only read.
    got_q, got_k = ops.rope(q, None, config, positions=ids, backend="cpu-naive")
    assert torch.equal(got_q, want_q) and got_k is None
    with torch.inference_mode():
        got_q, got_k = ops.rope(q, k, config, positions=ids, backend="cpu-naive")
    assert got_q.is_inference() and torch.equal(got_q, want_q) and torch.equal(got_k, want_k)

    calls = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    with Recording():
        got_q, got_k = ops.rope(q, k, config, positions=ids, backend="cpu-naive")
    assert any("rope.apply" in call for call in calls), calls
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    # Autograd: a tensor that requires grad gets its graph (the operator's backward) with grad mode
    # on, and none without.
    q_grad = q.clone().requires_grad_()
    got_q, got_k = ops.rope(q_grad, k, config, positions=ids, backend="cpu-naive")
    assert got_q.grad_fn is not None and torch.equal(got_q.detach(), want_q) and torch.equal(got_k, want_k)
    got_q.backward(want_q)  # R^T R q = q, times yarn's attention factor squared.
    factor = config.frequencies()[1]
    assert torch.allclose(q_grad.grad, q * factor * factor, atol=1e-5)
    with torch.no_grad():
        got_q, _ = ops.rope(q_grad, k, config, positions=ids, backend="cpu-naive")
    assert got_q.grad_fn is None and not got_q.requires_grad and torch.equal(got_q, want_q)
    # Bad input: named, nothing written.
    with pytest.raises(rope.Error, match=re.escape("positions = float32: must be integers")):
        ops.rope(q, k, config, positions=ids.float())
    with pytest.raises(rope.Error, match=re.escape("k heads = 3: must divide q heads = 4")):
        ops.rope(q, k[:, :1].expand(2, 3, 8, 32), config)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_python_operator_still_works_where_the_library_is_not_used():
    # ROPE_PYTHON_OPERATOR=1 registers rope::apply_ with custom_op, as on a build without the
    # library: same schema, same results, opcheck passes. rope::append_kv_'s schema (its optional
    # FP8 q_out declared written, Tensor(a16!)?) is the C++ one too.
    code = textwrap.dedent("""
        import torch, rope
        from rope import ops
        assert ops.CPP_OPERATOR is None
        config = rope.Config(head_dim=32)
        q, k = torch.randn(2, 4, 8, 32), torch.randn(2, 2, 8, 32)
        want_q, want_k = q.clone(), k.clone()
        rope.apply(want_q, want_k, config, positions=5)
        args = (config.key, 5, None, None, None, 1, 0, None, "bhsd", False, "", 0)
        torch.library.opcheck(torch.ops.rope.apply_.default, (q.clone(), k.clone(), *args))
        torch.ops.rope.apply_(q, k, *args)
        assert torch.equal(q, want_q) and torch.equal(k, want_k)
        print(torch.ops.rope.apply_.default._schema)
        print(torch.ops.rope.apply.default._schema)
        print(torch.ops.rope.append_kv_.default._schema)
    """)
    environment = {**os.environ, "ROPE_PYTHON_OPERATOR": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:3] == [str(torch.ops.rope.apply_.default._schema),
                                              str(torch.ops.rope.apply.default._schema),
                                              str(torch.ops.rope.append_kv_.default._schema)]
    assert "Tensor(a16!)? q_out, Tensor? q_scale, str q_out_dtype)" in str(torch.ops.rope.append_kv_.default._schema)
