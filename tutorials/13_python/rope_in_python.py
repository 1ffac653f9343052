"""Chapter 13: rope from Python. NumPy arrays and PyTorch tensors go to the C++
backends through DLPack, without a copy; the result is checked against the
formula and against HuggingFace; the PyTorch operator's backward is the
inverse rotation.

Run through CTest (tutorial-13-python) or scripts/tour; by hand:
    PYTHONPATH=build/default/python:tutorials/support python tutorials/13_python/rope_in_python.py
"""

import numpy as np

import rope
from tutorial import Checks, print_section, print_title, relative_l2, rope_float64, run


def numpy_section(checks):
    print_section("1. rope on NumPy arrays, in place")
    config = rope.Config(head_dim=64, base=10000.0, style="neox")
    print(config)
    rng = np.random.default_rng(9)
    q = rng.uniform(-1, 1, (2, 8, 16, 64)).astype(np.float32)   # [batch, heads, seq, head_dim]
    k = rng.uniform(-1, 1, (2, 2, 16, 64)).astype(np.float32)   # grouped-query: 2 key heads
    q_before, address = q.copy(), q.ctypes.data
    rope.apply(q, k, config, positions=100)                      # KV-cache decode: positions 100..115
    numpy_error = relative_l2(q, rope_float64(q_before, 100 + np.arange(16), 10000.0))
    host = [b.name for b in rope.list_backends() if b.available and b.device == "host"]
    print(f"backend chosen for host arrays: {host[-1]} (cpu-eigen when built; backend=... chooses)")
    checks.expect(numpy_error < 5e-6,
                  f"q rotated in place agrees with the float64 formula (relative L2 {numpy_error:.1e})")
    checks.expect(q.ctypes.data == address, "same memory before and after: rope wrote into the caller's array")

    print_section("2. DLPack: capsules, strides, who owns the memory")
    capsule = q.__dlpack__()
    print(f"q.__dlpack__() -> {capsule!r}")
    print(f"q.__dlpack_device__() -> {q.__dlpack_device__()}  (1 = CPU; 2 = CUDA)")
    view = q[:, ::2, :, :]                      # every other head: a view, no copy
    print(f"view q[:, ::2]: NumPy strides in bytes {view.strides}, DLPack strides in elements "
          f"{tuple(s // 4 for s in view.strides)}")
    parent = q.copy()
    rope.apply(view, None, config, positions=0, inverse=True)   # k None: rotate the view only
    skipped_heads_same = np.array_equal(q[:, 1::2], parent[:, 1::2])
    checks.expect(skipped_heads_same, "a strided view is rotated where it points; the heads between are untouched")
    read_only = np.ones((1, 1, 4, 64), np.float32)
    read_only.flags.writeable = False
    try:
        rope.apply(read_only, None, config)
        checks.expect(False, "a read-only array is refused")
    except rope.Error as error:
        print(f"read-only array: {error}")
        checks.expect(True, "a read-only array is refused with rope.Error, a ValueError, naming it")
    try:
        import ml_dtypes
        q16 = q_before.astype(ml_dtypes.bfloat16)
        rope.apply(q16, None, config, positions=100)
        error16 = relative_l2(q16.astype(np.float32), rope_float64(q_before, 100 + np.arange(16), 10000.0))
        checks.expect(error16 < 8e-3, f"bfloat16 NumPy array (ml_dtypes) rotated, relative L2 {error16:.1e}")
    except ImportError:
        print("(ml_dtypes not installed: the bfloat16 example is left out)")
    return numpy_error


