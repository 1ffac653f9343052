#!/usr/bin/env python3
"""Checks that the committed results tables are what scripts/render-results renders from the CSVs.

  check_results.py rendered   README.md's results table and chapter 4's ladder table match a fresh render,
                              and every CSV of bench/results/ is on a page
  check_results.py selftest   that check fails when it should, on copies of the tree: a README figure
                              edited by hand, a CSV value changed without re-rendering, a CSV on no page

Exit status: 0 pass, 1 fail.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNED = ["scripts/render-results", "README.md", "bench/results", "tutorials/04_optimized_cuda/chapter.md",
         "tutorials/figures/data/ladder_h200.csv"]


def run_check(root):
    """(exit status, output) of render-results --check on the tree at @p root."""
    done = subprocess.run([str(root / "scripts" / "render-results"), "--check"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def replace_once(path, old, new):
    text = path.read_text(encoding="utf-8")
    if old not in text:
        raise SystemExit(f"selftest: {path} has no '{old}' to change (update the selftest)")
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def selftest():
    """Each fault must make the check fail; the untouched copy must pass."""
    faults = {
        "untouched copy": None,
        "a README figure edited by hand": lambda root: replace_once(root / "README.md", "% of copy |", "0% of copy |"),
        "a CSV value changed, README not re-rendered": lambda root: replace_once(
            root / "bench/results/h200-rope-bench.csv", ",97.2,ok,", ",87.2,ok,"),
        "a CSV no page shows": lambda root: (root / "bench/results/orphan.csv").write_text("backend\nx\n"),
        "chapter 4's ladder table edited by hand": lambda root: replace_once(
            root / "tutorials/04_optimized_cuda/chapter.md", "% |", "0% |"),
    }
    failures = 0
    for name, fault in faults.items():
        with tempfile.TemporaryDirectory() as work:
            root = Path(work)
            for owned in OWNED:
                (root / owned).parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if (ROOT / owned).is_dir() else shutil.copy2)(ROOT / owned, root / owned)
            if fault:
                fault(root)
            status, output = run_check(root)
            if (status == 0) != (fault is None):
                failures += 1
                print(f"[FAILED] {name}: check exited {status}\n{output}")
            else:
                print(f"[ok] {name}: check {'passes' if fault is None else 'fails'}")
    return 1 if failures else 0


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "rendered"
    if mode == "rendered":
        status, output = run_check(ROOT)
        print(output, end="")
        return status
    if mode == "selftest":
        return selftest()
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
