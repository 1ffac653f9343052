// rope-bench: one benchmark program for every backend.
//
// RoPE is memory bound, so the question a benchmark must answer is "how close
// to the memory system's limit does a backend get?". For each backend, shape,
// position form and thread count this program reports the median time of one
// call, the bytes a call must move (q and k each read once and written once),
// the bandwidth that implies, and that bandwidth as a percentage of a copy of
// the same bytes, measured in the same run with the same threads.
//
// How the numbers are made honest (the method is the project's definition of
// "% of copy", stated in bench/timing/timing.hpp and shared with chapter 4's
// ladder and the tuning sweep through the rope-bench-timing library):
// - Inputs hold random non-zero values (no zero or denormal shortcuts).
// - One "set" is a q and a k. Calls rotate through the sets, and there are
//   enough sets that together they span at least twice the last-level cache
//   (the host's LLC as sysfs reports it, or the GPU's L2): every call reads
//   from memory, not cache. The figure and its source are printed.
// - The timed work is Backend::run on a Plan built beforehand: validation by
//   rope::make_plan happens once per set, outside the clock, and so do the
//   copies of the position arrays and of a cos/sin table to the device.
//   Backend::run trusts its plan, so each backend's first call goes through
//   rope::apply, which refuses what the backend does not implement (e.g.
//   --precise): such a backend's row says "unsupported: <why>" instead of
//   timing something else.
// - CPU (timing = clock): each call is timed alone with the steady clock, and
//   calls alternate with the two ceilings, a memcpy and an in-place
//   read-modify-write stream of the same bytes (a memcpy pays a read for
//   ownership of its destination that an in-place rotation does not); the
//   faster of the two is the ceiling (bench/timing/host_timing.hpp).
// - GPU: CUDA events around batches of back-to-back calls lasting at least
//   1 ms (timing = events), or around replays of one CUDA graph of the calls
//   (--graph, timing = graph). The ceiling is the fastest of cudaMemcpyAsync
//   and a 16-byte copy kernel, each timed back to back and by graph replay
//   (bench/timing/cuda_timing.hpp), whatever the timing of the calls.
// - Reported: medians over repetitions; the `ceiling` column says which copy
//   won, `ceilings` lists them all. --runs R repeats the whole measurement
//   (calls and ceiling) R times and reports the run with the median ratio and
//   the smallest and largest ratios (pct_min, pct_max): the ratio's own noise.
// - Position forms (--layout thd, --packed, --cp, --mrope, --axial, --table, --ids:
//   bench/forms.hpp) change what the positions are; the bytes moved, and so
//   the ceiling, stay those of q and k.
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "forms.hpp"
#include "options.hpp"
#include "report.hpp"
#include "rope/rope.hpp"
#include "workload.hpp"

#if ROPE_BENCH_OPENMP
#include <omp.h>
#endif

namespace {

int resolve_threads(int requested) {
#if ROPE_BENCH_OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;  // Without OpenMP there is no multi-threaded backend and no parallel copy.
#endif
}

std::string host_cpu_model() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

std::string shape_text(const rope_bench::Shape& shape) {
    return std::to_string(shape.batch) + "," + std::to_string(shape.heads) + "," + std::to_string(shape.seq) + "," +
           std::to_string(shape.head_dim);
}

// One row: the backend measured options.runs times on the workload, or why it was not.
rope_bench::Row measure_row(const rope_bench::Options& options, rope_bench::Workload& workload,
                            const rope::BackendInfo& info, int threads, rope_bench::Row row) {
    rope::BackendOptions backend_options;
    backend_options.threads = threads;
    const std::unique_ptr<rope::Backend> backend = rope::make_backend(info.name, backend_options);
    if (const std::string refusal = workload.refusal(*backend); !refusal.empty()) {
        row.not_run = "unsupported: " + refusal;
        return row;
    }
    std::vector<rope_bench::Measurement> runs;
    for (int run = 0; run < options.runs; ++run) runs.push_back(workload.measure(*backend, threads));
    row.summary = rope_bench::summarize(runs);
    row.sets = workload.sets();
    row.bytes = workload.bytes();
    return row;
}

// The line above a table: the machine, the caches the sets defeat, the method.
std::string preamble(const rope_bench::Options& options, const std::map<rope::Device, std::string>& caches) {
    std::ostringstream text;
    text << "# " << host_cpu_model();
#if ROPE_BENCH_CUDA
    if (caches.count(rope::Device::cuda)) text << "; " << rope_bench::cuda_device_name();
#endif
    for (const auto& [device, cache] : caches)
        text << "; " << (device == rope::Device::host ? "host" : "GPU") << " cache to defeat: " << cache;
    text << "\n# median per call (sets span >= 2x that cache); bytes = (q + k elements) x 2 x dtype size; ceiling ="
         << " the fastest copy of the same bytes (host: memcpy or in-place read-modify-write; GPU: cudaMemcpyAsync or"
         << " a 16-byte copy kernel, back to back or from a CUDA graph)";
    if (options.runs > 1) text << "; " << options.runs << " runs: the median ratio, and its min and max";
    return text.str();
}

}  // namespace

