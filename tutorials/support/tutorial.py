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
