"""What a chapter written in Python needs and no chapter teaches (tutorial.hpp's Python twin).

Every chapter prints, besides its lesson:
  "Chapter N: ..."   and  "Lesson: ..."   (scripts/tour shows them)
  "Key figure: ..."  its most telling number
  "PASSED (n checks)" / "FAILED (...)" / "SKIPPED: reason" last, exiting 0 / 1 / 77.
"""

import sys

SKIP_EXIT_CODE = 77  # "could not run here": CTest reports Skipped, never passed


def print_title(number, title, lesson):
    print(f"Chapter {number}: {title}")
    print(f"Lesson: {lesson}")


def print_section(heading):
    print(f"\n--- {heading} ---")


class Checks:
    """A chapter's checks, turned into the verdict and the exit code."""

    def __init__(self):
        self.count = 0
        self.failures = 0

    def expect(self, passed, what):
        """Records one check and prints it as "  [ok] what" or "  [FAILED] what"."""
        print(f"  [{'ok' if passed else 'FAILED'}] {what}")
        self.count += 1
        self.failures += 0 if passed else 1
        return passed

    def finish(self, key_figure):
        """Prints the key figure and the verdict; returns the exit code."""
        print(f"\nKey figure: {key_figure}")
        if self.failures == 0:
            print(f"PASSED ({self.count} checks)")
            return 0
        print(f"FAILED ({self.failures} of {self.count} checks)")
        return 1

    def skip(self, key_figure, reason):
        """The chapter cannot finish here: the checks so far, the reason, exit code 77 (unless one failed)."""
        if self.failures:
            return self.finish(key_figure)
        print(f"\nKey figure: {key_figure}")
        print(f"SKIPPED: {reason}")
        return SKIP_EXIT_CODE


def run(main):
    """Runs ``main()`` (which returns the exit code) and exits with it."""
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main())


# ---------------------------------------------------------------------------
# RoPE in float64 and the distance to it: the formula, written independently of
# the library (tutorial.hpp's rope_float64 is its C++ twin).
# ---------------------------------------------------------------------------

def rope_float64(x, positions, base, style="neox"):
    """RoPE of x [..., seq, dim] in float64 at positions [seq]: theta_i = base^(-2i/dim),
    angle = position * theta_i; pairs (i, i + dim/2) ("neox", half-split) or (2i, 2i+1)."""
    import numpy as np

    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)               # theta_i = base^(-2i/d)
    angle = np.outer(positions, theta)                       # [seq, d/2]: position * theta_i
    cos, sin = np.cos(angle), np.sin(angle)
    i = np.arange(d // 2)
    first, second = (i, i + d // 2) if style == "neox" else (2 * i, 2 * i + 1)
    out = np.asarray(x).astype(np.float64).copy()
    a, b = out[..., first].copy(), out[..., second].copy()
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


def relative_l2(got, want):
    """||got - want|| / ||want||, in float64."""
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))
