# Chapter 0's long-term decay: the score of q = k = ones against distance, and RoFormer's bound.
# Run in the folder holding tutorial-00-rotation.csv (see make_figures.sh); writes rope_decay.png.
data = "tutorial-00-rotation.csv"
if (system("test -r " . data . " && echo yes") ne "yes") { print "decay.gp: no " . data . ", skipped"; exit }
set terminal pngcairo size 760,440 font "sans,11"
set output "rope_decay.png"
set datafile separator comma
set title "Long-term decay: d = 64, base 10000"
set xlabel "distance m - n (tokens)"
set logscale x
set xrange [1:8192]
set ylabel "score / score at distance 0"
set y2label "RoFormer bound (1/(d/2)) {/Symbol S}_j |S_j|"
set ytics nomirror
set y2tics
set grid
set key top right
plot data index 1 using 1:2 with lines lw 1.5 title "q = k = ones (left axis)", \
     data index 1 using 1:3 axes x1y2 with lines lw 2 title "RoFormer bound (right axis)"