def torch_sections(checks, torch):
    from rope import ops
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    print_section("3. PyTorch tensors: rope.apply and the operator")
    for name in ("apply_", "apply"):   # defined in C++ (TORCH_LIBRARY), or by custom_op where it was not built
        print(f"torch.ops.rope.{name}: {getattr(torch.ops.rope, name).default._schema}")
    print(f"C++ operator library: {ops.CPP_OPERATOR or 'not built: the same schemas registered in Python'}")
    q = torch.rand(1, 32, 24, 128) * 2 - 1
    k = torch.rand(1, 8, 24, 128) * 2 - 1
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = rope.Config(head_dim=128, scaling=llama3)   # a Llama 3.1 config's rope_parameters, as is
    positions = torch.arange(24) * 40          # 0, 40, ..., 920: below ~1000, where float32 angles are good to ~1e-5
    q_rot, k_rot = ops.rope(q, k, config, positions=positions)   # torch.ops.rope.apply: new tensors
    print(f"ops.rope -> q {tuple(q_rot.shape)} {q_rot.dtype}, a new tensor (q itself is left as it was)")
    q2, k2 = q.clone(), k.clone()
    ops.rope_(q2, k2, config, positions=positions.int())   # torch.ops.rope.apply_: in place; int32 ids are fine
    checks.expect(torch.equal(q2, q_rot) and torch.equal(k2, k_rot),
                  "the in-place operator (int32 positions) and the functional one give the same bits")
    q3 = q.clone()
    rope.apply(q3, None, config, positions=positions)   # in place, through DLPack
    checks.expect(torch.equal(q3, q_rot), "rope.apply on a tensor and the operator give the same bits")
    try:
        ops.rope_(q.clone(), None, config, positions=positions * 1.5)
        checks.expect(False, "float positions are refused")
    except rope.Error as error:
        print(f"float positions: {error}")
        checks.expect(True, "float positions are refused with rope.Error naming them, never rounded")

    print_section("4. Checking against HuggingFace")
    hf_config = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                            max_position_embeddings=131072, rope_parameters=dict(llama3))
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config=hf_config)(q, positions[None])
    hf_q, hf_k = modeling_llama.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    error_q, error_k = relative_l2(q_rot, hf_q), relative_l2(k_rot, hf_k)
    checks.expect(max(error_q, error_k) < 2e-5,
                  f"rope's operator vs transformers' apply_rotary_pos_emb (llama3): relative L2 {error_q:.1e}, "
                  f"{error_k:.1e}")

    print_section("5. Autograd: the backward is the inverse rotation")
    grad = torch.randn_like(q)
    q_leaf = q.clone().requires_grad_()
    out, _ = ops.rope(q_leaf, None, config, positions=positions)
    out.backward(grad)
    undone, _ = ops.rope(grad, None, config, positions=positions, inverse=True)
    checks.expect(torch.equal(q_leaf.grad, undone), "q.grad is exactly rope's inverse rotation of the gradient")
    q64 = q.double().requires_grad_()
    hf_out, _ = modeling_llama.apply_rotary_pos_emb(q64, q64[:, :1], cos.double(), sin.double())
    (hf_grad,) = torch.autograd.grad(hf_out, q64, grad.double())
    error_grad = relative_l2(q_leaf.grad, hf_grad)
    checks.expect(error_grad < 2e-5, f"and HuggingFace's function differentiated by autograd in float64 agrees "
                                     f"(relative L2 {error_grad:.1e})")
    compiled = torch.compile(lambda t: ops.rope(t, None, config, positions=positions)[0], fullgraph=True,
                             backend="aot_eager")
    checks.expect(torch.equal(compiled(q), q_rot), "torch.compile(fullgraph=True) traces the operator: no graph break")
    return error_q


def main():
    print_title(13, "rope from Python: NumPy, PyTorch, DLPack, HuggingFace, autograd",
                "DLPack hands rope the caller's memory (pointer, dtype, device, strides) without a copy; "
                "the PyTorch operator's backward is the inverse rotation")
    checks = Checks()
    numpy_error = numpy_section(checks)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as missing:
        return checks.skip(f"NumPy: relative L2 {numpy_error:.1e} against float64",
                           f"sections 3-5 need PyTorch and transformers ({missing}); "
                           "scripts/install-python-deps installs them")
    hf_error = torch_sections(checks, torch)
    return checks.finish(f"rope vs float64 on NumPy {numpy_error:.1e}, vs HuggingFace (llama3) "
                         f"{hf_error:.1e} relative L2; 0 bytes copied")


if __name__ == "__main__":
    run(main)
