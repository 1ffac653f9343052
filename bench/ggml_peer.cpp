// rope-ggml-bench: ggml's CPU rope (ggml_rope_ext, the rope inside llama.cpp) beside cpu-eigen on the
// same bytes, in one process, by rope-bench's host method (bench/timing: rotating sets spanning twice
// the last-level cache, medians, the faster of a memcpy and an in-place read-modify-write of the same
// bytes as the ceiling). Built only where a ggml build is installed (bench/CMakeLists.txt); ggml is
// used as installed, never copied here.
//
//   rope-ggml-bench --shape B,H,S,D [--dtype fp32|fp16] [--style neox|gptj] [--placement in|out]
//                   [--threads N] [--runs N] [--reps N]
//
// q and k have H heads each, in ggml's own layout ([D, H, S, B] in ggml's order of dimensions: [b, s, h, d]
// in rope's, bshd), positions 0..S-1 shared by the batch, base 10000, rotary_dim = D. Before timing, both
// rotate set 0 and the largest difference between them is printed (ggml forms theta_i by repeated float
// multiplication, rope as a power: they differ in the last bits at large positions). Then each run times
// ggml and cpu-eigen in turn (runs alternate, so the machine's drift falls on both), each against its own
// ceiling in that run. Prints one CSV row per implementation, as rope-bench --format csv does, with
// vs_ggml: cpu-eigen's % of the ceiling / ggml's, the median over the run pairs (1.00 on ggml's row).
#include <ggml-cpu.h>
#include <ggml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "rope/detail/plan.hpp"
#include "rope/rope.hpp"
#include "timing.hpp"

namespace {

using rope_bench::Measurement;

struct Options {
    std::vector<int64_t> shape;  // B, H, S, D.
    std::string dtype = "fp32", style = "neox", placement = "in";
    int threads = 2, runs = 3, reps = 0;
};

// One set: ggml's graph over the set's memory (q then k, each [D, H, S, B]) and rope's plan over the same.
struct GgmlSet {
    ggml_context* context = nullptr;
    ggml_cgraph* graph = nullptr;
};

class Peer {
public:
    explicit Peer(const Options& options) : options_(options) {
        batch_ = options.shape[0], heads_ = options.shape[1], seq_ = options.shape[2], dim_ = options.shape[3];
        fp16_ = options.dtype == "fp16";
        const std::size_t element = fp16_ ? 2 : 4;
        tensor_bytes_ = std::size_t(batch_ * heads_ * seq_ * dim_) * element;
        set_bytes_ = 2 * tensor_bytes_;
        stride_ = rope_bench::set_stride(set_bytes_);
        cache_ = rope_bench::host_last_level_cache();
        sets_ = rope_bench::sets_spanning_twice(set_bytes_, cache_.bytes);
        inputs_.resize(stride_ * std::size_t(sets_));
        copies_.resize(inputs_.size());
        if (options.placement == "out") outputs_.resize(inputs_.size());
        fill_random();
        positions_.resize(std::size_t(seq_));
        for (int64_t s = 0; s < seq_; ++s) positions_[std::size_t(s)] = int32_t(s);
        build_ggml();
        build_rope();
    }
    ~Peer() {
        for (GgmlSet& set : ggml_sets_) ggml_free(set.context);
        if (threadpool_ != nullptr) ggml_threadpool_free(threadpool_);
    }

    // The largest difference between ggml's and rope's rotation of set 0, over q (both from the same inputs).
    double largest_difference() {
        const std::vector<unsigned char> original(inputs_.begin(), inputs_.begin() + std::ptrdiff_t(set_bytes_));
        run_ggml(0);
        const std::vector<float> by_ggml = q_as_float(0);
        std::memcpy(inputs_.data(), original.data(), set_bytes_);
        run_rope(0);
        const std::vector<float> by_rope = q_as_float(0);
        std::memcpy(inputs_.data(), original.data(), set_bytes_);
        double largest = 0;
        for (std::size_t i = 0; i < by_ggml.size(); ++i)
            largest = std::max(largest, double(std::fabs(by_ggml[i] - by_rope[i])));
        return largest;
    }

    Measurement measure_ggml() { return measure([this](int64_t c) { run_ggml(c % sets_); }); }
    Measurement measure_rope() { return measure([this](int64_t c) { run_rope(c % sets_); }); }

    int64_t sets() const { return sets_; }
    std::size_t set_bytes() const { return set_bytes_; }
    const rope_bench::CacheSize& cache() const { return cache_; }

private:
    void fill_random() {
        std::mt19937 generator(7);
        std::uniform_real_distribution<float> value(-1.0f, 1.0f);
        const std::size_t elements = inputs_.size() / (fp16_ ? 2 : 4);
        for (std::size_t i = 0; i < elements; ++i) {
            const float x = value(generator);
            if (fp16_) {
                const uint16_t half = rope::to_float16(x).bits;
                std::memcpy(inputs_.data() + 2 * i, &half, 2);
            } else {
                std::memcpy(inputs_.data() + 4 * i, &x, 4);
            }
        }
        std::memset(copies_.data(), 0, copies_.size());  // Fault the pages in before any clock runs.
        if (!outputs_.empty()) std::memset(outputs_.data(), 0, outputs_.size());
    }

