#pragma once
// One type per registered backend, so doctest's TEST_CASE_TEMPLATE turns every
// backend-suite test into one CTest test per backend ("name<cpu-eigen>").
// registry_test.cpp checks that this list and rope::list_backends() agree, so
// a new backend cannot be registered without being tested.
#include <tuple>

#include <doctest/doctest.h>

struct CpuNaive {
    static constexpr const char* name = "cpu-naive";
};
struct CpuEigen {
    static constexpr const char* name = "cpu-eigen";
};
struct CudaNaive {
    static constexpr const char* name = "cuda-naive";
};
struct CudaOptimized {
    static constexpr const char* name = "cuda-optimized";
};

TYPE_TO_STRING_AS("cpu-naive", CpuNaive);
TYPE_TO_STRING_AS("cpu-eigen", CpuEigen);
TYPE_TO_STRING_AS("cuda-naive", CudaNaive);
TYPE_TO_STRING_AS("cuda-optimized", CudaOptimized);

inline constexpr const char* tested_backend_names[] = {CpuNaive::name, CpuEigen::name, CudaNaive::name,
                                                       CudaOptimized::name};

// The list every backend-suite test is applied to (TEST_CASE_TEMPLATE_APPLY).
using AllBackends = std::tuple<CpuNaive, CpuEigen, CudaNaive, CudaOptimized>;

// The CUDA backends alone, for tests of what only they do (streams, graphs,
// device pointers, tensors too large for a CPU test).
using CudaBackends = std::tuple<CudaNaive, CudaOptimized>;
