// Timing on the GPU (see cuda_timing.hpp). Host-side CUDA runtime calls only:
// compiled by the C++ compiler and linked against cudart; the copy kernel is in copy16.cu.
#include "cuda_timing.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "rope/cuda_check.hpp"

namespace rope_bench {
namespace {

// A repetition lasts at least this long (and waits behind a spin, so no launch gap is in it).
constexpr double kRepetitionUs = 1000.0;
// Untimed repetitions before the timed ones, at least this long, where the GPU sat idle for more than
// kIdleUs since the last measurement ended (e.g. while the sets were allocated and filled): its clocks are
// up again before the first timed one. Back-to-back measurements (a ceiling after its call) need none.
constexpr double kWarmUpUs = 20000.0;
constexpr double kIdleUs = 100000.0;
std::chrono::steady_clock::time_point g_last_measurement_end{};

double microseconds_since(std::chrono::steady_clock::time_point then) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - then).count();
}
// The spin before a repetition: twice the host's time to issue its first call (or the graph's launch), plus this.
constexpr double kSpinMarginUs = 10.0;
// At most this many calls per repetition (a call of 50 ns would need 20000).
constexpr int64_t kMaxCallsPerRepetition = 20000;

// A failed CUDA call ends the measurement with CUDA's own error text.
using rope::check_cuda;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Owns a pair of events, recorded on one stream, for the lifetime of one measurement.
struct EventPair {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    explicit EventPair(void* on) : stream(as_stream(on)) {
        check_cuda(cudaEventCreate(&start), "cudaEventCreate");
        check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    }
    ~EventPair() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;

    double spin_us = 0;  // How long the GPU waits, before the start event, for the host to issue the work.

    // Milliseconds that the work `issue` enqueues on the stream takes. Waiting
    // for the stop event also reports any fault of that work.
    float time_ms(const std::function<void()>& issue) {
        if (spin_us > 0) cuda_spin_async(spin_us, stream);
        check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
        issue();
        check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize (the timed work failed)");
        float ms = 0.0f;
        check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        return ms;
    }
    // Milliseconds for calls [first, first + count) of launch, back to back.
    float time_calls_ms(const Launch& launch, int64_t first, int64_t count) {
        return time_ms([&] {
            for (int64_t call = first; call < first + count; ++call) launch(call);
        });
    }
};

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

// Captures calls [first, first + count) of launch, issued on stream, into graph.
void capture(const Launch& launch, int64_t first, int64_t count, cudaStream_t stream, Graph& graph) {
    // Thread-local mode: only this thread's unsafe calls (e.g. cudaMalloc) would break the capture.
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
        for (int64_t call = first; call < first + count; ++call) launch(call);
    } catch (...) {
        cudaStreamEndCapture(stream, &graph.graph);  // Take the stream out of capture before reporting the error.
        throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph.graph), "cudaStreamEndCapture");
    check_cuda(cudaGraphInstantiate(&graph.exec, graph.graph, 0), "cudaGraphInstantiate");
}

// Median over reps of rep_ms() / calls, in microseconds per call.
double median_per_call_us(int reps, int64_t calls, const std::function<float()>& rep_ms) {
    std::vector<double> per_call_us;
    for (int rep = 0; rep < std::max(reps, 1); ++rep) per_call_us.push_back(1000.0 * rep_ms() / double(calls));
    return median(per_call_us);
}

}  // namespace

