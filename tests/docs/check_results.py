#!/usr/bin/env python3
"""Checks that every recorded figure comes from the committed CSVs (standard library only).

  check_results.py rendered      README.md's measured table, bench/results/*.md and chapter 4's
                                 ladder table are what scripts/render-results renders from the CSVs
  check_results.py selftest      the check above fails when it should: on a copy of the
                                 tree, a README figure edited by hand, a CSV value changed
                                 without re-rendering, and a CSV that no page renders

Exit status: 0 pass, 1 fail.
"""
import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNED = ["scripts/render-results", "README.md", "bench/results", "docs/benchmarks.md.in",
         "tutorials/04_optimized_cuda/chapter.md", "tutorials/figures/data/ladder_h200.csv"]


def run_check(root):
    """(exit status, output) of render-results --check on the tree at @p root."""
    done = subprocess.run([sys.executable, str(root / "scripts" / "render-results"), "--check"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def copy_tree(target):
    for name in OWNED:
        source, destination = ROOT / name, target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy2(source, destination)


def replace_once(path, old, new):
    text = path.read_text(encoding="utf-8")
    if old not in text:
        raise SystemExit(f"selftest: {path} has no '{old}' to change (update the selftest)")
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def change_first_figure(path, column):
    """Changes @p column of the first data row of the CSV at @p path (a figure the README shows)."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    index = rows[0].index(column)
    old = float(rows[1][index])
    rows[1][index] = f"{old - 10.0:.1f}"
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)


def selftest():
    """Each fault must make the check fail; the untouched copy must pass."""
    failures = []
    faults = {
        "untouched copy": None,
        "a README figure edited by hand": lambda root: replace_once(root / "README.md", "% of copy |", "0% of copy |"),
        "a CSV value changed, pages not re-rendered": lambda root: change_first_figure(
            root / "bench/results/h200-rope-bench.csv", "pct_of_copy"),
        "a CSV no page renders": lambda root: (root / "bench/results/orphan.csv").write_text("backend\nx\n"),
        "a results page written by hand": lambda root: (root / "bench/results/notes.md").write_text("# notes\n"),
        "chapter 4's ladder table edited by hand": lambda root: replace_once(
            root / "tutorials/04_optimized_cuda/chapter.md", "% |", "0% |"),
    }
    for name, fault in faults.items():
        with tempfile.TemporaryDirectory() as work:
            root = Path(work)
            copy_tree(root)
            if fault:
                fault(root)
            status, output = run_check(root)
            expected_pass = fault is None
            if (status == 0) != expected_pass:
                failures.append(f"{name}: check exited {status}, expected {'0' if expected_pass else 'non-zero'}\n{output}")
            else:
                print(f"[ok] {name}: check {'passes' if expected_pass else 'fails'}")
    for failure in failures:
        print(f"[FAILED] {failure}")
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
