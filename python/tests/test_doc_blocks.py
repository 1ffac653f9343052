"""Every ```python block of README.md and docs/*.md runs as written, each in a fresh namespace.

A block inside a section marked ``<!-- BEGIN section "NAME" (... run by python/tests/test_X.py) -->``
is run by that file (it needs processes or models); here it is only checked that the file reads
that section, so nothing runs twice. Blocks that are not meant to run (signatures, shell) carry
another fence (``` or ```sh), and are not executed. A block that needs PyTorch or a CUDA device
skips, with the reason, where they are missing."""

import importlib.util
import pathlib
import re

import pytest

import rope

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SECTION = re.compile(r'<!-- BEGIN section "([^"]+)".*?run by (python/tests/test_\w+\.py).*?-->(.*?)'
                     r'<!-- END section "\1"', re.S)
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks():
    """(page:line, code, the test file that runs it or None) of every ```python block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        sections = [(m.start(3), m.end(3), m.group(1), m.group(2)) for m in SECTION.finditer(text)]
        for m in FENCE.finditer(text):
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            runner = next(((name, file) for start, end, name, file in sections if start <= m.start() < end), None)
            found.append((where, m.group(1), runner))
    return found


BLOCKS = blocks()
RUN_HERE = [(where, code) for where, code, runner in BLOCKS if runner is None]
RUN_ELSEWHERE = [(where, runner) for where, _, runner in BLOCKS if runner is not None]


def test_the_pages_have_python_blocks():
    # The extraction itself: README.md's examples are among them (a broken pattern would find none).
    assert any(where.startswith("README.md:") for where, _ in RUN_HERE)


@pytest.mark.parametrize("where, code", RUN_HERE, ids=[where for where, _ in RUN_HERE])
def test_block_runs_as_written(where, code):
    if re.search(r"\bimport torch\b|\bfrom rope import ops\b|\brope\.(ops|hf)\b", code) and \
            importlib.util.find_spec("torch") is None:
        pytest.skip(f"{where} needs PyTorch, which is not installed")
    if re.search(r"""["']cuda|\.cuda\b""", code) and not any(b.available for b in rope.list_backends() if b.device == "cuda"):
        pytest.skip(f"{where} needs a CUDA device, and none is available")
    exec(compile(code, where, "exec"), {"__name__": "__doc_block__"})


@pytest.mark.parametrize("where, runner", RUN_ELSEWHERE, ids=[where for where, _ in RUN_ELSEWHERE])
def test_block_of_a_marked_section_is_run_by_its_file(where, runner):
    name, file = runner
    assert f'<!-- BEGIN section "{name}"' in (ROOT / file).read_text(), (
        f"{where}: its section {name!r} says {file} runs it, but {file} does not read that section")
