"""Bad input from Python: every case of the C++ bad-input matrix
(tests/bad_input_matrix_test.cpp) that Python can express, plus what only
Python can get wrong (an object without DLPack, a read-only array, a device
rope does not run on, a HuggingFace dict rope cannot honour). Each raises
rope.Error, a ValueError, whose message names the argument and its value, and
leaves every byte of every array as it was."""

import ctypes

import numpy as np
import pytest

import rope
from conftest import HOST_BACKENDS, random_array

pytestmark = pytest.mark.skipif(not HOST_BACKENDS, reason="no host backend available")
inf, nan = float("inf"), float("nan")


def config(**fields):
    return rope.Config(**{"head_dim": 64, **fields})


# --- The configuration ---------------------------------------------------------------------
CONFIG_CASES = [
    (dict(rotary_dim=63), "rotary_dim = 63: must be even"),
    (dict(rotary_dim=128), "rotary_dim = 128: must not exceed head_dim = 64"),
    (dict(rotary_dim=-2), "rotary_dim = -2"),
    (dict(head_dim=0), "head_dim = 0: must be > 0"),
    (dict(head_dim=-64), "head_dim = -64"),
    (dict(base=inf), "base = inf: must be finite"),
    (dict(base=nan), "base = nan: must be finite"),
    (dict(base=0.0), "base = 0: must be > 0"),
    (dict(base=-10000.0), "base = -10000: must be > 0"),
    (dict(scaling={"rope_type": "linear", "factor": 0}), "scaling.factor = 0"),
    (dict(scaling={"rope_type": "linear", "factor": -2}), "scaling.factor = -2"),
    (dict(scaling={"rope_type": "linear", "factor": inf}), "scaling.factor = inf"),
    (dict(style="llama"), "style = llama"),
    (dict(scaling={"rope_type": "ntk"}), "rope_type = ntk"),
    (dict(scaling={"rope_type": "yarn", "factor": 4.0}), "original_max_position_embeddings = 0: must be > 0"),
    (dict(scaling={"rope_type": "linear", "factor": 2.0, "attention_factor": 1.5}), "attention_factor = 1.5"),
    (dict(scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                   "low_freq_factor": 4.0, "high_freq_factor": 1.0}), "low_freq_factor = 4: must be < high_freq_factor"),
    (dict(scaling={"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": 4096,
                   "short_factor": [1.0] * 3, "long_factor": [1.0] * 32}), "short_factor.size() = 3"),
    (dict(mrope_section=[16, 8, 4]), "multi_axis.sections = sum 28: must equal rotary_dim/2 = 32"),
    (dict(axial_sections=[16, 16], scaling={"rope_type": "linear", "factor": 2.0}), "must be default with axial"),
    # What only the HuggingFace dict can get wrong.
    (dict(scaling={"rope_type": "yarn", "factor": 4.0, "ntk_alpha": 2}), "scaling['ntk_alpha'] = 2: unknown key"),
    (dict(scaling={"full_attention": {"rope_type": "default"}}), "scaling['full_attention'] = a dict: one RoPE per call"),
    (dict(scaling={"rope_type": "linear", "factor": "four"}), "scaling['factor'] = 'four': must be float"),
    (dict(scaling={"rope_type": "linear", "type": "yarn", "factor": 2.0}), "scaling['type'] = 'yarn': disagrees"),
    (dict(base=10000.0, scaling={"rope_theta": 500000.0}), "base = 10000.0: disagrees with scaling['rope_theta']"),
    (dict(rotary_dim=32, scaling={"partial_rotary_factor": 0.25}), "rotary_dim = 32: disagrees"),
    (dict(mrope_interleaved=True), "mrope_interleaved = True: needs mrope_section"),
]


@pytest.mark.parametrize("fields,expected", CONFIG_CASES, ids=[c[1][:40] for c in CONFIG_CASES])
def test_bad_config(fields, expected):
    with pytest.raises(rope.Error) as error:
        config(**fields)
    assert expected in str(error.value)
    assert isinstance(error.value, ValueError)


# --- The call: every array unchanged afterwards ------------------------------------------------
def arrays_of(call):
    """Every NumPy array a call's pieces hold (views included), for the before/after snapshot."""
    found = []
    for value in call.values():
        for item in (value if isinstance(value, (tuple, list)) else [value]):
            if isinstance(item, np.ndarray):
                found.append(item)
    return found


def expect_rejected(backend, expected, q, k, cfg=None, **kwargs):
    """rope.apply(q, k, ...) raises rope.Error containing ``expected``; no byte of any array moved."""
    cfg = cfg or config()
    arrays = arrays_of({"q": q, "k": k, **kwargs})
    before = [a.copy() for a in arrays]
    with pytest.raises(rope.Error) as error:
        rope.apply(q, k, cfg, backend=backend, **kwargs)
    assert expected in str(error.value), str(error.value)
    for array, copy in zip(arrays, before):
        assert np.array_equal(array, copy, equal_nan=True), f"an array changed although {expected!r} was raised"


