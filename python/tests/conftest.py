"""What every Python test file shares: the backends to run, inputs, and CTest's skip code.

Run by CTest (python/CMakeLists.txt: one test per file, PYTHONPATH=<build>/python),
or by hand: PYTHONPATH=build/default/python python -m pytest python/tests
"""

import os

import numpy as np
import pytest

import rope

try:
    import ml_dtypes
except ImportError:  # bfloat16 NumPy arrays need it; those cases skip without it
    ml_dtypes = None

HOST_BACKENDS = [b.name for b in rope.list_backends() if b.device == "host" and b.available]
CUDA_BACKENDS = [b.name for b in rope.list_backends() if b.device == "cuda"]
DTYPES = ["float32", "float16", "bfloat16"]


def numpy_dtype(name):
    """The NumPy dtype called ``name``; bfloat16 is ml_dtypes' (skips the test without it)."""
    if name == "bfloat16":
        if ml_dtypes is None:
            pytest.skip("bfloat16 NumPy arrays need ml_dtypes (scripts/install-python-deps installs it)")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_array(shape, dtype, seed):
    """Values uniform in [-1, 1) stored as ``dtype``: fresh, never zeros, reproducible."""
    values = np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape)
    return values.astype(numpy_dtype(dtype))


def poisoned(shape, dtype):
    """An output array full of NaN: an element rope forgets to write fails the comparison."""
    return np.full(shape, np.nan, dtype=numpy_dtype(dtype))


def pytest_sessionfinish(session, exitstatus):
    # For CTest: a file whose every test skipped (no GPU, no PyTorch) is reported
    # Skipped (exit ROPE_PYTEST_ALL_SKIPPED_EXIT, 77), not passed; the reasons
    # are in the output (pytest -rs).
    code = os.environ.get("ROPE_PYTEST_ALL_SKIPPED_EXIT")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # Exit status 5 is pytest's "no test collected": a whole module skipped at import.
    if not code or reporter is None or exitstatus not in (0, 5):
        return
    ran = sum(len(reporter.stats.get(kind, [])) for kind in ("passed", "failed", "error", "xpassed"))
    if ran == 0 and reporter.stats.get("skipped"):
        session.exitstatus = int(code)
