# Chapter 8's packed batch: what a grid sized by batch x longest sequence launches, against
# the tokens it has to rotate. Run in the folder holding tutorial-08-packed-sequences.csv
# (see make_figures.sh); its first block (`index 0`) is the batch: sequence,length,longest.
# Writes rope_packed_grid.png.
data = "tutorial-08-packed-sequences.csv"
if (system("test -r " . data . " && echo yes") ne "yes") { print "packed_grid.gp: no " . data . ", skipped"; exit }
set datafile separator comma
stats data index 0 using 2 name "tokens" nooutput
stats data index 0 using 3 name "grid" nooutput
set terminal pngcairo size 900,480 font "sans,11"
set output "rope_packed_grid.png"
set title sprintf("A packed batch of %d tokens in %d sequences (lengths 1 to %d)\n{/*0.9 a grid sized by the total tokens launches %d blocks, all useful}", tokens_sum, tokens_records, grid_max, tokens_sum)
set xlabel "sequence"
set ylabel "blocks (one per token)"
set yrange [0:grid_max * 1.18]
set xrange [-0.7:tokens_records - 0.3]
set style fill solid 0.85 border -1
set boxwidth 0.8
set grid ytics
set key top right opaque
plot data index 0 using 1:3 with boxes lc rgb "#d9d9d9" \
         title sprintf("launched by a batch x longest grid: %d blocks", grid_sum), \
     data index 0 using 1:2 with boxes lc rgb "#3a7bd5" \
         title sprintf("useful: the sequence's tokens, %d in all (%.1f%%)", tokens_sum, 100.0 * tokens_sum / grid_sum)
