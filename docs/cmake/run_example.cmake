# Runs one example program for the docs and captures what it prints (stdout and stderr, in order) in OUTPUT.
#   cmake -DEXAMPLE=<exe> [-DEXAMPLE_ARGS=a;b] -DOUTPUT=<file.out> [-DTIMEOUT=s] -P run_example.cmake
# A failing run fails the build and leaves no output file: the docs never show a failed run. Exit status 77
# ("cannot run here", e.g. a GPU chapter without a GPU) is not a failure: its output says why.
cmake_minimum_required(VERSION 3.25)  # script mode: today's policies (empty list elements kept)
foreach(required EXAMPLE OUTPUT)
    if(NOT DEFINED ${required})
        message(FATAL_ERROR "run_example.cmake: -D${required}=... is required")
    endif()
endforeach()
if(NOT TIMEOUT)
    set(TIMEOUT 300)
endif()
file(REMOVE ${OUTPUT})
execute_process(COMMAND ${EXAMPLE} ${EXAMPLE_ARGS} OUTPUT_VARIABLE printed ERROR_VARIABLE printed
    RESULT_VARIABLE status TIMEOUT ${TIMEOUT})
if(NOT status EQUAL 0 AND NOT status EQUAL 77)
    get_filename_component(name ${EXAMPLE} NAME)
    message(FATAL_ERROR "docs: ${name} failed (${status}); the docs show only successful runs. It printed:\n${printed}")
endif()
file(WRITE ${OUTPUT} "${printed}")
