# Chapter 7, section 5: error against position up to 4M, every backend, float32 and
# bfloat16, default and precise angles. Writes rope_precision_backends.png.
#
# The data, first found of:
#   1. $ROPE_PRECISION_CSV, a file named in the environment (make_figures.sh passes it on);
#   2. tutorial-07-precision.csv in the current folder, if a GPU ran it (CUDA rows);
#   3. the recorded H200 run tutorials/figures/data/precision_h200.csv (all four backends);
#   4. tutorial-07-precision.csv, CPU backends only.
# Each is the whole output of `tutorial-07-precision --csv FILE`; the long-form table
# (position,backend,dtype,precise,rel_l2,max_abs) is its second block, `index 1`.
# With none of them, it makes no figure.
local = "tutorial-07-precision.csv"
recorded = system("dirname '" . ARG0 . "'") . "/../figures/data/precision_h200.csv"
readable(file) = strlen(file) > 0 && system("test -r '" . file . "' && echo yes") eq "yes"
has_gpu_rows(file) = system("grep -q ',cuda-' '" . file . "' && echo yes") eq "yes"
data = system("printf %s \"$ROPE_PRECISION_CSV\"")
if (!readable(data)) { data = (readable(local) && has_gpu_rows(local)) ? local : recorded }
if (!readable(data)) { data = local }
if (!readable(data)) { print "precision_backends.gp: no tutorial-07-precision.csv, skipped"; exit }
# The backends in the file, in the order the program wrote them (list_backends order).
backends = system("awk -F, '/^# position,backend,/ { on = 1; next } on && !/^#/ && NF == 6 && !seen[$2]++ { printf \"%s \", $2 }' '" . data . "'")
if (words(backends) == 0) { print "precision_backends.gp: " . data . " has no per-backend table (older program?), skipped"; exit }
source = (data eq local) ? "this build's run" : \
         (data eq recorded) ? "the recorded H200 run, figures/data/precision\\_h200.csv" : "the given CSV"

set terminal pngcairo size 900,560 font "sans,11"
set output "rope_precision_backends.png"
set datafile separator comma
set title sprintf("Relative error against float64 up to position 4M, q [1, 4, n, 128], base 10000\n{/*0.85 %s; backends: %s}", source, backends)
set xlabel "position"
set ylabel "relative L2 error"
set logscale y
set xrange [1:4194304 * 1.5]
set format x "2^{%L}"
set logscale x 2
set xtics 4
set yrange [1e-8:10]  # Room at the top for the key.
set format y "10^{%L}"
set grid
set key top left vertical maxcols 1 Left reverse samplen 3 box opaque
# The issue's criterion compares the precise mode at 4096 and at 4M.
set arrow from 4096, graph 0 to 4096, graph 1 nohead dt 3 lc rgb "gray40"
set arrow from 4194304, graph 0 to 4194304, graph 1 nohead dt 3 lc rgb "gray40"
set label "4096" at 4096 * 1.15, graph 0.04 left textcolor rgb "gray30"
set label "4M" at 4194304 / 1.15, graph 0.04 right textcolor rgb "gray30"

# A colour per storage type and mode, a dash and point type per backend. Backends that
# agree draw on top of each other; their points stay distinguishable there: a ring
# (cpu-naive) around a small square (cpu-eigen), crossed by x (cuda-naive) and + (cuda-optimized).
series_dtype = "fp32 fp32 bf16 bf16"
series_precise = "0 1 0 1"
series_title = "'float32, float32 angles (HuggingFace)' 'float32, precise angles' 'bfloat16, float32 angles' 'bfloat16, precise angles'"
series_color = "#1f5fbf #2a9d3a #d62728 #ff9f1c"
point_type(b) = word("6 5 2 1", b) + 0
point_size(b) = word("1.6 0.6 1.2 1.4", b) + 0
rel_l2(b, c) = (strcol(2) eq word(backends, b) && strcol(3) eq word(series_dtype, c) && \
                column(4) == word(series_precise, c) + 0) ? column(5) : NaN
plot for [c = 1:4] for [b = 1:words(backends)] data index 1 using 1:(rel_l2(b, c)) \
         with linespoints dt b pt point_type(b) pi 4 ps point_size(b) lw 1.5 lc rgb word(series_color, c) notitle, \
     for [c = 1:4] keyentry with lines lw 3 lc rgb word(series_color, c) title word(series_title, c), \
     keyentry with lines lt nodraw title " ", \
     for [b = 1:words(backends)] keyentry with linespoints dt b pt point_type(b) ps point_size(b) lw 1.5 lc rgb "black" \
         title word(backends, b)
