# Chapter 10's M-RoPE ids: the temporal, height and width position of each token of a prompt
# with a text prefix, an image, text, a video and text, as HuggingFace's get_rope_index
# builds them. Run in the folder holding tutorial-10-mrope.csv (see
# make_figures.sh); its first block (`index 0`) is token,temporal,height,width,kind
# (kind 0 text, 1 image, 2 video). Writes rope_mrope_ids.png.
data = "tutorial-10-mrope.csv"
if (system("test -r " . data . " && echo yes") ne "yes") { print "mrope_ids.gp: no " . data . ", skipped"; exit }
set datafile separator comma
stats data index 0 using 2 name "temporal" nooutput
stats data index 0 using 4 name "width" nooutput
top = width_max + 2
set terminal pngcairo size 900,480 font "sans,11"
set output "rope_mrope_ids.png"
set title "M-RoPE position ids: text(4), image 1x3x4, text(2), video 2x2x3, text(3)"
set xlabel "token"
set ylabel "position id"
set xrange [-0.8:temporal_records - 0.2]
set yrange [-0.5:top]
set xtics 4
set ytics 2
set grid
set key top left opaque
set style fill transparent solid 0.18 noborder
set boxwidth 1.0
# The picture tokens, shaded; then the three rows, slightly apart so that equal ids stay visible.
plot data index 0 using 1:($5 == 1 ? top : NaN) with boxes lc rgb "#e08020" title "image tokens", \
     data index 0 using 1:($5 == 2 ? top : NaN) with boxes lc rgb "#20a040" title "video tokens", \
     data index 0 using ($1 - 0.15):2 with points pt 7 ps 1.0 lc rgb "#3a7bd5" title "temporal", \
     data index 0 using 1:3 with points pt 5 ps 0.9 lc rgb "#c03030" title "height", \
     data index 0 using ($1 + 0.15):4 with points pt 9 ps 1.1 lc rgb "#404040" title "width"