int main(int argc, char** argv) {
    rope_bench::Options options;
    try {
        options = rope_bench::parse_options(argc, argv);
    } catch (const rope_bench::UsageError& error) {
        std::cerr << "rope-bench: " << error.what() << "\n(rope-bench --help lists the options)\n";
        return 2;
    }
    if (options.help) {
        std::cout << options.usage;
        return 0;
    }
    std::vector<rope_bench::Row> rows;
    std::map<rope::Device, std::string> caches;  // For the preamble: what each device's sets defeat.
    bool graph_noted = false;
    try {
        for (const rope_bench::Shape& shape : options.shapes) {
            const int64_t kv_heads = options.kv_heads >= 0 ? options.kv_heads : shape.heads;
            const rope_bench::Form form = rope_bench::make_form(options, shape, kv_heads);
            std::map<rope::Device, std::unique_ptr<rope_bench::Workload>> workloads;  // Built on first use.
            for (const std::string& name : options.backends) {
                const rope::BackendInfo info = rope::backend_info(name);
                const bool host = info.device == rope::Device::host;
                if (host && options.graph && !std::exchange(graph_noted, true))
                    std::cerr << "rope-bench: note: --graph applies to CUDA backends only; CPU backends are timed "
                                 "as always (timing = clock)\n";
                // GPU backends ignore threads: run them once, not once per thread count.
                for (int threads : host ? options.threads : std::vector<int>{0}) {
                    rope_bench::Row row;
                    row.backend = name;
                    row.shape = shape_text(shape);
                    row.kv_heads = kv_heads;
                    row.dtype = std::string(rope::dtype_name(options.dtype));
                    row.style = std::string(rope::style_name(options.style));
                    row.layout = std::string(rope::layout_name(options.layout));
                    row.placement = options.in_place ? "in" : "out";
                    row.threads = host ? std::to_string(resolve_threads(threads)) : "-";
                    row.timing = host ? "clock" : options.graph ? "graph" : "events";
                    row.precise = options.precise;
                    row.position_offset = options.position_offset;
                    row.form = form.name;
                    row.form_detail = form.detail;
                    if (!info.available) row.not_run = "skipped: " + info.reason;
#if !ROPE_BENCH_CUDA
                    if (row.not_run.empty() && !host) row.not_run = "skipped: rope-bench built without CUDA timing";
#endif
                    if (row.not_run.empty()) {
                        std::unique_ptr<rope_bench::Workload>& workload = workloads[info.device];
                        if (!workload) workload = std::make_unique<rope_bench::Workload>(options, form, info.device);
                        caches[info.device] = std::to_string(workload->cache().bytes >> 20) + " MiB (" +
                                              workload->cache().source + ")";
                        row.cache = caches[info.device];
                        row = measure_row(options, *workload, info, resolve_threads(threads), row);
                    }
                    rows.push_back(row);
                    if (options.format == "table") std::cerr << "done: " << name << " " << row.shape << "\n";
                }
            }
        }
    } catch (const rope_bench::UsageError& error) {
        std::cerr << "rope-bench: " << error.what() << "\n";
        return 2;
    } catch (const std::exception& error) {
        std::cerr << "rope-bench: " << error.what() << "\n";
        return 1;
    }
    rope_bench::write_rows(std::cout, rows, options.format, preamble(options, caches));
    return 0;
}
