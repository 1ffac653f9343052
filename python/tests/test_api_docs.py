"""The API as editors and readers see it: the stub of the C++ module is what
nanobind's stubgen makes of the built module, and docs/python.md names every
public function and every one of its parameters."""

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import rope

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "python.md").read_text()
STUB = ROOT / "python" / "rope" / "_rope.pyi"
PINNED_NANOBIND = next(line.split("==")[1].strip() for line in (ROOT / "python" / "requirements.txt").read_text().splitlines()
                       if line.startswith("nanobind=="))


def without_header(text):
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")).strip()


def test_stub_is_what_stubgen_makes_of_the_module(tmp_path):
    nanobind = pytest.importorskip("nanobind", reason="nanobind is not installed")
    if nanobind.__version__ != PINNED_NANOBIND:
        pytest.skip(f"stubgen's output differs between versions: nanobind {nanobind.__version__} here, "
                    f"the stub comes from {PINNED_NANOBIND}")
    out = tmp_path / "_rope.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "rope._rope", "-o", str(out)], check=True)
    assert without_header(out.read_text()) == without_header(STUB.read_text()), (
        "python/rope/_rope.pyi is out of date: regenerate it (command in its first lines)")


def public_functions():
    functions = [rope.Config, rope.apply, rope.append_kv, rope.apply_qk_norm, rope.apply_qk_norm_packed, rope.rerotate,
                 rope.rerotate_cache]
    try:
        from rope import ops
    except ImportError:
        return functions
    return functions + [ops.rope, ops.rope_, ops.append_kv_]


@pytest.mark.parametrize("function", public_functions(), ids=lambda f: f.__qualname__)
def test_docs_page_names_every_parameter(function):
    name = "rope." + ("ops." if function.__module__.endswith("ops") else "") + function.__name__
    assert name + "(" in PAGE, f"docs/python.md has no signature for {name}"
    signature = PAGE[PAGE.index(name + "("):]
    signature = signature[:signature.index(")")]
    for parameter in inspect.signature(function).parameters:
        if parameter == "self":
            continue
        assert re.search(rf"\b{parameter}\b", signature), f"{name}: parameter {parameter} missing from docs/python.md"


def test_docs_page_names_every_public_name():
    for name in rope.__all__:
        assert f"rope.{name}" in PAGE, f"docs/python.md does not mention rope.{name}"


def test_import_rope_does_not_import_torch():
    code = "import sys, rope; rope.list_backends(); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
