"""rope on CUDA memory from Python: PyTorch and CuPy tensors on every CUDA backend
against the float64 oracle, strided views, streams (the current stream, an
explicit one with DLPack's handshake), and the device errors. Marked cuda: on a
machine without a GPU every test here is skipped, with the reason.
(test_torch_op.py and test_huggingface.py run their checks on CUDA too.)"""

import numpy as np
import pytest

import oracle
import rope
from conftest import random_array

pytestmark = pytest.mark.cuda
CUDA_BACKENDS = [b.name for b in rope.list_backends() if b.device == "cuda" and b.available]
if not CUDA_BACKENDS:
    pytest.skip("no CUDA backend available here: " + rope.list_backends()[3].reason, allow_module_level=True)

torch = pytest.importorskip("torch", reason="the CUDA tests use PyTorch tensors (and CuPy's where installed)")


def check(got, want, dtype="float32"):
    rel_tol, abs_tol = oracle.TOLERANCE[dtype]
    got = got.detach().to("cpu", torch.float64).numpy() if hasattr(got, "detach") else np.asarray(got.get(), np.float64)
    rel, worst = oracle.relative_l2(got, want), oracle.max_abs(got, want)
    assert rel < rel_tol and worst < abs_tol, f"relative L2 {rel:.3g}, max abs {worst:.3g}"


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_torch_cuda_against_oracle(backend, dtype, layout):
    torch_dtype = getattr(torch, dtype)
    shape = (2, 8, 33, 128) if layout == "bhsd" else (2, 33, 8, 128)
    q = torch.from_numpy(random_array(shape, "float32", 1)).to("cuda", torch_dtype)
    x = q.double().cpu().numpy()
    rope.apply(q, None, rope.Config(head_dim=128, rotary_dim=96, style="gptj"), positions=17, backend=backend,
               layout=layout)
    want = oracle.rope(oracle.to_logical(x, layout), oracle.offset_positions(2, 33, 17), oracle.theta(96, 1e4),
                       "gptj", rotary_dim=96)
    got = q.transpose(1, 2) if layout == "bshd" else q
    check(got, want, dtype)


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_strided_cuda_views(backend):
    parent = torch.from_numpy(random_array((2, 8, 16, 256), "float32", 2)).cuda()
    q = parent[:, ::2, :, ::2]  # every other head, feature stride 2
    before = parent.clone()
    x = q.double().cpu().numpy()
    rope.apply(q, None, rope.Config(head_dim=128), positions=5, backend=backend)
    check(q, oracle.rope(x, oracle.offset_positions(2, 16, 5), oracle.theta(128, 1e4)))
    untouched = torch.ones_like(parent, dtype=torch.bool)
    untouched[:, ::2, :, ::2] = False
    assert torch.equal(parent[untouched], before[untouched])


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_device_ids_packed_and_mrope(backend):
    cu = torch.tensor([0, 5, 12], device="cuda")
    q = torch.from_numpy(random_array((12, 4, 64), "float32", 3)).cuda()
    x = q.double().cpu().numpy()
    rope.apply(q, None, rope.Config(head_dim=64), cu_seqlens=cu, starts=torch.tensor([3, 40], device="cuda"),
               backend=backend)
    want = oracle.rope(oracle.to_logical(x, "thd"), oracle.packed_positions([0, 5, 12], [3, 40]), oracle.theta(64, 1e4))
    check(q.permute(1, 0, 2)[None], want)
    ids = torch.randint(0, 500, (3, 9), device="cuda")
    q = torch.from_numpy(random_array((1, 2, 9, 128), "float32", 4)).cuda()
    x = q.double().cpu().numpy()
    rope.apply(q, None, rope.Config(head_dim=128, mrope_section=[16, 24, 24]), positions=ids, backend=backend)
    want = oracle.rope(x, oracle.ids_positions(ids.cpu().numpy(), 1, axes=3), oracle.theta(128, 1e4),
                       axes_of_pairs=oracle.pair_axes(64, "mrope", [16, 24, 24]))
    check(q, want)


def test_explicit_stream_and_the_dlpack_handshake():
    # q is written by a long kernel on the current stream; rope runs on another
    # stream: the handshake makes that stream wait, so rope reads the new values.
    other = torch.cuda.Stream()
    big = torch.rand(4096, 4096, device="cuda")
    q = torch.zeros(1, 4, 64, 64, device="cuda")
    want_input = torch.from_numpy(random_array((1, 4, 64, 64), "float32", 5)).cuda()
    for _ in range(4):
        big = big @ big / 4096  # keep the current stream busy
    q.copy_(want_input)
    rope.apply(q, None, rope.Config(head_dim=64), positions=0, stream=other)
    other.synchronize()
    torch.cuda.synchronize()
    check(q, oracle.rope(want_input.double().cpu().numpy(), oracle.offset_positions(1, 64), oracle.theta(64, 1e4)))


def test_cupy_arrays_on_their_current_stream():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q = cupy.asarray(random_array((1, 4, 16, 64), "float32", 6))
    x = cupy.asnumpy(q).astype(np.float64)
    with cupy.cuda.Stream(non_blocking=True):
        rope.apply(q, None, rope.Config(head_dim=64), positions=2)
        cupy.cuda.get_current_stream().synchronize()
    check(q, oracle.rope(x, oracle.offset_positions(1, 16, 2), oracle.theta(64, 1e4)))


def test_wrong_devices_are_clear_errors():
    q = torch.rand(1, 2, 4, 64, device="cuda")
    before = q.clone()
    with pytest.raises(rope.Error, match="q.device = cuda: this backend runs on host"):
        rope.apply(q, None, rope.Config(head_dim=64), backend="cpu-naive")
    with pytest.raises(rope.Error, match="q.device = host: this backend runs on cuda"):
        rope.apply(np.zeros((1, 2, 4, 64), np.float32), None, rope.Config(head_dim=64), backend="cuda-optimized")
    with pytest.raises(rope.Error, match="positions.device = host"):
        rope.apply(q, None, rope.Config(head_dim=64), positions=np.arange(4))
    dynamic = rope.Config(head_dim=64, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                "original_max_position_embeddings": 16})
    with pytest.raises(rope.Error, match="positions.max_position = 0: must be given"):
        rope.apply(q, None, dynamic, positions=torch.arange(4, device="cuda"))
    assert torch.equal(q, before)
    if torch.cuda.device_count() > 1:
        k = torch.rand(1, 2, 4, 64, device="cuda:1")
        with pytest.raises(rope.Error, match=r"k.device = cuda:1: must be on the CUDA device of q \(cuda:0\)"):
            rope.apply(q, k, rope.Config(head_dim=64))
