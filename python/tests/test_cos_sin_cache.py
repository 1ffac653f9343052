"""rope.Config.cos_sin_cache: the vLLM cos/sin table of any Config, and rope.apply with it.

A table built from a Config and handed to rope.apply with that Config must rotate as the
Config alone does (its scaling's frequencies and attention factor in the table once,
never applied twice): bit for bit on cpu-naive, within a few float32 ulps on the other
host backends; against the float64 oracle reading the table, and against transformers'
own cos and sin."""

import numpy as np
import pytest

import oracle
import rope
from conftest import HOST_BACKENDS, poisoned, random_array

pytestmark = pytest.mark.skipif(not HOST_BACKENDS, reason="no host backend available")

ORIGINAL = 256
ROWS = 600  # past ORIGINAL: dynamic and longrope's long factors apply to calls reaching ROWS - 1
SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": ORIGINAL},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-deepseek": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                      "truncate": False, "original_max_position_embeddings": ORIGINAL},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "longrope": {"rope_type": "longrope", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                 "short_factor": [1.0 + 0.05 * i for i in range(16)],
                 "long_factor": [1.0 + 0.5 * i for i in range(16)]},
}


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("precise", [False, True])
@pytest.mark.parametrize("inverse", [False, True])
def test_table_rotates_as_its_config(backend, name, precise, inverse):
    config = rope.Config(head_dim=48, rotary_dim=32, base=10000.0, scaling=SCALINGS[name], precise_angles=precise)
    seq = 40
    ids = np.random.default_rng(7).integers(0, ROWS, size=seq)
    ids[-1] = ROWS - 1  # the call reaches ROWS - 1, as the table's max_position says
    q, k = random_array((2, 4, seq, 48), "float32", 1), random_array((2, 2, seq, 48), "float32", 2)

    table = config.cos_sin_cache(ROWS, max_position=ROWS)
    assert table.dtype == np.float32 and table.shape == (ROWS, 32)
    plain = (poisoned(q.shape, "float32"), poisoned(k.shape, "float32"))
    tabled = (poisoned(q.shape, "float32"), poisoned(k.shape, "float32"))
    rope.apply(q, k, config, positions=ids, backend=backend, inverse=inverse, out=plain)
    rope.apply(q, k, config, positions=ids, backend=backend, inverse=inverse, out=tabled, cos_sin_cache=table)

    for got, want in zip(tabled, plain):
        if backend == "cpu-naive":  # the same angle, std::cos/std::sin and products as the builder
            assert np.array_equal(got, want)
        else:
            assert oracle.max_abs(got, want) < 4e-6
    # The float64 oracle reading the same table: only float32 products and sums separate them.
    for got, x in zip(tabled, (q, k)):
        want = oracle.rope_from_table(x, ids[None, None, :], table, rotary_dim=32, inverse=inverse)
        assert oracle.max_abs(got, want) < 1e-5
    # Where the oracle computes the frequencies itself (default, linear), against them too.
    if name in ("default", "linear") and not precise:
        theta = oracle.theta(32, 10000.0, SCALINGS[name].get("factor", 1.0))
        for got, x in zip(tabled, (q, k)):
            want = oracle.rope(x, ids[None, None, :], theta, rotary_dim=32, inverse=inverse)
            rel_tol, abs_tol = oracle.TOLERANCE["float32"]
            assert oracle.relative_l2(got, want) < rel_tol and oracle.max_abs(got, want) < abs_tol


def test_table_holds_the_attention_factor_once():
    """yarn's attention factor is in the table (vLLM's cos * mscale), and rope.apply adds none on top."""
    config = rope.Config(head_dim=32, scaling=SCALINGS["yarn"])
    inv_freq, attention = config.frequencies()
    assert attention > 1.1
    table = config.cos_sin_cache(8).astype(np.float64)
    norm = np.hypot(table[:, :16], table[:, 16:])
    np.testing.assert_allclose(norm, attention, rtol=1e-6)
    q = random_array((1, 1, 8, 32), "float32", 3)
    rotated, _ = rope.apply(q.copy(), None, config, backend=HOST_BACKENDS[0], cos_sin_cache=table.astype(np.float32))
    pair_norms = lambda x: np.hypot(x[..., :16], x[..., 16:])
    np.testing.assert_allclose(pair_norms(rotated), attention * pair_norms(q), rtol=1e-5)


@pytest.mark.parametrize("assignment", ["mrope", "mrope-interleaved", "axial"])
def test_multi_axis_table_rotates_as_its_config(assignment):
    """Column i holds pair i's theta; each pair reads the row of its own axis's position."""
    sections = {"mrope": dict(mrope_section=[4, 6, 6]), "mrope-interleaved":
                dict(mrope_section=[8, 4, 4], mrope_interleaved=True), "axial": dict(axial_sections=[8, 8])}
    scaling = None if assignment == "axial" else SCALINGS["yarn"]
    config = rope.Config(head_dim=32, scaling=scaling, **sections[assignment])
    seq = 24
    ids = np.random.default_rng(5).integers(0, 300, size=(config.axes, seq))
    q = random_array((1, 2, seq, 32), "float32", 4)
    plain = rope.apply(q.copy(), None, config, positions=ids, backend="cpu-naive")[0]
    tabled = rope.apply(q.copy(), None, config, positions=ids, backend="cpu-naive",
                        cos_sin_cache=config.cos_sin_cache(300))[0]
    assert np.array_equal(tabled, plain)


def test_table_matches_transformers():
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import torch
    import hf_reference as hf
    for name, parameters, max_positions in hf.SCALING_CASES:
        config = rope.Config(head_dim=64, scaling=hf.rope_dict_for(parameters, max_positions))
        table = config.cos_sin_cache(ROWS, max_position=ROWS)
        pairs = table.shape[1] // 2
        cos, sin = hf.cos_sin(64, parameters, max_positions, torch.arange(ROWS)[None, :])
        # Both form float32(p) * float32(theta_i); theta_i may differ by an ulp (transformers
        # computes it in float32): at most ROWS * 1.2e-7 radians apart, times the attention factor.
        np.testing.assert_allclose(table[:, :pairs], cos[0, :, :pairs].numpy(), atol=2e-4, err_msg=name)
        np.testing.assert_allclose(table[:, pairs:], sin[0, :, :pairs].numpy(), atol=2e-4, err_msg=name)


@pytest.mark.parametrize("rows, max_position, scaling, expected", [
    (0, 0, None, "rows = 0: must be > 0"),
    (-3, 0, None, "rows = -3: must be > 0"),
    (1 << 40, 0, None, "rows = 1099511627776: times rotary_dim = 64 is more than 2^31 floats"),
    (2 ** 70, 0, None, "rows = 1180591620717411303424: must fit in int64"),
    (1.5, 0, None, "rows = 1.5: must be an integer"),
    (16, -1, None, "max_position = -1: must be >= 0"),
    (16, 0, SCALINGS["dynamic"], "max_position = 0: must be given (> 0) with scaling type dynamic"),
    (16, 0, SCALINGS["longrope"] | {"short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
     "max_position = 0: must be given (> 0) with scaling type longrope"),
])
def test_bad_table_arguments(rows, max_position, scaling, expected):
    with pytest.raises(rope.Error, match=expected.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")):
        rope.Config(head_dim=64, scaling=scaling).cos_sin_cache(rows, max_position=max_position)
