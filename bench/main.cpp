// rope-bench: one benchmark program for every backend.
//
// RoPE is memory bound, so the question a benchmark must answer is "how close
// to the memory system's limit does a backend get?". For each backend, shape
// and thread count this program reports the median time of one call, the
// bytes a call must move (q and k each read once and written once), the
// bandwidth that implies, and that bandwidth as a percentage of a plain memory
// copy of the same bytes, measured in the same process with the same threads.
//
// How the numbers are made honest:
// - Inputs hold random non-zero values (no zero or denormal shortcuts).
// - One "set" is a q and a k. Calls rotate through the sets, and there are
//   enough sets that together they span at least twice the last-level cache
//   (the host LLC, or the GPU's L2): every call reads from memory, not cache.
// - The timed work is Backend::run on a Plan built beforehand: validation by
//   rope::make_plan happens once per set, outside the clock. Backend::run
//   trusts its plan, so each backend's first call goes through rope::apply,
//   which refuses what the backend does not implement (e.g. --precise): such a
//   backend's row says "unsupported: <why>" instead of timing something else.
// - CPU: each call is timed alone with std::chrono::steady_clock, and calls
//   alternate with copies, so the ceiling is measured under the same machine
//   conditions as the backend (timing = clock). GPU: CUDA events around
//   back-to-back calls on the default stream (timing = events), or, with
//   --graph, around replays of one CUDA graph of the calls captured on a
//   stream of its own (timing = graph: the per-call latency without the host's
//   launch overhead, what an application that uses graphs sees); the copy
//   ceiling is then a graph of copies too. Reported: medians over
//   repetitions, after a warm-up call on every set.
// - --precise and --position-offset select the angle computation and the
//   positions (offset, ..., offset+seq-1): sin and cos cost more for large
//   angles, so long-context cost is measured at long positions.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include "rope/detail/plan.hpp"  // make_plan: calls are validated once, outside the clock
#include "rope/rope.hpp"

#if ROPE_BENCH_OPENMP
#include <omp.h>
#endif
#if ROPE_BENCH_CUDA
#include "cuda_timing.hpp"
#endif

