#pragma once
// The few CUDA runtime calls tests make themselves, beyond rope::Buffer and
// rope::CudaStream: graph capture, page-locked host memory, the current device
// and its SM count, free device memory, and a deliberately failed allocation.
//
// The header is free of CUDA (handles are void*), so every test file stays
// plain C++ compiled by the host compiler. cuda_helpers.cpp calls the runtime
// when the build has CUDA; without it every helper throws rope::Error (tests
// reach them only after backend_or_skip found a CUDA backend, so they never do).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "rope/cuda_check.hpp"

namespace testing::cuda {

// A CUDA graph recorded from the work `enqueue` issues on `stream`, then
// instantiated. Capture runs in cudaStreamCaptureModeGlobal, the strictest
// mode: a cudaMalloc, a synchronising call or a copy from pageable memory made
// during `enqueue` fails the capture, and the constructor throws rope::Error.
class Graph {
public:
    Graph(const rope::CudaStream& stream, const std::function<void()>& enqueue);
    ~Graph();
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    std::size_t nodes() const { return nodes_; }                // Every node of the graph.
    std::size_t kernel_nodes() const { return kernel_nodes_; }  // Those that launch a kernel.
    void launch(const rope::CudaStream& stream) const;  // Replays the graph on `stream`.

private:
    void* graph_ = nullptr;
    void* executable_ = nullptr;
    std::size_t nodes_ = 0;
    std::size_t kernel_nodes_ = 0;
};

// Page-locked host memory (cudaMallocHost), freed with the object.
class PinnedHostMemory {
public:
    explicit PinnedHostMemory(std::size_t bytes);
    ~PinnedHostMemory();
    PinnedHostMemory(const PinnedHostMemory&) = delete;
    PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;
    void* data() const { return data_; }

private:
    void* data_ = nullptr;
};

// Makes `device` the current CUDA device for the object's lifetime.
class DeviceScope {
public:
    explicit DeviceScope(int device);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

private:
    int previous_ = 0;
};

// The current CUDA device (cudaGetDevice).
int current_device();

// Streaming multiprocessors of the current device (cudaDevAttrMultiProcessorCount).
int multiprocessors();

// The thread slots cuda-optimized counts to choose its regime: multiprocessors() times 2048
// (kThreadSlotsPerSM in cuda/optimized/device_launch.cuh). A call needs one thread per 16-byte
// chunk of every row beyond this to take the bandwidth regime (several rows a thread).
int64_t thread_slots();

// Bytes of memory free on the current device (cudaMemGetInfo).
std::size_t free_device_memory();

// Asks cudaMalloc for 1 PiB, which no GPU has. Returns true when the request
// failed, leaving the calling thread's last CUDA error set
// (cudaErrorMemoryAllocation), as a user's unrelated failed call would.
bool fail_an_allocation();

// The calling thread's last CUDA error, left in place (cudaPeekAtLastError):
// its name, "cudaSuccess" when there is none.
std::string pending_error();

// Clears the calling thread's last CUDA error (cudaGetLastError).
void clear_error();

}  // namespace testing::cuda