    unsigned char* at(std::vector<unsigned char>& buffer, int64_t set, bool is_k) {
        return buffer.data() + std::size_t(set) * stride_ + (is_k ? tensor_bytes_ : 0);
    }

    // One graph per set, its tensors placed on the set's memory (no_alloc: ggml allocates nothing).
    void build_ggml() {
        ggml_threadpool_params params = ggml_threadpool_params_default(options_.threads);
        threadpool_ = ggml_threadpool_new(&params);
        const int mode = options_.style == "neox" ? GGML_ROPE_TYPE_NEOX : 0;
        const ggml_type type = fp16_ ? GGML_TYPE_F16 : GGML_TYPE_F32;
        for (int64_t set = 0; set < sets_; ++set) {
            ggml_init_params init{/*mem_size=*/16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr,
                                  /*no_alloc=*/true};
            GgmlSet ggml_set{ggml_init(init), nullptr};
            ggml_tensor* positions = ggml_new_tensor_1d(ggml_set.context, GGML_TYPE_I32, seq_);
            positions->data = positions_.data();
            ggml_set.graph = ggml_new_graph(ggml_set.context);
            for (bool is_k : {false, true}) {
                ggml_tensor* x = ggml_new_tensor_4d(ggml_set.context, type, dim_, heads_, seq_, batch_);
                x->data = at(inputs_, set, is_k);
                ggml_tensor* rotated =
                    options_.placement == "in"
                        ? ggml_rope_ext_inplace(ggml_set.context, x, positions, nullptr, int(dim_), mode, 0, 10000.0f,
                                                1.0f, 0.0f, 1.0f, 32.0f, 1.0f)
                        : ggml_rope_ext(ggml_set.context, x, positions, nullptr, int(dim_), mode, 0, 10000.0f, 1.0f,
                                        0.0f, 1.0f, 32.0f, 1.0f);
                if (options_.placement == "out") rotated->data = at(outputs_, set, is_k);
                ggml_build_forward_expand(ggml_set.graph, rotated);
            }
            ggml_sets_.push_back(ggml_set);
        }
        const ggml_cplan plan = ggml_graph_plan(ggml_sets_[0].graph, options_.threads, threadpool_);
        work_.resize(std::max<std::size_t>(plan.work_size, 1));
    }

    void run_ggml(int64_t set) {
        ggml_cplan plan = ggml_graph_plan(ggml_sets_[std::size_t(set)].graph, options_.threads, threadpool_);
        plan.work_data = work_.data();
        if (ggml_graph_compute(ggml_sets_[std::size_t(set)].graph, &plan) != GGML_STATUS_SUCCESS)
            rope::fail("ggml_graph_compute", "set " + std::to_string(set), "failed");
    }

    void build_rope() {
        config_.head_dim = dim_;
        config_.rotary_dim = dim_;
        config_.base = 10000.0;
        config_.style = options_.style == "neox" ? rope::Style::half_split : rope::Style::interleaved;
        backend_ = rope::make_backend("cpu-eigen", rope::BackendOptions{options_.threads});
        const rope::DType dtype = fp16_ ? rope::DType::f16 : rope::DType::f32;
        const std::array<int64_t, 4> sizes{batch_, seq_, heads_, dim_};
        auto view = [&](std::vector<unsigned char>& buffer, int64_t set, bool is_k) {
            return rope::TensorView::contiguous(at(buffer, set, is_k), dtype, rope::Device::host, rope::Layout::bshd,
                                                sizes);
        };
        for (int64_t set = 0; set < sets_; ++set) {
            const rope::RopeArgs args =
                options_.placement == "in"
                    ? rope::RopeArgs::in_place(view(inputs_, set, false), view(inputs_, set, true), {})
                    : rope::RopeArgs::out_of_place(view(inputs_, set, false), view(inputs_, set, true),
                                                   view(outputs_, set, false), view(outputs_, set, true), {});
            if (set == 0) rope::apply(*backend_, config_, args);  // Checks what Backend::run trusts the plan for.
            plans_.push_back(rope::make_plan(config_, args, rope::Device::host));
        }
    }

    void run_rope(int64_t set) { backend_->run(plans_[std::size_t(set)]); }

    // q of set @p set as floats, from wherever the call wrote it.
    std::vector<float> q_as_float(int64_t set) {
        const unsigned char* q = options_.placement == "in" ? at(inputs_, set, false) : at(outputs_, set, false);
        const std::size_t elements = tensor_bytes_ / (fp16_ ? 2 : 4);
        std::vector<float> values(elements);
        for (std::size_t i = 0; i < elements; ++i) {
            if (fp16_) {
                uint16_t bits;
                std::memcpy(&bits, q + 2 * i, 2);
                values[i] = rope::to_float(rope::float16{bits});
            } else {
                std::memcpy(&values[i], q + 4 * i, 4);
            }
        }
        return values;
    }

