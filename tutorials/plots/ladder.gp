# Chapter 4's bandwidth ladder: each step's prefill bandwidth as % of a device-to-device copy.
# Reads tutorial-04-optimized-cuda.csv from the current folder (a run on a GPU), else the
# recorded H200 run tutorials/figures/data/ladder_h200.csv; writes rope_ladder.png.
# With neither (no GPU and nothing recorded yet) it makes no figure.
data = "tutorial-04-optimized-cuda.csv"
if (system("test -r " . data . " && echo yes") ne "yes") {
    data = system("dirname '" . ARG0 . "'") . "/../figures/data/ladder_h200.csv"
}
if (system("test -r " . data . " && echo yes") ne "yes") { print "ladder.gp: no ladder data (needs a GPU run), skipped"; exit }
set terminal pngcairo size 860,500 font "sans,11"
set output "rope_ladder.png"
set datafile separator comma
set title "The ladder: prefill, 4096 tokens x (32 + 8) heads x 128, float32"
set ylabel "% of a device-to-device copy"
set yrange [0:*]
set offsets 0, 0, graph 0.1, 0
set style fill solid 0.7 border -1
set boxwidth 0.7
set xtics rotate by -30 left
set grid ytics
unset key
plot data using 0:5:xtic(2) with boxes lc rgb "#3a7bd5", \
     data using 0:5:(sprintf("%.0f", $5)) with labels offset 0,0.8