def qk(q_shape=(2, 4, 8, 64), k_shape=(2, 4, 8, 64), dtype="float32"):
    return random_array(q_shape, dtype, 1), random_array(k_shape, dtype, 2)


def strided(shape, strides_in_elements, dtype=np.float32):
    """A writable view with the given (possibly overlapping) element strides."""
    size = 1 + sum((n - 1) * s for n, s in zip(shape, strides_in_elements))
    base = np.random.default_rng(3).uniform(-1, 1, size).astype(dtype)
    itemsize = np.dtype(dtype).itemsize
    return np.lib.stride_tricks.as_strided(base, shape, [s * itemsize for s in strides_in_elements], writeable=True)


def call_cases():
    """(name, expected message, make() -> (q, k, kwargs)). Shapes as in the C++ matrix: [2, 4, 8, 64]."""
    def simple(**kwargs):
        return lambda: (*qk(), kwargs)

    def reshaped(q_shape, k_shape, **kwargs):
        return lambda: (*qk(q_shape, k_shape), kwargs)

    def out_of_place(make_out):
        def make():
            q, k = qk()
            return q, k, {"out": make_out(q, k)}
        return make

    def shared_buffer_shifted():
        flat = random_array((2 * 4 * 8 * 64 + 1,), "float32", 4)
        q = flat[:-1].reshape(2, 4, 8, 64)
        return q, None, {"out": (flat[1:].reshape(2, 4, 8, 64), None)}

    dense = (2 * 4 * 8 * 64, 8 * 64, 64, 1)
    return [
        ("q head_dim differs from config", "q head_dim = 64: must equal config.head_dim = 32",
         lambda: (*qk(), {"cfg": config(head_dim=32)})),
        ("k seq differs", "k seq = 7: must equal q seq = 8", reshaped((2, 4, 8, 64), (2, 4, 7, 64))),
        ("k batch differs", "k batch = 3: must equal q batch = 2", reshaped((2, 4, 8, 64), (3, 4, 8, 64))),
        ("k head_dim differs", "k head_dim = 32: must equal q head_dim = 64", reshaped((2, 4, 8, 64), (2, 4, 8, 32))),
        ("k heads do not divide q heads", "k heads = 3: must divide q heads = 8", reshaped((2, 8, 8, 64), (2, 3, 8, 64))),
        ("q_out seq differs", "q_out seq = 9: must equal q seq = 8",
         out_of_place(lambda q, k: (np.zeros((2, 4, 9, 64), np.float32), np.zeros_like(k)))),
        ("k_out heads differ", "k_out heads = 2: must equal k heads = 4",
         out_of_place(lambda q, k: (np.zeros_like(q), np.zeros((2, 2, 8, 64), np.float32)))),
        ("negative stride in q", "q.strides[1] = -", lambda: (qk()[0][:, ::-1], None, {})),
        ("negative feature stride", "q.strides[3] = -1", lambda: (qk()[0][..., ::-1], None, {})),
        ("q_out rows overlap", "q_out.strides[2] = 32: overlaps other elements of q_out",
         out_of_place(lambda q, k: (strided((2, 4, 8, 64), (8 * 64 * 4, 8 * 64, 32, 1)), np.zeros_like(k)))),
        ("k_out heads overlap (stride 0)", "k_out.strides[1] = 0: overlaps other elements of k_out",
         out_of_place(lambda q, k: (np.zeros_like(q), strided((2, 4, 8, 64), (dense[0], 0, 64, 1))))),
        ("q_out shifted one element over q", "partially aliases q", shared_buffer_shifted),
        ("q_out is k", "q_out.data = ", out_of_place(lambda q, k: (k, np.zeros_like(k)))),
        ("k_out overlaps q_out", "partially aliases", out_of_place(lambda q, k: (np.zeros_like(q),) * 2)),
        ("k_out is q", "partially aliases", out_of_place(lambda q, k: (np.zeros_like(q), q))),
        ("k of another dtype", "k.dtype = fp16: all tensors must share q's dtype fp32",
         lambda: (qk()[0], qk(dtype="float16")[1], {})),
        ("q_out of another dtype", "q_out.dtype = fp16",
         out_of_place(lambda q, k: (np.zeros(q.shape, np.float16), np.zeros_like(k)))),
        ("ids of the wrong length", "positions.length = 5: must equal seq = 8", simple(positions=np.arange(5))),
        ("ids with 3 rows for batch 2", "positions.rows = 3: must be 1 or batch = 2",
         simple(positions=np.ones((3, 8), np.int64))),
        ("ids with 0 rows", "positions.rows = 0", simple(positions=np.ones((0, 8), np.int64))),
        ("negative offset", "positions.offset = -1: must be >= 0", simple(positions=-1)),
        ("negative id", "positions.ids[3] = -3: must be >= 0", simple(positions=np.array([0, 1, 2, -3, 4, 5, 6, 7]))),
        ("float ids", "positions = float64: must be integers (any integer dtype): never rounded", simple(positions=np.arange(8.0))),
        ("ids with 4 dimensions", "positions.ndim = 4", simple(positions=np.zeros((1, 1, 1, 8), np.int64))),
        ("unknown layout", "layout = bsdh: expected bhsd, bshd or thd", simple(layout="bsdh")),
        ("3-D q in layout bhsd", "q.ndim = 3: must be 4 for layout bhsd",
         lambda: (random_array((8, 4, 64), "float32", 5), None, {"layout": "bhsd"})),
        ("4-D q in layout thd", "q.ndim = 4: must be 3 for layout thd", simple(layout="thd")),
        ("float64 q", "q.dtype = float64: must be float32, float16 or bfloat16",
         lambda: (np.zeros((2, 4, 8, 64)), None, {})),
        ("int32 q", "q.dtype = int32", lambda: (np.zeros((2, 4, 8, 64), np.int32), None, {})),
        ("out not a pair", "out = ndarray: must be a pair", out_of_place(lambda q, k: np.zeros_like(q))),
        ("out without k_out", "out[1] = None: k needs an output too",
         out_of_place(lambda q, k: (np.zeros_like(q), None))),
        ("cp rank out of range", "positions.cp_rank = 2: must be in [0, cp_size)", simple(cp=(2, 2))),
        ("cp size 0", "positions.cp_size = 0: must be >= 1", simple(cp=(0, 0))),
        ("cp with odd seq", "seq = 7: must be even with cp_size > 1",
         lambda: (random_array((1, 2, 7, 64), "float32", 6), None, {"cp": (2, 1)})),
        ("cp with explicit ids", "positions.cp_size = 2: must be 1 with explicit ids",
         simple(positions=np.arange(8), cp=(2, 0))),
        ("starts without cu_seqlens", "starts = set: is only read with cu_seqlens", simple(starts=[0, 1])),
    ]