    Measurement measure(const std::function<void(int64_t)>& call) {
        const rope_bench::Sets sets{inputs_.data(), copies_.data(), set_bytes_, stride_, sets_};
        return rope_bench::host_measure(call, sets, options_.threads, options_.reps);
    }

    const Options& options_;
    int64_t batch_ = 0, heads_ = 0, seq_ = 0, dim_ = 0;
    bool fp16_ = false;
    std::size_t tensor_bytes_ = 0, set_bytes_ = 0, stride_ = 0;
    rope_bench::CacheSize cache_;
    int64_t sets_ = 1;
    std::vector<unsigned char> inputs_, copies_, outputs_, work_;
    std::vector<int32_t> positions_;
    std::vector<GgmlSet> ggml_sets_;
    ggml_threadpool* threadpool_ = nullptr;
    rope::RopeConfig config_;
    std::unique_ptr<rope::Backend> backend_;
    std::vector<rope::Plan> plans_;
};

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string text;
    for (int64_t size : shape) text += (text.empty() ? "" : ",") + std::to_string(size);
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"ggml's CPU rope beside cpu-eigen, by rope-bench's host method (bench/ggml_peer.cpp)"};
    Options options;
    app.add_option("--shape", options.shape, "B,H,S,D: batch, heads of q and of k, tokens, head_dim")
        ->delimiter(',')
        ->expected(4)
        ->required()
        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("--dtype", options.dtype, "fp32 or fp16 (ggml has no bf16 rope on the CPU)")
        ->check(CLI::IsMember({"fp32", "fp16"}));
    app.add_option("--style", options.style, "neox (half-split) or gptj (interleaved)")
        ->check(CLI::IsMember({"neox", "gptj"}));
    app.add_option("--placement", options.placement, "in (in place) or out")->check(CLI::IsMember({"in", "out"}));
    app.add_option("--threads", options.threads, "threads of both")->check(CLI::Range(1, 1024));
    app.add_option("--runs", options.runs, "run pairs (ggml, then cpu-eigen)")->check(CLI::Range(1, 99));
    app.add_option("--reps", options.reps, "timed repetitions per run; 0: about one second")->check(CLI::Range(0, 100000));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
        return app.exit(error) == 0 ? 0 : 2;  // --help: 0; a refused option: 2, as rope-bench.
    }
    if (options.shape[3] % 2 != 0) {
        std::fprintf(stderr, "rope-ggml-bench: --shape's D = %lld: must be even\n", (long long)options.shape[3]);
        return 2;
    }
    const double elements = double(options.shape[0]) * double(options.shape[1]) * double(options.shape[2]) *
                            double(options.shape[3]);
    if (elements * 2 * (options.dtype == "fp16" ? 2 : 4) > double(int64_t(1) << 32)) {
        std::fprintf(stderr, "rope-ggml-bench: --shape %s: q and k above 4 GiB\n", shape_text(options.shape).c_str());
        return 2;
    }
    try {
        Peer peer(options);
        std::fprintf(stderr, "rope-ggml-bench: %lld set(s) spanning twice %s; largest |ggml - cpu-eigen| over q: %.3g\n",
                     (long long)peer.sets(), peer.cache().source.c_str(), peer.largest_difference());
        std::vector<Measurement> ggml_runs, rope_runs;
        std::vector<double> ratios;
        for (int run = 0; run < options.runs; ++run) {
            ggml_runs.push_back(peer.measure_ggml());
            rope_runs.push_back(peer.measure_rope());
            ratios.push_back(rope_runs.back().percent_of_copy() / ggml_runs.back().percent_of_copy());
        }
        const double vs_ggml = rope_bench::median(ratios);
        std::printf("backend,shape,kv_heads,dtype,style,layout,placement,threads,sets,median_us,GBps,copy_GBps,"
                    "pct_of_copy,runs,pct_min,pct_max,ceiling,ceilings,cache,vs_ggml\n");
        const double bytes = 2.0 * double(peer.set_bytes());
        for (const auto& [name, runs, ratio] :
             {std::tuple{std::string("ggml"), ggml_runs, 1.0}, std::tuple{std::string("cpu-eigen"), rope_runs, vs_ggml}}) {
            const rope_bench::Summary summary = rope_bench::summarize(runs);
            const Measurement& m = summary.reported;
            std::printf("%s,\"%s\",%lld,%s,%s,bshd,%s,%d,%lld,%.1f,%.1f,%.1f,%.1f,%d,%.1f,%.1f,%s,%s,%s,%.2f\n",
                        name.c_str(), shape_text(options.shape).c_str(), (long long)options.shape[1],
                        options.dtype.c_str(), options.style.c_str(), options.placement.c_str(), options.threads,
                        (long long)peer.sets(), m.call_us, bytes / m.call_us / 1e3, bytes / m.ceiling.us / 1e3,
                        m.percent_of_copy(), summary.runs, summary.pct_min, summary.pct_max, m.ceiling.name.c_str(),
                        m.ceiling.describe().c_str(), peer.cache().source.c_str(), ratio);
        }
    } catch (const rope::Error& error) {
        std::fprintf(stderr, "rope-ggml-bench: %s\n", error.what());
        return 1;
    }
    return 0;
}
