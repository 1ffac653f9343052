#!/usr/bin/env bash
# Regenerates the tutorials' figures from the chapters' real output.
#
# Builds the chapter programs that produce figure data, runs them with
# ROPE_TUTORIAL_CSV_DIR pointing at <build>/tutorial-figures/ (each writes
# <program>.csv there), runs every tutorials/plots/*.gp in that folder (each
# writes one PNG, rope_<name>.png), and copies them into tutorials/figures/ as
# <name>.png: committed, so that they can be viewed without building anything.
# The docs build runs the same .gp scripts on its own captured output and shows
# rope_<name>.png; the committed copies carry other names because Doxygen's
# image search would find both and call the name ambiguous.
#
# Chapter 4's ladder needs a GPU. Without one, ladder.gp falls back to the
# recorded H200 run tutorials/figures/data/ladder_h200.csv, and makes no figure
# while none is recorded. Likewise chapter 7's every-backend figure
# (precision_backends.gp) shows the CUDA backends only from a GPU run: this
# run's CSV if it has CUDA rows, else the recorded tutorials/figures/data/precision_h200.csv
# (`tutorial-07-precision --csv FILE` on the H200), else this run's CPU rows.
# ROPE_PRECISION_CSV=FILE names another such CSV, which then wins.
# The figures of chapters 8, 10 and 11 (the packed batch's grid, M-RoPE ids, which pair
# belongs to which axis) come from their CSVs and need no GPU.
#
# usage: [ROPE_PRECISION_CSV=FILE] tutorials/plots/make_figures.sh [BUILD_DIR]
#        (default BUILD_DIR: build/default, preset "default")
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${1:-$root/build/default}")
if [ -n "${ROPE_PRECISION_CSV:-}" ]; then
    # Absolute: gnuplot runs in the output folder below.
    [ -r "$ROPE_PRECISION_CSV" ] || { echo "make_figures: cannot read ROPE_PRECISION_CSV=$ROPE_PRECISION_CSV" >&2; exit 1; }
    ROPE_PRECISION_CSV=$(realpath "$ROPE_PRECISION_CSV")
    export ROPE_PRECISION_CSV
fi
cd "$root"
scripts/install-deps gnuplot-nox
if [ ! -f "$build/CMakeCache.txt" ]; then
    if [ "$build" = "$root/build/default" ]; then
        cmake --preset default >/dev/null
    else
        cmake -S "$root" -B "$build" -G Ninja >/dev/null
    fi
fi
programs=(tutorial-00-rotation tutorial-04-optimized-cuda tutorial-07-precision tutorial-08-packed-sequences
          tutorial-10-mrope tutorial-11-axial-rope)
cmake --build "$build" -j"$(nproc)" --target "${programs[@]}"

out="$build/tutorial-figures"
rm -rf "$out"
mkdir -p "$out"
cd "$out"
for program in "${programs[@]}"; do
    status=0
    ROPE_TUTORIAL_CSV_DIR=. "$build/tutorials/$program" >"$program.out" 2>&1 || status=$?
    case $status in
        0) echo "make_figures: $program ran: $out/$program.csv" ;;
        77) echo "make_figures: $program skipped here ($(tail -n 1 "$program.out"))" ;;
        *) echo "make_figures: $program FAILED (exit $status); see $out/$program.out" >&2; exit 1 ;;
    esac
done
for script in "$root"/tutorials/plots/*.gp; do
    gnuplot "$script"
done
mkdir -p "$root/tutorials/figures"
shopt -s nullglob
pngs=(*.png)
if [ ${#pngs[@]} -eq 0 ]; then
    echo "make_figures: no figure was made" >&2
    exit 1
fi
for png in "${pngs[@]}"; do
    cp "$png" "$root/tutorials/figures/${png#rope_}"
done
echo "make_figures: ${pngs[*]} in $out, copied to tutorials/figures/ without the rope_ prefix"