namespace {

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

constexpr const char* kUsage = R"(usage: rope-bench [options]
  --backend NAME|all     backend to run (repeatable; default all)
  --shape B,H,N,D        batch, q heads, seq, head_dim (repeatable; default 1,32,4096,128)
  --kv-heads Hk          k heads (default: H; 0 rotates q only)
  --dtype fp32|bf16|fp16 storage type (default fp32)
  --style neox|gptj      half-split or interleaved pairs (default neox)
  --layout bhsd|bshd     memory layout of q and k (default bhsd)
  --placement in|out     rotate in place (default) or into separate outputs
  --threads T[,T...]     CPU threads, 0 = OpenMP default (default 0)
  --reps R               timed repetitions (default: about one second's worth)
  --llc-mb M             cache size the rotating sets must exceed (default: detected)
  --precise              RopeConfig::precise_angles = true (angle in double, reduced to
                         [-pi, pi]); a backend without it is reported "unsupported"
  --position-offset P    positions P, ..., P+seq-1 (default 0)
  --graph                CUDA backends: time by replaying one CUDA graph of the calls
                         (and of the copies) instead of back-to-back launches
  --format table|csv|json
)";

struct Shape {
    int64_t batch = 1, heads = 32, seq = 4096, head_dim = 128;
};

struct Options {
    std::vector<std::string> backends;
    std::vector<Shape> shapes;
    int64_t kv_heads = -1;  // -1: same as the shape's heads.
    rope::DType dtype = rope::DType::f32;
    rope::Style style = rope::Style::half_split;
    rope::Layout layout = rope::Layout::bhsd;
    bool in_place = true;
    std::vector<int> threads{0};
    int reps = 0;  // 0: chosen from the time of one call.
    double llc_mb = 0.0;  // 0: detected.
    bool precise = false;          // RopeConfig::precise_angles.
    int64_t position_offset = 0;   // First position.
    bool graph = false;            // GPU: time by CUDA graph replay.
    std::string format = "table";
};

[[noreturn]] void usage_error(const std::string& message) {
    std::cerr << "rope-bench: " << message << "\n" << kUsage;
    std::exit(2);
}

std::vector<int64_t> parse_integers(const std::string& text, const char* option) {
    std::vector<int64_t> values;
    std::stringstream stream(text);
    std::string item;
    while (std::getline(stream, item, ',')) {
        size_t used = 0;
        int64_t value = 0;
        try {
            value = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size() || item.empty() || value < 0)
            usage_error(std::string(option) + " expects non-negative integers, got '" + text + "'");
        values.push_back(value);
    }
    return values;
}

Options parse_options(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::cout << kUsage;
            std::exit(0);
        }
        if (arg == "--precise" || arg == "--graph") {  // Flags: no value follows.
            (arg == "--precise" ? options.precise : options.graph) = true;
            continue;
        }
        if (i + 1 >= argc) usage_error("missing value after " + std::string(arg));
        const std::string value = argv[++i];
        if (arg == "--backend") {
            options.backends.push_back(value);
        } else if (arg == "--shape") {
            const auto sizes = parse_integers(value, "--shape");
            if (sizes.size() != 4) usage_error("--shape expects B,H,N,D, got '" + value + "'");
            options.shapes.push_back({sizes[0], sizes[1], sizes[2], sizes[3]});
        } else if (arg == "--kv-heads") {
            options.kv_heads = parse_integers(value, "--kv-heads").at(0);
        } else if (arg == "--dtype") {
            options.dtype = rope::parse_dtype(value);
        } else if (arg == "--style") {
            options.style = rope::parse_style(value);
        } else if (arg == "--layout") {
            if (value != "bhsd" && value != "bshd") usage_error("--layout expects bhsd or bshd");
            options.layout = value == "bhsd" ? rope::Layout::bhsd : rope::Layout::bshd;
        } else if (arg == "--placement") {
            if (value != "in" && value != "out") usage_error("--placement expects in or out");
            options.in_place = value == "in";
        } else if (arg == "--threads") {
            options.threads.clear();
            for (int64_t t : parse_integers(value, "--threads")) options.threads.push_back(int(t));
        } else if (arg == "--reps") {
            options.reps = int(parse_integers(value, "--reps").at(0));
        } else if (arg == "--llc-mb") {
            options.llc_mb = double(parse_integers(value, "--llc-mb").at(0));
        } else if (arg == "--position-offset") {
            options.position_offset = parse_integers(value, "--position-offset").at(0);
        } else if (arg == "--format") {
            if (value != "table" && value != "csv" && value != "json") usage_error("--format expects table, csv or json");
            options.format = value;
        } else {
            usage_error("unknown option " + std::string(arg));
        }
    }
    if (options.backends.empty() || std::find(options.backends.begin(), options.backends.end(), "all") != options.backends.end()) {
        options.backends.clear();
        for (const rope::BackendInfo& info : rope::list_backends()) options.backends.push_back(info.name);
    }
    if (options.shapes.empty()) options.shapes.push_back(Shape{});
    return options;
}

// ---------------------------------------------------------------------------
// The machine
// ---------------------------------------------------------------------------

int resolve_threads(int requested) {
#if ROPE_BENCH_OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;  // Without OpenMP there is no multi-threaded backend and no parallel copy.
#endif
}

// Last-level cache of the host in bytes (sysconf, then a conservative guess).
size_t host_llc_bytes() {
    for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
        const long bytes = sysconf(name);
        if (bytes > 0) return size_t(bytes);
    }
    return size_t(32) << 20;
}

std::string host_cpu_model() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

// ---------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------

