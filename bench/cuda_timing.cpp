// GPU timing for rope-bench. Host-side CUDA runtime calls only: compiled by
// the C++ compiler and linked against cudart.
#include "cuda_timing.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "rope/error.hpp"

namespace rope_bench {
namespace {

// A failed CUDA call ends the benchmark with CUDA's own error text.
void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) rope::fail(call, cudaGetErrorName(status), cudaGetErrorString(status));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Owns a pair of events, recorded on one stream, for the lifetime of one measurement.
struct EventPair {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    explicit EventPair(void* on) : stream(as_stream(on)) {
        check(cudaEventCreate(&start), "cudaEventCreate");
        check(cudaEventCreate(&stop), "cudaEventCreate");
    }
    ~EventPair() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;

    // Milliseconds that the work @p issue enqueues on the stream takes.
    float time_ms(const std::function<void()>& issue) {
        check(cudaEventRecord(start, stream), "cudaEventRecord");
        issue();
        check(cudaEventRecord(stop, stream), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        check(cudaGetLastError(), "kernel launch");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        return ms;
    }
    // Milliseconds for calls [first, first + count) of launch, back to back.
    float time_calls_ms(const Launch& launch, int64_t first, int64_t count) {
        return time_ms([&] {
            for (int64_t call = first; call < first + count; ++call) launch(call);
        });
    }
};

// Calls [0, count) of launch, finished and checked: module loading, clocks, first touch.
void warm_up(const Launch& launch, int64_t count) {
    for (int64_t call = 0; call < count; ++call) launch(call);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaGetLastError(), "kernel launch");
}

// Median over @p reps of rep_ms(rep) / calls, in microseconds per call.
double median_per_call_us(int reps, int64_t calls, const std::function<float()>& rep_ms) {
    std::vector<double> per_call_us;
    for (int rep = 0; rep < reps; ++rep) per_call_us.push_back(1000.0 * rep_ms() / double(calls));
    std::nth_element(per_call_us.begin(), per_call_us.begin() + reps / 2, per_call_us.end());
    return per_call_us[size_t(reps / 2)];
}

// Owns a captured graph and its executable form.
struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    Graph() = default;
    ~Graph() {
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
};

}  // namespace

CudaStream::CudaStream() {
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_ = stream;
}

CudaStream::~CudaStream() { cudaStreamDestroy(as_stream(stream_)); }

double cuda_median_us(const Launch& launch, int reps, int64_t calls_per_rep, int64_t warmup_calls, void* stream) {
    warm_up(launch, warmup_calls);
    EventPair events(stream);
    int64_t call = warmup_calls;
    return median_per_call_us(reps, calls_per_rep, [&] {
        const float ms = events.time_calls_ms(launch, call, calls_per_rep);
        call += calls_per_rep;
        return ms;
    });
}

double cuda_graph_median_us(const Launch& launch, int reps, int64_t calls_per_graph, int64_t warmup_calls,
                            void* stream) {
    warm_up(launch, warmup_calls);  // Also keeps lazy module loading out of the capture.
    const cudaStream_t s = as_stream(stream);
    Graph captured;
    // Thread-local mode: only this thread's unsafe calls (e.g. cudaMalloc) would break the capture.
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
        for (int64_t call = warmup_calls; call < warmup_calls + calls_per_graph; ++call) launch(call);
    } catch (...) {
        cudaStreamEndCapture(s, &captured.graph);  // Take the stream out of capture before reporting the error.
        throw;
    }
    check(cudaStreamEndCapture(s, &captured.graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&captured.exec, captured.graph, 0), "cudaGraphInstantiate");
    // One untimed replay: uploads the graph, so the timed replays measure execution only.
    auto replay = [&] { check(cudaGraphLaunch(captured.exec, s), "cudaGraphLaunch"); };
    replay();
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    EventPair events(stream);
    return median_per_call_us(reps, calls_per_graph, [&] { return events.time_ms(replay); });
}

int64_t cuda_calls_per_rep(const Launch& launch, double target_us, void* stream) {
    EventPair events(stream);
    events.time_calls_ms(launch, 0, 1);  // First call: module loading and clocks ramping up.
    const double one_call_us = 1000.0 * events.time_calls_ms(launch, 1, 4) / 4.0;
    return std::clamp<int64_t>(int64_t(target_us / std::max(one_call_us, 0.1)), 1, 10000);
}

void cuda_copy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)), "cudaMemcpyAsync");
}

std::size_t cuda_l2_bytes() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    int bytes = 0;
    check(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
    return std::size_t(bytes);
}

const char* cuda_device_name() {
    static std::string name;
    if (name.empty()) {
        int device = 0;
        check(cudaGetDevice(&device), "cudaGetDevice");
        cudaDeviceProp properties{};
        check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
        name = properties.name;
    }
    return name.c_str();
}

}  // namespace rope_bench
