# Chapter 7's error against position. Run in the folder holding tutorial-07-precision.csv
# (see make_figures.sh); writes rope_precision.png. Section 2's table is the file's first
# block, `index 0` (section 5's, index 1, is precision_backends.gp's).
data = "tutorial-07-precision.csv"
if (system("test -r " . data . " && echo yes") ne "yes") { print "precision.gp: no " . data . ", skipped"; exit }
set terminal pngcairo size 760,440 font "sans,11"
set output "rope_precision.png"
set datafile separator comma
set title "Relative error against float64, one head vector (d = 128, base 10000)"
set xlabel "position"
set ylabel "relative L2 error"
set logscale xy
set format x "10^{%L}"
set format y "10^{%L}"
set grid
set key top left
plot data index 0 using 1:2 with linespoints pt 7 ps 0.5 lw 2 title "float32 (HuggingFace's angles)", \
     data index 0 using 1:4 with linespoints pt 5 ps 0.5 lw 2 title "bfloat16 storage", \
     data index 0 using 1:3 with linespoints pt 9 ps 0.5 lw 2 title "float32, precise angles", \
     data index 0 using 1:6 with lines dt 2 lw 1.5 title "bound p 2^{-23}"