// Tiny deterministic generator (SplitMix64): fills a gigabyte in well under a second.
uint64_t split_mix(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random values of magnitude in [0.25, 1) and random sign: never zero, never denormal.
template <typename Storage>
void fill_random(Storage* data, int64_t count) {
    constexpr int64_t kChunk = int64_t(1) << 16;
    const int64_t chunks = (count + kChunk - 1) / kChunk;
#if ROPE_BENCH_OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        uint64_t state = uint64_t(chunk) * 7919u + 1u;  // Seeded per chunk: same data whatever the threads.
        const int64_t end = std::min(count, (chunk + 1) * kChunk);
        for (int64_t i = chunk * kChunk; i < end; ++i) {
            const uint64_t bits = split_mix(state);
            const float magnitude = 0.25f + 0.75f * float(bits >> 40) / float(uint64_t(1) << 24);
            data[i] = rope::from_float<Storage>((bits & 1u) ? -magnitude : magnitude);
        }
    }
}

// `sets` back-to-back copies of one q and one k, on the backend's device.
struct Arena {
    rope::Buffer memory;
    int64_t sets = 0;
    size_t set_bytes = 0;  // q and k of one set.
    char* set(int64_t index) const { return static_cast<char*>(memory.data()) + size_t(index) * set_bytes; }
};

