# Chapter 14's figure: when fusing RoPE with the KV-cache append pays. Time per decode step against the
# tokens in it: the fused call, the two separate calls (RoPE, then the cache write), and a copy of the
# bytes the fused call moves. Reads rope-bench's GPU rows, bench/results/h200-append.csv (scripts/gpu-check
# OUT append records them), or the CSV ROPE_APPEND_CSV names; writes rope_kv_append.png. Without the CSV
# (no GPU run recorded yet) or without its rows the PNG says so, and how to make the measurement, so the
# chapter's page always has its figure.
here = system("dirname '" . ARG0 . "'")
csv = system("printf %s \"${ROPE_APPEND_CSV:-}\"")
shown = csv  # How messages name it: the default by its path in the repository.
if (csv eq "") { csv = here . "/../../bench/results/h200-append.csv"; shown = "bench/results/h200-append.csv" }
set terminal pngcairo size 860,500 font "sans,11" noenhanced
set output "rope_kv_append.png"
series = "python3 '" . here . "/kv_append_series.py' '" . csv . "'"
missing = system("test -r '" . csv . "' && echo yes") ne "yes" ? "no " . shown : \
          system(series . " | wc -l") + 0 == 0 ? "no cuda-optimized bf16 append rows in " . shown : ""
if (missing ne "") {
    print "kv_append.gp: " . missing . ": the figure says how to measure it"
    unset border; unset tics; unset key
    set label 1 "Not measured yet (" . missing . ").\nOn a machine with an NVIDIA GPU: scripts/gpu-check OUT append" at graph 0.5, 0.5 center
    plot [0:1][0:1] NaN notitle
    exit
}
set title "RoPE + KV append, bf16 cache, cuda-optimized: time per step"
set xlabel "tokens per step"
set ylabel "microseconds"
set logscale xy
set grid
set key top left
plot "< " . series using 1:2 with linespoints lw 2 title "fused (rope::append_kv)", \
     "" using 1:3 with linespoints lw 2 title "RoPE, then the cache write", \
     "" using 1:4 with lines dt 2 lw 2 title "copy of the bytes the fused call moves"
