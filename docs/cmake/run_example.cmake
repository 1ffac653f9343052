# Runs one example program for the docs and captures what it prints (stdout and stderr, in order) in OUTPUT.
#   cmake -DEXAMPLE=<program> -DOUTPUT=<file.out> -P run_example.cmake
# A failing run (or one past 300 s) fails the build and leaves no output file: the docs never show a failed
# run. Exit status 77 ("cannot run here", e.g. a GPU chapter without a GPU) is not a failure: its output says why.
cmake_minimum_required(VERSION 3.25)  # script mode: today's policies
file(REMOVE ${OUTPUT})
execute_process(COMMAND ${EXAMPLE} OUTPUT_VARIABLE printed ERROR_VARIABLE printed RESULT_VARIABLE status TIMEOUT 300)
if(NOT status EQUAL 0 AND NOT status EQUAL 77)
    get_filename_component(name ${EXAMPLE} NAME)
    message(FATAL_ERROR "docs: ${name} failed (${status}); the docs show only successful runs. It printed:\n${printed}")
endif()
file(WRITE ${OUTPUT} "${printed}")