double cuda_call_us(const Launch& launch, GpuClock clock, int reps, int64_t sets, void* stream) {
    const cudaStream_t s = as_stream(stream);
    // Warm-up: every set once (module loading, clocks, first touch; and lazy
    // loading stays out of a graph capture).
    for (int64_t call = 0; call < sets; ++call) launch(call);
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (warm-up)");
    // The host's time to issue one call (the GPU idle): what the spin before a repetition must outlast.
    const auto issuing = std::chrono::steady_clock::now();
    launch(sets);
    const double issue_us = microseconds_since(issuing);
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (warm-up)");

    // Calls per repetition: enough for kRepetitionUs, judged from 4 calls.
    EventPair events(stream);
    int64_t next_call = sets + 1;
    const double one_call_us = 1000.0 * events.time_calls_ms(launch, next_call, 4) / 4.0;
    next_call += 4;
    const int64_t calls = std::clamp<int64_t>(int64_t(std::ceil(kRepetitionUs / std::max(one_call_us, 1e-3))), 1,
                                              kMaxCallsPerRepetition);
    const bool was_idle = microseconds_since(g_last_measurement_end) > kIdleUs;
    for (double warmed_us = 0; was_idle && warmed_us < kWarmUpUs; next_call += calls)
        warmed_us += 1000.0 * events.time_calls_ms(launch, next_call, calls);
    events.spin_us = 2 * issue_us + kSpinMarginUs;

    if (clock == GpuClock::events) {
        const double us = median_per_call_us(reps, calls, [&] {
            const float ms = events.time_calls_ms(launch, next_call, calls);
            next_call += calls;
            return ms;
        });
        g_last_measurement_end = std::chrono::steady_clock::now();
        return us;
    }
    // A whole number of passes over the sets per graph.
    const int64_t per_graph = (calls + sets - 1) / sets * sets;
    Graph graph;
    capture(launch, next_call, per_graph, s, graph);
    auto replay = [&] { check_cuda(cudaGraphLaunch(graph.exec, s), "cudaGraphLaunch"); };
    replay();  // Untimed: uploads the graph, so the timed replays measure execution only.
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (graph upload)");
    const auto launching = std::chrono::steady_clock::now();
    replay();  // Untimed: the host's time to launch the graph, which the spin must outlast.
    events.spin_us = 2 * microseconds_since(launching) + kSpinMarginUs;
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (graph replay)");
    const double us = median_per_call_us(reps, per_graph, [&] { return events.time_ms(replay); });
    g_last_measurement_end = std::chrono::steady_clock::now();
    return us;
}

Ceiling cuda_copy_ceiling(const Sets& sets, int reps) {
    rope::CudaStream stream;  // Of its own: graph capture needs one, whatever stream the caller uses.
    const Launch memcpy_call = [&](int64_t call) {
        check_cuda(cudaMemcpyAsync(sets.at(sets.copy_destination, call), sets.at(sets.inputs, call), sets.set_bytes,
                              cudaMemcpyDeviceToDevice, as_stream(stream.get())),
              "cudaMemcpyAsync");
    };
    const Launch copy16_call = [&](int64_t call) {
        cuda_copy16_async(sets.at(sets.copy_destination, call), sets.at(sets.inputs, call), sets.set_bytes,
                          stream.get());
    };
    std::vector<CeilingCandidate> candidates;  // The clock named as the CSVs' timing column names it.
    for (const auto& [name, launch] : {std::pair{"memcpy", &memcpy_call}, std::pair{"copy16", &copy16_call}})
        for (GpuClock clock : {GpuClock::events, GpuClock::graph})
            candidates.push_back({std::string(name) + (clock == GpuClock::events ? "-events" : "-graph"),
                                  cuda_call_us(*launch, clock, reps, sets.sets, stream.get())});
    return fastest(std::move(candidates));
}

Measurement cuda_measure(const Launch& launch, GpuClock clock, int reps, const Sets& sets, void* stream) {
    Measurement measurement;
    measurement.reps = reps;
    measurement.call_us = cuda_call_us(launch, clock, reps, sets.sets, stream);
    measurement.ceiling = cuda_copy_ceiling(sets, reps);
    return measurement;
}

std::size_t cuda_l2_bytes() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    int bytes = 0;
    check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
    return std::size_t(bytes);
}

const char* cuda_device_name() {
    static std::string name;
    if (name.empty()) {
        int device = 0;
        check_cuda(cudaGetDevice(&device), "cudaGetDevice");
        cudaDeviceProp properties{};
        check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
        name = properties.name;
    }
    return name.c_str();
}

}  // namespace rope_bench
