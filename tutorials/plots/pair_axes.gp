# Chapter 11: which position axis turns each rotated pair, with which theta index, and which
# two features form the pair under each pairing style. Four layouts, one panel each:
# M-RoPE contiguous (Qwen2-VL), M-RoPE interleaved (Qwen3-VL), axial 2-D (Qwen2-VL's vision
# tower) and axial 3-D (diffusion axes dims 16, 56, 56). Run in the folder holding
# tutorial-11-axial-rope.csv (see make_figures.sh); blocks `index 0` to `index 3`
# are pair,axis,theta_index,half_split_first,half_split_second,interleaved_first,
# interleaved_second,axis_name. Writes rope_pair_axes.png.
#
# In each panel the x axis is the feature index. Top strip: pair i drawn over features 2i
# and 2i+1, coloured by its axis and labelled with its theta index (the i of theta_i =
# base^(-2i/d) for M-RoPE; the j of base^(-j/sections[a]) for axial, restarting on each
# axis). Middle: every feature coloured by its pair's axis under half-split pairing
# (pair i = features i and i + d/2). Bottom: the same under interleaved pairing (2i, 2i+1).
data = "tutorial-11-axial-rope.csv"
if (system("test -r " . data . " && echo yes") ne "yes") { print "pair_axes.gp: no " . data . ", skipped"; exit }
set datafile separator comma
set terminal pngcairo size 1400,1240 font "sans,11"
set output "rope_pair_axes.png"

colour(name) = name eq "t" ? 0x3a7bd5 : name eq "h" ? 0xe08020 : 0x20a040
titles = "'M-RoPE, contiguous sections: Qwen2-VL / Qwen2.5-VL, sections [16,24,24], head\\_dim 128 (the rows t, h, w of the ids)' \
          'M-RoPE, interleaved sections: Qwen3-VL, sections [24,20,20], head\\_dim 128 (h: i%3 = 1 and i < 60; w: i%3 = 2 and i < 60; else t)' \
          'axial 2-D: Qwen2-VL vision tower, head\\_dim 80, sections [20,20] (ids [H, W]: patch row, patch column)' \
          'axial 3-D: video diffusion, axes dims (16,56,56) of head\\_dim 128, sections [8,28,28] (ids: frame, row, column)'"

# A header (title and colour key) above four panels of equal size.
set label 1 "Which pair turns with which axis" at screen 0.5, 0.982 center font "sans,14"
set object 1 rect from screen 0.30, 0.948 to screen 0.32, 0.962 fc rgb colour("t") fs solid noborder
set label 2 "t: temporal (M-RoPE) / frame (video)" at screen 0.325, 0.955 left
set object 2 rect from screen 0.53, 0.948 to screen 0.55, 0.962 fc rgb colour("h") fs solid noborder
set label 3 "h: height / patch row" at screen 0.555, 0.955 left
set object 3 rect from screen 0.71, 0.948 to screen 0.73, 0.962 fc rgb colour("w") fs solid noborder
set label 4 "w: width / patch column" at screen 0.735, 0.955 left
set multiplot layout 4,1 margins 0.25, 0.98, 0.05, 0.90 spacing 0, 0.075
set xrange [0:128]
set x2range [0:128]
set yrange [-0.1:3.1]
set xtics 0,8,128 nomirror
set mxtics 2
# Pair numbers over the top strip: pair p sits over features 2p and 2p+1.
set x2tics ("0" 1) nomirror font "sans,9" offset 0,-0.3
set for [p = 4:63:4] x2tics add (sprintf("%d", p) 2 * p + 1)
set ytics ("features, interleaved pairs (2i, 2i+1)" 0.5, "features, half-split pairs (i, i+d/2)" 1.5, "pair i (number above): axis, theta index" 2.5) nomirror
unset key
set style fill solid 1.0 border lc rgb "white"
do for [panel = 0:3] {
    set title word(titles, panel + 1) font "sans,11" offset 0,0.6
    set xlabel (panel == 3 ? "feature index (in the top strip, pair i is drawn over features 2i and 2i+1)" : "")
    if (panel > 0) { unset label 1; unset label 2; unset label 3; unset label 4; unset object 1; unset object 2; unset object 3 }
    block = panel
    plot data index block using (2*$1 + 1):(2.5):(2*$1):(2*$1 + 2):(2.0):(3.0):(colour(strcol(8))) with boxxyerror lc rgb variable, \
         data index block using (2*$1 + 1):(2.5):(sprintf("%d", $3)) with labels rotate by 90 font "sans,8" tc rgb "white", \
         data index block using ($4 + 0.5):(1.5):($4):($4 + 1):(1.0):(2.0):(colour(strcol(8))) with boxxyerror lc rgb variable, \
         data index block using ($5 + 0.5):(1.5):($5):($5 + 1):(1.0):(2.0):(colour(strcol(8))) with boxxyerror lc rgb variable, \
         data index block using ($6 + 0.5):(0.5):($6):($6 + 1):(0.0):(1.0):(colour(strcol(8))) with boxxyerror lc rgb variable, \
         data index block using ($7 + 0.5):(0.5):($7):($7 + 1):(0.0):(1.0):(colour(strcol(8))) with boxxyerror lc rgb variable
}
unset multiplot
