# Chapter 0's frequency spectrum: the wavelength 2 pi / theta_i of every pair.
# Run in the folder holding tutorial-00-rotation.csv (see make_figures.sh); writes rope_spectrum.png.
data = "tutorial-00-rotation.csv"
if (system("test -r " . data . " && echo yes") ne "yes") { print "spectrum.gp: no " . data . ", skipped"; exit }
set terminal pngcairo size 760,440 font "sans,11"
set output "rope_spectrum.png"
set datafile separator comma
set title "RoPE frequencies: d = 64, base 10000"
set xlabel "pair i"
set ylabel "wavelength 2{/Symbol p}/{/Symbol q}_i (tokens)"
set logscale y
set xrange [-0.5:31.5]
set format y "10^{%L}"
set grid
set key top left
plot data index 0 using 1:3 with linespoints pt 7 ps 0.6 lw 2 title "wavelength of pair i"