Arena make_arena(rope::Device device, rope::DType dtype, size_t set_bytes, int64_t sets) {
    Arena arena{rope::Buffer(device, set_bytes * size_t(sets)), sets, set_bytes};
    const int64_t count = int64_t(arena.memory.bytes()) / rope::dtype_size(dtype);
    if (device == rope::Device::host) {
        rope::dispatch_dtype(dtype, [&](auto storage) {
            fill_random(static_cast<decltype(storage)*>(arena.memory.data()), count);
        });
    } else {
        std::vector<char> staging(arena.memory.bytes());
        rope::dispatch_dtype(dtype, [&](auto storage) {
            fill_random(reinterpret_cast<decltype(storage)*>(staging.data()), count);
        });
        arena.memory.copy_from_host(staging.data());
    }
    return arena;
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

double median(std::vector<double> values) {
    std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
    return values[values.size() / 2];
}

// Repetitions worth about one second, given the time of one call.
int auto_reps(const Options& options, double call_us) {
    if (options.reps > 0) return options.reps;
    return std::clamp(int(1e6 / std::max(call_us, 1e-3)), 15, 2000);
}

// Microseconds that host work(call) takes.
double host_us(const std::function<void(int64_t)>& work, int64_t call) {
    const auto start = std::chrono::steady_clock::now();
    work(call);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

// ---------------------------------------------------------------------------
// One shape on one device: buffers, plans and copy ceilings, shared by every
// backend and thread count that runs it (allocating and filling gigabytes once,
// not once per backend).
// ---------------------------------------------------------------------------

class Workload {
public:
    Workload(const Options& options, const Shape& shape, int64_t kv_heads, rope::Device device)
        : options_(options), device_(device) {
        const int64_t q_elements = shape.batch * shape.heads * shape.seq * shape.head_dim;
        const int64_t k_elements = shape.batch * kv_heads * shape.seq * shape.head_dim;
        const size_t element_bytes = size_t(rope::dtype_size(options.dtype));
        set_bytes_ = size_t(q_elements + k_elements) * element_bytes;

        // Enough sets to span twice the cache, so no call finds its inputs cached.
        size_t cache_bytes = options.llc_mb > 0 ? size_t(options.llc_mb * double(1 << 20)) : host_llc_bytes();
#if ROPE_BENCH_CUDA
        if (device != rope::Device::host && options.llc_mb <= 0) cache_bytes = rope_bench::cuda_l2_bytes();
#endif
        sets_ = std::clamp<int64_t>(int64_t((2 * cache_bytes + set_bytes_ - 1) / std::max<size_t>(set_bytes_, 1)), 1,
                                    int64_t(1) << 16);
        inputs_ = make_arena(device, options.dtype, set_bytes_, sets_);
        if (!options.in_place) outputs_ = make_arena(device, options.dtype, set_bytes_, sets_);
#if ROPE_BENCH_CUDA
        // Graph capture needs a stream other than the legacy default one; the plans issue on it.
        if (options.graph && device != rope::Device::host) stream_ = std::make_unique<rope_bench::CudaStream>();
#endif

        config_.head_dim = shape.head_dim;
        config_.style = options.style;
        config_.precise_angles = options.precise;
        auto view = [&](char* data, int64_t heads) {
            const std::array<int64_t, 4> sizes =
                options.layout == rope::Layout::bhsd ? std::array<int64_t, 4>{shape.batch, heads, shape.seq, shape.head_dim}
                                                     : std::array<int64_t, 4>{shape.batch, shape.seq, heads, shape.head_dim};
            return rope::TensorView::contiguous(data, options.dtype, device, options.layout, sizes);
        };
        const size_t q_bytes = size_t(q_elements) * element_bytes;
        for (int64_t set = 0; set < sets_; ++set) {
            const rope::TensorView q = view(inputs_.set(set), shape.heads);
            const rope::TensorView k = view(inputs_.set(set) + q_bytes, kv_heads);
            const rope::Positions positions = rope::Positions::starting_at(options.position_offset);
            rope::RopeArgs args =
                options.in_place ? rope::RopeArgs::in_place(q, k, positions)
                                 : rope::RopeArgs::out_of_place(q, k, view(outputs_.set(set), shape.heads),
                                                                view(outputs_.set(set) + q_bytes, kv_heads), positions);
            args.stream = stream();
            if (set == 0) first_args_ = args;
            plans_.push_back(rope::make_plan(config_, args, device));
        }
    }

    int64_t sets() const { return sets_; }

    /// Why @p backend refuses this workload (rope::apply's message), or empty
    /// if it accepts it. Runs the first set once through rope::apply, which
    /// checks what Backend::run trusts the plan for, e.g. the precise mode.
    std::string refusal(rope::Backend& backend) const {
        try {
            rope::apply(backend, config_, first_args_);
        } catch (const rope::Error& error) {
            return error.what();
        }
        return {};
    }

    /// Bytes one call moves: every element of q and k read once and written once.
    double bytes() const { return 2.0 * double(set_bytes_); }

    /// Median microseconds of one call and of one copy of the same bytes (the ceiling).
    struct Timing {
        double call_us = 0;
        double copy_us = 0;
        int calls = 0;  // Timed calls (and as many timed copies).
    };

    /// Times backend.run() on the rotating sets, and the copy ceiling with @p threads threads.
    Timing time(rope::Backend& backend, int threads) {
        if (copy_destination_.bytes() == 0) {
            copy_destination_ = rope::Buffer(device_, inputs_.memory.bytes());
            if (device_ == rope::Device::host)
                std::memset(copy_destination_.data(), 0, copy_destination_.bytes());  // Fault pages in now.
        }
        auto run = [&](int64_t call) { backend.run(plans_[size_t(call % sets_)]); };
        return device_ == rope::Device::host ? time_host(run, threads) : time_cuda(run);
    }

private:
    char* copy_destination(int64_t set) const {
        return static_cast<char*>(copy_destination_.data()) + size_t(set) * set_bytes_;
    }

    // Host: calls and copies alternate, one of each per repetition, so both
    // see the same machine. (On a shared or virtual machine the memory
    // bandwidth drifts over seconds; a ceiling measured at another moment
    // would turn that drift into a wrong percentage.)
    Timing time_host(const std::function<void(int64_t)>& run, int threads) {
        // The copy reads the set furthest from the ones the backend just used
        // and uses next, so it neither warms nor finds warm the backend's data.
        auto copy = [&](int64_t call) {
            const int64_t set = (call + sets_ / 2) % sets_;
            char* to = copy_destination(set);
            const char* from = inputs_.set(set);
#if ROPE_BENCH_OPENMP
            // Each thread memcpy's its share: the ceiling for this many threads.
#pragma omp parallel num_threads(threads)
            {
                const size_t share = set_bytes_ / size_t(omp_get_num_threads());
                const size_t begin = share * size_t(omp_get_thread_num());
                const bool last = omp_get_thread_num() + 1 == omp_get_num_threads();
                std::memcpy(to + begin, from + begin, (last ? set_bytes_ : begin + share) - begin);
            }
#else
            (void)threads;
            std::memcpy(to, from, set_bytes_);
#endif
        };
        // Warm-up: every set once (first touch, thread start-up, caches of code).
        std::vector<double> warmup_us;
        for (int64_t call = 0; call < sets_; ++call) warmup_us.push_back(host_us(run, call) + host_us(copy, call));
        Timing timing;
        timing.calls = auto_reps(options_, median(warmup_us));
        std::vector<double> call_us, copy_us;
        for (int64_t call = sets_; call < sets_ + timing.calls; ++call) {
            call_us.push_back(host_us(run, call));
            copy_us.push_back(host_us(copy, call));
        }
        timing.call_us = median(call_us);
        timing.copy_us = median(copy_us);
        return timing;
    }

    // GPU: the backend and the copy ceiling timed the same way (see cuda_us).
    // The ceiling is measured once per workload: a GPU is not shared here.
    Timing time_cuda([[maybe_unused]] const std::function<void(int64_t)>& run) {
        Timing timing;
#if ROPE_BENCH_CUDA
        timing.calls = options_.reps > 0 ? options_.reps : 50;
        timing.call_us = cuda_us(run, timing.calls);
        if (cuda_copy_us_ <= 0) {
            auto copy = [&](int64_t call) {
                const int64_t set = call % sets_;
                rope_bench::cuda_copy_async(copy_destination(set), inputs_.set(set), set_bytes_, stream());
            };
            cuda_copy_us_ = cuda_us(copy, timing.calls);
        }
        timing.copy_us = cuda_copy_us_;
#endif
        return timing;
    }

#if ROPE_BENCH_CUDA
    // Median microseconds per call of launch (issuing on stream()), over reps repetitions.
    double cuda_us(const rope_bench::Launch& launch, int reps) {
        // A repetition lasts ~200 us: enough calls that event resolution and launch gaps do not dominate.
        const int64_t calls = rope_bench::cuda_calls_per_rep(launch, 200.0, stream());
        if (!options_.graph) return rope_bench::cuda_median_us(launch, reps, calls, sets_);
        // A whole number of passes over the sets: a set's next visit, even in the
        // next replay, comes after every other set, so replays find no set in L2 either.
        const int64_t passes = (calls + sets_ - 1) / sets_;
        return rope_bench::cuda_graph_median_us(launch, reps, passes * sets_, sets_, stream());
    }
#endif

    // The CUDA stream the plans and copies issue on (null: the legacy default stream).
    void* stream() const {
#if ROPE_BENCH_CUDA
        if (stream_) return stream_->get();
#endif
        return nullptr;
    }

    const Options& options_;
    rope::Device device_;
#if ROPE_BENCH_CUDA
    std::unique_ptr<rope_bench::CudaStream> stream_;  // Only for --graph on a GPU.
#endif
    rope::RopeConfig config_;
    rope::RopeArgs first_args_;  // Set 0's call, for refusal().
    size_t set_bytes_ = 0;  // q and k of one set.
    int64_t sets_ = 1;
    Arena inputs_;
    Arena outputs_;  // Only for --placement out.
    rope::Buffer copy_destination_;
    std::vector<rope::Plan> plans_;  // One per set, built (validated) before any timing.
    double cuda_copy_us_ = 0;        // GPU copy ceiling, once measured.
};

struct Result {
    std::string backend;
    Shape shape;
    int64_t kv_heads = 0;
    std::string threads;  // Resolved count for CPU backends, "-" for GPU backends.
    std::string timing;   // How calls were timed: "clock" (host), "events" or "graph" (GPU).
    std::string not_run;  // Why it did not run, as the status says it ("skipped: ...", "unsupported: ..."); empty when it ran.
    int64_t sets = 0;
    int calls = 0;
    double median_us = 0, gbps = 0, copy_gbps = 0;
};

void measure(Workload& workload, const rope::BackendInfo& info, int threads, Result& result) {
    rope::BackendOptions backend_options;
    backend_options.threads = threads;
    const std::unique_ptr<rope::Backend> backend = rope::make_backend(info.name, backend_options);
    if (const std::string refusal = workload.refusal(*backend); !refusal.empty()) {
        result.not_run = "unsupported: " + refusal;
        return;
    }
    const Workload::Timing timing = workload.time(*backend, threads);
    result.sets = workload.sets();
    result.calls = timing.calls;
    result.median_us = timing.call_us;
    result.gbps = workload.bytes() / (timing.call_us * 1e3);
    result.copy_gbps = workload.bytes() / (timing.copy_us * 1e3);
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

struct Cell {
    std::string text;
    bool number = false;
};

std::string format_number(double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    return text;
}

const std::vector<std::string> kColumns{"backend", "shape",  "kv_heads", "dtype",     "style",     "layout",
                                        "placement", "threads", "sets",  "calls",     "median_us", "GBps",
                                        "copy_GBps", "pct_of_copy", "status",
                                        // Added later, so appended: existing consumers keep their column positions.
                                        "precise", "position_offset", "timing"};

std::vector<Cell> cells_of(const Options& options, const Result& r) {
    const std::string shape = std::to_string(r.shape.batch) + "," + std::to_string(r.shape.heads) + "," +
                              std::to_string(r.shape.seq) + "," + std::to_string(r.shape.head_dim);
    std::vector<Cell> cells{{r.backend},
                            {shape},
                            {std::to_string(r.kv_heads), true},
                            {std::string(rope::dtype_name(options.dtype))},
                            {std::string(rope::style_name(options.style))},
                            {std::string(rope::layout_name(options.layout))},
                            {options.in_place ? "in" : "out"},
                            {r.threads, r.threads != "-"}};
    if (!r.not_run.empty()) {
        for (int i = 0; i < 6; ++i) cells.push_back({"", true});
        cells.push_back({r.not_run});
    } else {
        const bool tiny = r.median_us < 100;
        cells.push_back({std::to_string(r.sets), true});
        cells.push_back({std::to_string(r.calls), true});
        cells.push_back({format_number(r.median_us, tiny ? 2 : 1), true});
        cells.push_back({format_number(r.gbps, 1), true});
        cells.push_back({format_number(r.copy_gbps, 1), true});
        cells.push_back({format_number(100.0 * r.gbps / r.copy_gbps, 1), true});
        cells.push_back({"ok"});
    }
    cells.push_back({options.precise ? "1" : "0", true});
    cells.push_back({std::to_string(options.position_offset), true});
    cells.push_back({r.timing});
    return cells;
}

void print_table(const std::vector<std::vector<Cell>>& rows) {
    std::vector<size_t> widths;
    for (const std::string& column : kColumns) widths.push_back(column.size());
    for (const auto& row : rows)
        for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].text.empty() ? 1 : row[c].text.size());
    auto line = [&](const std::vector<std::string>& texts, const std::vector<bool>& right) {
        std::string out;
        for (size_t c = 0; c < texts.size(); ++c) {
            const std::string text = texts[c].empty() ? "-" : texts[c];
            const std::string pad(widths[c] - text.size(), ' ');
            out += (c ? "  " : "") + (right[c] ? pad + text : text + (c + 1 < texts.size() ? pad : ""));
        }
        std::cout << out << "\n";
    };
    std::vector<bool> right(kColumns.size(), false);
    for (const auto& row : rows)
        for (size_t c = 0; c < row.size(); ++c) right[c] = right[c] || (row[c].number && !row[c].text.empty());
    line(kColumns, right);
    for (const auto& row : rows) {
        std::vector<std::string> texts;
        for (const Cell& cell : row) texts.push_back(cell.text);
        line(texts, right);
    }
}

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_field(const std::string& text) {
    if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
    std::string quoted = "\"";
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
}

// A JSON string literal (error messages may hold quotes or backslashes).
std::string json_string(const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
            out += escaped;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

void print_csv(const std::vector<std::vector<Cell>>& rows) {
    for (size_t c = 0; c < kColumns.size(); ++c) std::cout << (c ? "," : "") << kColumns[c];
    std::cout << "\n";
    for (const auto& row : rows) {
        for (size_t c = 0; c < row.size(); ++c) std::cout << (c ? "," : "") << csv_field(row[c].text);
        std::cout << "\n";
    }
}

void print_json(const std::vector<std::vector<Cell>>& rows) {
    std::cout << "[\n";
    for (size_t r = 0; r < rows.size(); ++r) {
        std::cout << "  {";
        for (size_t c = 0; c < rows[r].size(); ++c) {
            const Cell& cell = rows[r][c];
            const std::string value = cell.number ? (cell.text.empty() ? "null" : cell.text) : json_string(cell.text);
            std::cout << (c ? ", " : "") << "\"" << kColumns[c] << "\": " << value;
        }
        std::cout << (r + 1 < rows.size() ? "},\n" : "}\n");
    }
    std::cout << "]\n";
}

}  // namespace

int main(int argc, char** argv) {
    const Options options = parse_options(argc, argv);
    std::vector<std::vector<Cell>> rows;
    bool graph_noted = false;
    try {
        for (const Shape& shape : options.shapes) {
            const int64_t kv_heads = options.kv_heads >= 0 ? options.kv_heads : shape.heads;
            std::map<rope::Device, std::unique_ptr<Workload>> workloads;  // Built on first use.
            for (const std::string& name : options.backends) {
                const rope::BackendInfo info = rope::backend_info(name);
                const bool host = info.device == rope::Device::host;
                if (host && options.graph && !std::exchange(graph_noted, true))
                    std::cerr << "rope-bench: note: --graph applies to CUDA backends only; CPU backends are timed as always (timing = clock)\n";
                // GPU backends ignore threads: run them once, not once per thread count.
                const std::vector<int> thread_counts = host ? options.threads : std::vector<int>{0};
                for (int threads : thread_counts) {
                    Result result;
                    result.backend = name;
                    result.shape = shape;
                    result.kv_heads = kv_heads;
                    result.threads = host ? std::to_string(resolve_threads(threads)) : "-";
                    result.timing = host ? "clock" : options.graph ? "graph" : "events";
                    if (!info.available) result.not_run = "skipped: " + info.reason;
#if !ROPE_BENCH_CUDA
                    if (result.not_run.empty() && !host) result.not_run = "skipped: rope-bench built without CUDA timing";
#endif
                    if (result.not_run.empty()) {
                        std::unique_ptr<Workload>& workload = workloads[info.device];
                        if (!workload) workload = std::make_unique<Workload>(options, shape, kv_heads, info.device);
                        measure(*workload, info, resolve_threads(threads), result);
                    }
                    rows.push_back(cells_of(options, result));
                    if (options.format == "table") std::cerr << "done: " << name << " " << rows.back()[1].text << "\n";
                }
            }
        }
    } catch (const std::exception& error) {
        std::cerr << "rope-bench: " << error.what() << "\n";
        return 1;
    }
    if (options.format == "table") {
        const double cache_mb = options.llc_mb > 0 ? options.llc_mb : double(host_llc_bytes() >> 20);
        std::cout << "# " << host_cpu_model() << "; host cache to defeat " << cache_mb
                  << " MiB (sets span >= 2x); median per call after warm-up; bytes = (q + k elements) x 2 x dtype size;"
                  << " copy = parallel memcpy (host) or cudaMemcpyAsync D2D (GPU) of the same bytes"
                  << (options.graph ? "; GPU calls and copies replayed from one CUDA graph per measurement" : "") << "\n";
        print_table(rows);
    } else if (options.format == "csv") {
        print_csv(rows);
    } else {
        print_json(rows);
    }
    return 0;
}
