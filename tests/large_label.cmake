# Read by CTest after the tests doctest_discover_tests found in rope-tests
# (their names are in rope-tests_TESTS): the cases of the doctest suite
# "large", whose names start with "large: ", get the label `large`.
foreach(test IN LISTS rope-tests_TESTS)
    if(test MATCHES "^large: ")
        set_tests_properties("${test}" PROPERTIES LABELS "large")
    endif()
endforeach()
