// The CUDA runtime calls behind cuda_helpers.hpp. With CUDA, each call's
// status is checked and a failure becomes a rope::Error carrying CUDA's text;
// without CUDA every helper throws.
#include "cuda_helpers.hpp"

#include <vector>

#include "rope/error.hpp"

#if ROPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace testing::cuda {

#if ROPE_HAVE_CUDA

namespace {

using rope::check_cuda;

cudaStream_t stream_of(const rope::CudaStream& stream) { return static_cast<cudaStream_t>(stream.get()); }

}  // namespace

Graph::Graph(const rope::CudaStream& stream, const std::function<void()>& enqueue) {
    check_cuda(cudaStreamBeginCapture(stream_of(stream), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
        enqueue();
    } catch (...) {
        // Leave the stream out of capture mode, and the thread without an error, before reporting.
        cudaStreamEndCapture(stream_of(stream), &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
    }
    check_cuda(cudaStreamEndCapture(stream_of(stream), &graph),
               "cudaStreamEndCapture (a call made during capture could not be captured)");
    graph_ = graph;
    std::size_t count = 0;
    check_cuda(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) check_cuda(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes");
    nodes_ = count;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type{};
        check_cuda(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
        if (type == cudaGraphNodeTypeKernel) ++kernel_nodes_;
    }
    cudaGraphExec_t executable = nullptr;
    check_cuda(cudaGraphInstantiate(&executable, graph, 0), "cudaGraphInstantiate");
    executable_ = executable;
}

Graph::~Graph() {
    if (executable_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(executable_));
    if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void Graph::launch(const rope::CudaStream& stream) const {
    check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(executable_), stream_of(stream)), "cudaGraphLaunch");
}

PinnedHostMemory::PinnedHostMemory(std::size_t bytes) { check_cuda(cudaMallocHost(&data_, bytes), "cudaMallocHost"); }

PinnedHostMemory::~PinnedHostMemory() { cudaFreeHost(data_); }

DeviceScope::DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

DeviceScope::~DeviceScope() { cudaSetDevice(previous_); }

int current_device() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    return device;
}

int multiprocessors() {
    int count = 0;
    check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, current_device()),
          "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    return count;
}

int64_t thread_slots() { return int64_t(multiprocessors()) * 2048; }

std::size_t free_device_memory() {
    std::size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
}

bool fail_an_allocation() {
    void* memory = nullptr;
    const cudaError_t status = cudaMalloc(&memory, std::size_t(1) << 50);
    if (status == cudaSuccess) cudaFree(memory);
    return status != cudaSuccess;
}

std::string pending_error() { return cudaGetErrorName(cudaPeekAtLastError()); }

void clear_error() { cudaGetLastError(); }

#else  // A build without CUDA: no helper can do its job.

namespace {
[[noreturn]] void no_cuda() { rope::fail("device", "cuda", "this build of rope has no CUDA support"); }
}  // namespace

Graph::Graph(const rope::CudaStream&, const std::function<void()>&) { no_cuda(); }
Graph::~Graph() = default;
void Graph::launch(const rope::CudaStream&) const { no_cuda(); }
PinnedHostMemory::PinnedHostMemory(std::size_t) { no_cuda(); }
PinnedHostMemory::~PinnedHostMemory() = default;
DeviceScope::DeviceScope(int) { no_cuda(); }
DeviceScope::~DeviceScope() = default;
int current_device() { no_cuda(); }
int multiprocessors() { no_cuda(); }
int64_t thread_slots() { no_cuda(); }
std::size_t free_device_memory() { no_cuda(); }
bool fail_an_allocation() { no_cuda(); }
std::string pending_error() { no_cuda(); }
void clear_error() { no_cuda(); }

#endif

}  // namespace testing::cuda
