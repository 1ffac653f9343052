// doctest's own main(); prints the random seed so any failure can be reproduced
// with ROPE_TEST_SEED=<seed>.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <iostream>

#include "support.hpp"

int main(int argc, char** argv) {
    std::cout << "rope tests: seed " << testing::seed() << " (set ROPE_TEST_SEED to reproduce)" << std::endl;
    const int status = doctest::Context(argc, argv).run();
    if (testing::skipped_backend_tests() > 0)
        std::cout << "rope tests: " << testing::skipped_backend_tests()
                  << " test case(s) SKIPPED (a backend, a second GPU or enough device memory is missing here; see "
                     "ROPE_SKIPPED lines)"
                  << std::endl;
    return status;
}