PACKED = np.array([0, 3, 8], dtype=np.int64)


def packed_cases():
    def thd(**kwargs):
        return lambda: (random_array((8, 4, 64), "float32", 7), random_array((8, 1, 64), "float32", 8), kwargs)

    return [
        ("cu_seqlens not ending at the token count", "positions.cu_seqlens[2] = 9: must be <= total tokens = 8",
         thd(cu_seqlens=[0, 3, 9])),
        ("cu_seqlens ending early", "positions.cu_seqlens[2] = 7: must equal total tokens = 8", thd(cu_seqlens=[0, 3, 7])),
        ("decreasing cu_seqlens", "positions.cu_seqlens[2] = 2: must be >= cu_seqlens[1] = 5",
         thd(cu_seqlens=[0, 5, 2, 8])),
        ("cu_seqlens not starting at 0", "positions.cu_seqlens[0] = 1: must be 0", thd(cu_seqlens=[1, 3, 8])),
        ("negative start", "positions.starts[1] = -4: must be >= 0", thd(cu_seqlens=PACKED, starts=[0, -4])),
        ("starts of the wrong length", "starts.shape[0] = 3: must be len(cu_seqlens) - 1 = 2",
         thd(cu_seqlens=PACKED, starts=[0, 1, 2])),
        ("cp with an odd sequence", "sequence 0 length = 3: must be even with cp_size > 1",
         thd(cu_seqlens=PACKED, cp=(2, 0))),
        ("ids and cu_seqlens", "positions.ids = set: must be null with cu_seqlens",
         thd(cu_seqlens=PACKED, positions=np.arange(8))),
        ("cu_seqlens with batch 2", "batch = 2: must be 1 with cu_seqlens",
         lambda: (*qk(), {"cu_seqlens": [0, 8]})),
        ("2-D cu_seqlens", "cu_seqlens.ndim = 2: must be 1 to 1", thd(cu_seqlens=[[0, 3, 8]])),
    ]


def table_cases():
    def with_table(table, positions=None, cfg=None):
        def make():
            q, k = qk((1, 2, 8, 64), (1, 2, 8, 64))
            kwargs = {"cos_sin_cache": table(), "positions": positions}
            if cfg:
                kwargs["cfg"] = cfg
            return q, k, kwargs
        return make

    real = lambda: np.ones((16, 64), np.float32)
    return [
        ("fp16 table", "cos_sin_cache.dtype = fp16: must be fp32", with_table(lambda: np.ones((16, 64), np.float16))),
        ("table of the wrong width", "cos_sin_cache.cols = 32: must equal rotary_dim = 64",
         with_table(lambda: np.ones((16, 32), np.float32))),
        ("position past the table", "must be < cos_sin_cache.rows = 16", with_table(real, positions=10)),
        ("id past the table", "largest 20: must be < cos_sin_cache.rows = 16",
         with_table(real, positions=np.array([0, 1, 2, 3, 4, 5, 6, 20]))),
        ("table with a feature stride", "cos_sin_cache.strides[1] = 2: must be 1",
         with_table(lambda: np.ones((16, 128), np.float32)[:, ::2])),
        ("1-D table", "cos_sin_cache.ndim = 1", with_table(lambda: np.ones(64, np.float32))),
    ]


ALL_CASES = call_cases() + packed_cases() + table_cases()


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("case", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_bad_call(backend, case):
    name, expected, make = case
    q, k, kwargs = make()
    cfg = kwargs.pop("cfg", None)
    expect_rejected(backend, expected, q, k, cfg, **kwargs)


def test_the_matrix_is_large():
    # The C++ matrix has 43 cases per direction; Python expresses most of them and adds its own.
    assert len(ALL_CASES) + len(CONFIG_CASES) >= 60


def test_unknown_backend():
    q, k = qk()
    expect_rejected("cpu-fast", "backend = cpu-fast: unknown; known backends: cpu-naive", q, k)


# --- What only Python can get wrong -------------------------------------------------------------
@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("thing", [[[1.0, 2.0]], object(), "q", 3.0], ids=["list", "object", "str", "float"])
def test_object_without_dlpack(backend, thing):
    _, k = qk()
    with pytest.raises(rope.Error, match=r"q = \w+: has no DLPack \(__dlpack__\) or buffer interface"):
        rope.apply(thing, k, config(), backend=backend)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_read_only_array(backend):
    q, k = qk()
    q.flags.writeable = False
    expect_rejected(backend, "q = numpy.ndarray (read-only): rope writes into it", q, k)
    # Read-only inputs are fine out of place: rope only reads them.
    q_out, k_out = np.zeros_like(q), np.zeros_like(k)
    rope.apply(q, k, config(), out=(q_out, k_out), backend=backend)
    assert np.all(q_out != 0)
    expect_rejected(backend, "out[0] = numpy.ndarray (read-only)", q.copy(), k, out=(q, k_out))


# A DLPack capsule made by hand: the device is whatever we say, the memory is a
# host buffer nothing will touch (rope refuses before it reads).
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class ForeignDeviceArray:
    """A float32 array that says, through DLPack, that it lives on DLPack device ``device_type``."""

    def __init__(self, host_array, device_type):
        self.host = host_array  # kept alive: the capsule points into it
        self.device_type = device_type
        self.shape = (ctypes.c_int64 * host_array.ndim)(*host_array.shape)
        self.strides = (ctypes.c_int64 * host_array.ndim)(*(s // host_array.itemsize for s in host_array.strides))
        self.managed = _DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = host_array.ctypes.data
        t.device = _DLDevice(device_type, 0)
        t.ndim = host_array.ndim
        t.dtype = _DLDataType(2, 32, 1)  # float32
        t.shape, t.strides = self.shape, self.strides
        self.ndim = host_array.ndim

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, **kwargs):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_cuda_array_on_a_host_backend(backend):
    q, k = qk()
    before = q.copy()
    with pytest.raises(rope.Error, match="q.device = cuda: this backend runs on host"):
        rope.apply(ForeignDeviceArray(q, 2), k, config(), backend=backend)
    assert np.array_equal(q, before)


def test_device_rope_does_not_run_on():
    q, k = qk()
    with pytest.raises(rope.Error, match="q.device = DLPack device type 7: rope runs on the host"):
        rope.apply(ForeignDeviceArray(q, 7), k, config())  # 7: Vulkan


def test_host_arrays_on_a_cuda_backend():
    # Here: the CUDA backend is unavailable (and says why); on a GPU machine: the arrays are on the wrong device.
    q, k = qk()
    cuda = rope.list_backends()[3]
    expected = "q.device = host: this backend runs on cuda" if cuda.available else "backend = cuda-optimized: unavailable"
    expect_rejected("cuda-optimized", expected, q, k)


def test_config_must_be_a_config():
    q, k = qk()
    with pytest.raises(rope.Error, match="config = dict: must be a rope.Config"):
        rope.apply(q, k, {"head_dim": 64})
