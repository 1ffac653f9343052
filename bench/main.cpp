// rope-bench: one benchmark program for every backend.
//
// RoPE is memory bound, so the question is how close a backend gets to the memory system's limit. For each
// backend, shape, position form and thread count, rope-bench reports the median time of one call, the bytes
// it moves (q and k each read once and written once), the bandwidth that implies, and that bandwidth as a
// percentage of a copy of the same bytes timed in the same run: the method, runs and ceilings included, is
// stated once in bench/timing/timing.hpp (and cuda_timing.hpp for the GPU). Here:
// - Inputs hold random non-zero values (no zero or denormal shortcuts), in enough sets of q and k to span
//   twice the host's last-level cache or the GPU's L2.
// - The clock times Backend::run on plans built beforehand: validation (rope::make_plan) and the copies of the
//   position arrays and of a cos/sin table to the device happen once per set, outside it. Backend::run trusts
//   its plan, so each backend's first call goes through rope::apply, which refuses what the backend does not
//   implement (e.g. --precise): its row says "unsupported: <why>" instead of timing something else.
// - Position forms (bench/forms.hpp) change what the positions are; the bytes moved, and so the ceiling, stay
//   those of q and k.
// - --op append (AppendWorkload, CUDA backends): RoPE fused with the paged KV-cache append against the same
//   work unfused (the backend's RoPE call, then append_baseline.cu's scatter), both against a copy of the
//   bytes the fused call moves; with --q-fp8 the fused call writes q in the caches' FP8 format (the bytes
//   FlashInfer's fused kernel writes for q), and the unfused pair, which has no such output, is not run.
// - --op qknorm (CUDA backends): the fused QK-RMSNorm + RoPE (rope::apply_qk_norm, per head, Llama-style weight)
//   against the same work as a user runs it unfused (qk_norm_baseline.cu's RMSNorm of q, then of k, then the
//   backend's RoPE call), both on the same sets and against the copy of the same q and k bytes.
// - --op rerotate (every backend): rope::rerotate of keys rotated at positions P + kRerotateShift, ... turned
//   to P, ... (a window shift after an eviction); the shape's H heads are the keys and the whole set (no q), so
//   the ceiling is a copy of the keys' bytes. Its plans come from rope::detail::make_rerotate_plan, the first
//   set going once through rope::rerotate as the first call of --op rope goes through rope::apply.
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <iomanip>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "forms.hpp"
#include "timing.hpp"
#include "options.hpp"
#include "report.hpp"
#include "rope/buffer.hpp"
#include "rope/cuda_check.hpp"
#include "rope/detail/plan.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "rope/detail/rerotate_plan.hpp"
#include "rope/qk_norm.hpp"
#include "rope/rerotate.hpp"
#include "rope/rope.hpp"
#if ROPE_BENCH_CUDA
#include "append_baseline.hpp"
#include "cuda_timing.hpp"
#include "qk_norm_baseline.hpp"
#include "rope/detail/kv_append_plan.hpp"
#endif
#if ROPE_BENCH_FLASHINFER
#include <cmath>

#include "append_flashinfer.hpp"
#endif
#if ROPE_BENCH_OPENMP
#include <omp.h>
#endif

namespace rope_bench {
namespace {

// --fp8-scale as typed back: nine significant digits, which read back as the same float.
std::string scale_text(float scale) {
    std::ostringstream text;
    text << std::setprecision(9) << scale;
    return text.str();
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
        uint64_t state = uint64_t(chunk) * 7919u + 1u;  // Seeded per chunk: the same data whatever the threads.
        for (int64_t i = chunk * kChunk; i < std::min(count, (chunk + 1) * kChunk); ++i) {
            const uint64_t bits = split_mix(state);
            const float magnitude = 0.25f + 0.75f * float(bits >> 40) / float(uint64_t(1) << 24);
            data[i] = rope::from_float<Storage>((bits & 1u) ? -magnitude : magnitude);
        }
    }
}

// A buffer of `bytes` on `device` holding random values of `dtype`.
rope::Buffer random_buffer(rope::Device device, rope::DType dtype, std::size_t bytes) {
    rope::Buffer buffer(device, bytes);
    const bool host = device == rope::Device::host;
    std::vector<char> staging(host ? 0 : bytes);
    void* fill_at = host ? buffer.data() : static_cast<void*>(staging.data());
    rope::dispatch_dtype(dtype, [&](auto storage) {
        fill_random(static_cast<decltype(storage)*>(fill_at), int64_t(bytes) / rope::dtype_size(dtype));
    });
    if (!host) buffer.copy_from_host(staging.data());
    return buffer;
}

// A copy of `values` on `device` (an empty buffer for no values).
template <typename Value>
rope::Buffer on_device(const std::vector<Value>& values, rope::Device device) {
    rope::Buffer buffer(device, values.size() * sizeof(Value));
    if (!values.empty()) buffer.copy_from_host(values.data());
    return buffer;
}

// The cache the sets of `device` must span twice: --llc-mb, else the host's last-level cache or the GPU's L2.
CacheSize cache_to_defeat(const Options& options, rope::Device device) {
    if (options.llc_mb > 0) return {std::size_t(options.llc_mb * double(1 << 20)), "--llc-mb"};
#if ROPE_BENCH_CUDA
    if (device != rope::Device::host) return {cuda_l2_bytes(), "cudaDevAttrL2CacheSize"};
#endif
    (void)device;
    return host_last_level_cache();
}

// One shape under one position form on one device: the rotating sets of q and k, the form's arrays on the
// device and one validated plan per set, all made before any clock runs. Shared by every backend and thread
// count that runs the shape on that device: gigabytes are allocated and filled once, not once per backend.
class Workload {
public:
    Workload(const Options& options, const Form& form, rope::Device device)
        : options_(options), device_(device), cache_(cache_to_defeat(options, device)), config_(form.config) {
        const std::size_t element_bytes = std::size_t(rope::dtype_size(options.dtype));
        const std::size_t q_bytes = std::size_t(form.batch * form.seq * form.q_heads * form.head_dim) * element_bytes;
        set_bytes_ = std::size_t(form.elements()) * element_bytes;
        stride_ = set_stride(set_bytes_);
        sets_ = sets_spanning_twice(set_bytes_, cache_.bytes);  // No call finds its inputs in cache.
        inputs_ = random_buffer(device, options.dtype, stride_ * std::size_t(sets_));
        if (!options.in_place) outputs_ = rope::Buffer(device, inputs_.bytes());
        cu_seqlens_ = on_device(form.cu_seqlens, device);
        ids_ = on_device(form.ids, device);
        table_ = on_device(form.cos_sin, device);
#if ROPE_BENCH_CUDA
        if (device != rope::Device::host) stream_ = std::make_unique<rope::CudaStream>();
#endif
        const rope::Positions positions = form.positions(static_cast<const int64_t*>(cu_seqlens_.data()),
                                                         static_cast<const int64_t*>(ids_.data()), device);
        auto view = [&](rope::Buffer& buffer, int64_t index, bool is_k) {
            char* at = static_cast<char*>(buffer.data()) + std::size_t(index) * stride_ + (is_k ? q_bytes : 0);
            return form.view(at, is_k ? form.k_heads : form.q_heads, options.dtype, device);
        };
        rope::Positions from = positions;  // --op rerotate: where the keys are rotated now.
        from.offset += kRerotateShift;
        for (int64_t index = 0; index < sets_; ++index) {
            if (options.op == "rerotate") {  // The keys are the form's q tensor (it has no k): the whole set.
                const rope::TensorView keys = view(inputs_, index, false);
                rope::RerotateArgs args =
                    options.in_place ? rope::RerotateArgs::in_place(keys, from, positions)
                                     : rope::RerotateArgs::out_of_place(keys, view(outputs_, index, false), from,
                                                                        positions);
#if ROPE_BENCH_CUDA
                if (stream_) args.stream = stream_->get();
#endif
                if (index == 0) first_rerotate_args_ = args;
                plans_.push_back(rope::detail::make_rerotate_plan(config_, args, device));
                continue;
            }
            const rope::TensorView q = view(inputs_, index, false), k = view(inputs_, index, true);
            rope::RopeArgs args = options.in_place
                                      ? rope::RopeArgs::in_place(q, k, positions)
                                      : rope::RopeArgs::out_of_place(q, k, view(outputs_, index, false),
                                                                     view(outputs_, index, true), positions);
            args.cos_sin_cache = form.cos_sin_cache(static_cast<const float*>(table_.data()), device);
#if ROPE_BENCH_CUDA
            if (stream_) args.stream = stream_->get();
#endif
            if (index == 0) first_args_ = args;
            plans_.push_back(rope::make_plan(config_, args, device));
            if (options.op == "qknorm") add_qk_norm_set(form, args);
        }
    }

    const CacheSize& cache() const { return cache_; }

    // `row` measured options.runs times with `backend`, or why the backend refuses the workload: the first set
    // once through rope::apply (--op rerotate: rope::rerotate), which checks what Backend::run trusts the plan for.
    Row measure_row(rope::Backend& backend, int threads, Row row) {
        try {
            if (options_.op == "rerotate")
                rope::rerotate(backend, config_, first_rerotate_args_);
            else
                rope::apply(backend, config_, first_args_);
        } catch (const rope::Error& error) {
            row.not_run = "unsupported: " + std::string(error.what());
            return row;
        }
        return timed_row(row, [&](int64_t c) { backend.run(plans_[std::size_t(c % sets_)]); }, threads);
    }

    // --op qknorm: the fused row and the unfused row of `backend`, each measured options.runs times, or the
    // row saying why it refuses the call (the first set once through rope::apply_qk_norm, as measure_row).
    std::vector<Row> measure_qk_norm_rows(rope::Backend& backend, Row row) {
        row.op = "qknorm";
        try {
            rope::apply_qk_norm(backend, config_, first_qk_args_);
        } catch (const rope::Error& error) {
            row.not_run = "unsupported: " + std::string(error.what());
            return {row};
        }
        const auto fused = [&](int64_t c) { backend.run_qk_norm(qk_plans_[std::size_t(c % sets_)]); };
        std::vector<Row> rows{timed_row(row, fused)};
        row.op = "qknorm-unfused";
#if ROPE_BENCH_CUDA
        const auto unfused = [&](int64_t c) {
            const std::size_t set = std::size_t(c % sets_);
            rms_norm_async(norms_[set][0], stream_->get());
            rms_norm_async(norms_[set][1], stream_->get());
            backend.run(plans_[set]);
        };
        try {  // The baseline's own limits (16-byte runs), and the backend's RoPE call, once.
            rope::apply(backend, config_, first_args_);
            unfused(0);
        } catch (const rope::Error& error) {
            row.not_run = "unsupported: " + std::string(error.what());
            rows.push_back(row);
            return rows;
        }
        rows.push_back(timed_row(row, unfused));
#else
        row.not_run = "skipped: rope-bench built without CUDA timing";
        rows.push_back(row);
#endif
        return rows;
    }

private:
    // `row` with the runs of `call` (call c works on set c % sets) against the copy ceiling of q and k.
    Row timed_row(Row row, const std::function<void(int64_t)>& call, int threads = 0) {
        std::vector<Measurement> runs;
        for (int run = 0; run < options_.runs; ++run) runs.push_back(measure(call, threads));
        row.summary = summarize(runs);
        row.sets = sets_;
        row.bytes = 2.0 * double(set_bytes_);  // Every element of q and k read once and written once.
        return row;
    }

    // --op qknorm: set `args`'s fused call (random norm weights of the dtype, one per operand, shared by the
    // sets) and its unfused steps' RMSNorm launches (in place on q and on k). What the library refuses is
    // reported per backend by measure_qk_norm_rows.
    void add_qk_norm_set(const Form& form, const rope::RopeArgs& args) {
        const std::size_t weight_bytes = std::size_t(form.head_dim * rope::dtype_size(options_.dtype));
        if (weights_[0].bytes() == 0)
            for (rope::Buffer& weight : weights_) weight = random_buffer(device_, options_.dtype, weight_bytes);
        rope::QkNormArgs qk = rope::QkNormArgs::in_place(args.q, args.k);
        qk.q_out = args.q_out;
        qk.k_out = args.k_out;
        qk.q_weight = {weights_[0].data(), options_.dtype, device_, form.head_dim};
        qk.k_weight = {weights_[1].data(), options_.dtype, device_, form.head_dim};
        qk.rounding = options_.rounding;
        qk.positions = args.positions;
        qk.cos_sin_cache = args.cos_sin_cache;
        qk.stream = args.stream;
        if (plans_.size() == 1) first_qk_args_ = qk;
        if (qk_plans_.size() + 1 < plans_.size()) return;  // The library refused set 0: nothing to time.
        try {
            qk_plans_.push_back(rope::make_qk_norm_plan(config_, qk, device_));
        } catch (const rope::Error&) {
            if (plans_.size() == 1) return;
            throw;
        }
#if ROPE_BENCH_CUDA
        std::array<NormRows, 2> norms;
        for (int which = 0; which < 2; ++which) {
            const rope::TensorView& view = which == 0 ? args.q : args.k;
            norms[std::size_t(which)] = {view.data, weights_[std::size_t(which)].data(),
                                         form.batch * form.seq * (which == 0 ? form.q_heads : form.k_heads),
                                         form.head_dim, options_.dtype, float(qk.eps)};
        }
        norms_.push_back(norms);
#endif
    }

    // One run: `call` on the rotating sets against the copy ceiling of the same bytes.
    Measurement measure(const std::function<void(int64_t)>& call, [[maybe_unused]] int threads) {
        if (copy_destination_.bytes() == 0) {
            copy_destination_ = rope::Buffer(device_, inputs_.bytes());
            if (device_ == rope::Device::host)
                std::memset(copy_destination_.data(), 0, copy_destination_.bytes());  // Fault the pages in now.
        }
        const Sets sets{inputs_.data(), copy_destination_.data(), set_bytes_, stride_, sets_};
        if (device_ == rope::Device::host) return host_measure(call, sets, threads, options_.reps);
#if ROPE_BENCH_CUDA
        return cuda_measure(call, options_.graph ? GpuClock::graph : GpuClock::events,
                            options_.reps > 0 ? options_.reps : kDefaultGpuReps, sets, stream_->get());
#else
        rope::fail("device", "cuda", "rope-bench was built without CUDA timing");
#endif
    }

    const Options& options_;
    rope::Device device_;
    CacheSize cache_;
    rope::RopeConfig config_;
    std::size_t set_bytes_ = 0;            // q and k of one set (--op rerotate: the keys alone).
    std::size_t stride_ = 0;               // From one set to the next (aligned).
    int64_t sets_ = 1;
    rope::Buffer inputs_, outputs_;        // The sets (q then k, each set at a multiple of stride_); --placement out.
    rope::Buffer copy_destination_;        // Where the ceiling copies to (allocated on first use).
    rope::Buffer cu_seqlens_, ids_, table_;  // The form's arrays, on the device.
    rope::RopeArgs first_args_;            // Set 0's call, for measure_row's check.
    rope::RerotateArgs first_rerotate_args_;  // --op rerotate: set 0's call, for measure_row's check.
    std::vector<rope::Plan> plans_;        // One per set (--op rerotate: its re-rotations).
    // --op qknorm: the norm weights (q's, k's), the fused call's args for set 0 and plans per set.
    std::array<rope::Buffer, 2> weights_;
    rope::QkNormArgs first_qk_args_;
    std::vector<rope::QkNormPlan> qk_plans_;
#if ROPE_BENCH_CUDA
    std::vector<std::array<NormRows, 2>> norms_;  // The unfused steps' RMSNorm of q and of k, per set.
#endif
#if ROPE_BENCH_CUDA
    std::unique_ptr<rope::CudaStream> stream_;   // GPU: the plans issue on it (graph capture needs a stream of its own).
#endif
};

#if ROPE_BENCH_CUDA
// --op append on one shape: B sequences of N new tokens (the thd tensors of the form, its cu_seqlens), each
// with [0, --context) tokens already cached, in NHD k and v caches of --page-size slots whose pages are
// handed out in a random order (a permuted page table). Set s of q, k and v is decode step s: its tokens go
// to the slots right after step s - 1's, so no call rewrites cache rows another left in L2. Per backend two
// rows, each against the copy ceiling of the bytes the fused call moves (q, k, v and the slots read; q, k and
// both cache rows written; a copy of X bytes reads and writes X, so the ceiling copies half of them):
// - append: Backend::run_kv_append on plans validated beforehand (the first through rope::append_kv, which
//   refuses what the backend does not take);
// - append-unfused: Backend::run (RoPE of q and k), then the baseline scatter of k and v into the same slots.
class AppendWorkload {
public:
    AppendWorkload(const Options& options, const Form& form)
        : options_(options), cache_(cache_to_defeat(options, rope::Device::cuda)), config_(form.config) {
        const rope::Device cuda = rope::Device::cuda;
        const std::size_t element = std::size_t(rope::dtype_size(options.dtype));
        tokens_ = form.batch * form.seq;
        q_bytes_ = std::size_t(tokens_ * form.q_heads * form.head_dim) * element;
        kv_bytes_ = std::size_t(tokens_ * form.k_heads * form.head_dim) * element;
        set_bytes_ = q_bytes_ + 2 * kv_bytes_;
        stride_ = set_stride(set_bytes_);
        sets_ = sets_spanning_twice(set_bytes_, cache_.bytes);
        inputs_ = random_buffer(cuda, options.dtype, stride_ * std::size_t(sets_));
        if (!options.in_place) outputs_ = rope::Buffer(cuda, inputs_.bytes());

        // The slots of every set, and the pages they need.
        std::vector<int64_t> bounds = form.cu_seqlens;
        if (bounds.empty()) bounds = {0, tokens_};
        const int64_t sequences = int64_t(bounds.size()) - 1, page_size = options.page_size;
        uint64_t state = 29;
        std::vector<int64_t> cached(static_cast<std::size_t>(sequences), 0);
        std::vector<int64_t> first_page(static_cast<std::size_t>(sequences) + 1, 0);  // Of each sequence's pages.
        for (std::size_t b = 0; b < cached.size(); ++b) {
            cached[b] = int64_t(split_mix(state) % uint64_t(options.context));
            first_page[b + 1] = first_page[b] + (cached[b] + sets_ * (bounds[b + 1] - bounds[b]) + page_size - 1) /
                                                    page_size;
        }
        const int64_t pages = first_page.back();
        std::vector<int64_t> order(static_cast<std::size_t>(pages), 0);
        for (std::size_t p = 0; p < order.size(); ++p) order[p] = int64_t(p);
        for (std::size_t p = order.size(); p > 1; --p)  // Fisher-Yates: the page table in a random order.
            std::swap(order[p - 1], order[std::size_t(split_mix(state) % uint64_t(p))]);
        std::vector<int64_t> slots(static_cast<std::size_t>(sets_ * tokens_), 0), places(slots.size(), 0);
        for (int64_t s = 0; s < sets_; ++s)
            for (std::size_t b = 0; b < cached.size(); ++b)
                for (int64_t t = bounds[b]; t < bounds[b + 1]; ++t) {
                    const int64_t position = cached[b] + s * (bounds[b + 1] - bounds[b]) + (t - bounds[b]);
                    places[std::size_t(s * tokens_ + t)] = position;
                    slots[std::size_t(s * tokens_ + t)] =
                        order[std::size_t(first_page[b] + position / page_size)] * page_size + position % page_size;
                }
        slots_ = on_device(slots, cuda);
        // The plain form's angle is each token's place in its sequence, as an engine passes it: int64 ids [T]
        // per set (other forms keep their positions).
        const bool place_ids = form.ids.empty() && form.cos_sin.empty() && form.axes == 1 && form.cp_size == 1;
        if (place_ids) places_ = on_device(places, cuda);
        const std::size_t cache_element = options.cache_dtype == rope::CacheDType::model ? element : 1;
        const std::size_t cache_bytes =
            std::size_t(pages * page_size * form.k_heads * form.head_dim) * cache_element;
        k_cache_ = rope::Buffer(cuda, cache_bytes);
        v_cache_ = rope::Buffer(cuda, cache_bytes);
#if ROPE_BENCH_FLASHINFER
        prepare_flashinfer(form, bounds, cached, first_page, order);  // After the caches: its calls write them.
#endif
        const float scale = options.fp8_scale;
        scales_ = on_device(std::vector<float>{scale, 2 * scale, scale}, cuda);  // k's, v's and q's.
        // --q-fp8: q is written once, in the caches' FP8 format, instead of in the model's dtype.
        const std::size_t q_written = options.q_fp8 ? q_bytes_ / element : q_bytes_;
        if (options.q_fp8) q_fp8_ = rope::Buffer(cuda, set_stride(q_written) * std::size_t(sets_));
        moved_ = double(set_bytes_ + q_written + kv_bytes_) + 8.0 * double(tokens_) +
                 2.0 * double(tokens_ * form.k_heads * form.head_dim) * double(cache_element);
        const std::size_t copy_bytes = std::size_t(moved_ / 2) / 16 * 16;
        copy_ = {nullptr, nullptr, copy_bytes, set_stride(copy_bytes), sets_};
        copy_source_ = rope::Buffer(cuda, copy_.stride * std::size_t(sets_));
        copy_destination_ = rope::Buffer(cuda, copy_.stride * std::size_t(sets_));
        copy_.inputs = copy_source_.data();
        copy_.copy_destination = copy_destination_.data();
        detail_ = (form.detail.empty() ? "" : form.detail + "; ") + std::to_string(sequences) + " sequences" +
                  (place_ids ? " (positions: each token's place in its sequence, int64 ids)" : "") + ", " +
                  std::to_string(pages) + " pages of " + std::to_string(page_size) + " slots in a random order, " +
                  "cache " + rope::cache_dtype_name(options.cache_dtype) + (options.q_fp8 ? ", q in FP8" : "") +
                  (options.fp8_scale != kDefaultFp8Scale ? ", k scale " + scale_text(options.fp8_scale) : "");

        cu_seqlens_ = on_device(form.cu_seqlens, cuda);
        ids_ = on_device(form.ids, cuda);
        table_ = on_device(form.cos_sin, cuda);
        const rope::Positions positions = form.positions(static_cast<const int64_t*>(cu_seqlens_.data()),
                                                         static_cast<const int64_t*>(ids_.data()), cuda);
        rope::PagedCache k_cache = rope::PagedCache::nhd(k_cache_.data(), cuda, pages, page_size, form.k_heads,
                                                         form.head_dim, options.cache_dtype);
        rope::PagedCache v_cache = rope::PagedCache::nhd(v_cache_.data(), cuda, pages, page_size, form.k_heads,
                                                         form.head_dim, options.cache_dtype);
        const float* scales = static_cast<const float*>(scales_.data());
        if (options.cache_dtype != rope::CacheDType::model) {
            k_cache = k_cache.with_scale(scales, 1);
            v_cache = v_cache.with_scale(scales + 1, 1);
        }
        for (int64_t s = 0; s < sets_; ++s) {
            auto view = [&](rope::Buffer& buffer, std::size_t offset, int64_t heads) {
                char* at = static_cast<char*>(buffer.data()) + std::size_t(s) * stride_ + offset;
                return form.view(at, heads, options.dtype, cuda);
            };
            rope::KvAppendArgs args;
            args.q = view(inputs_, 0, form.q_heads);
            args.k = view(inputs_, q_bytes_, form.k_heads);
            args.v = view(inputs_, q_bytes_ + kv_bytes_, form.k_heads);
            args.q_out = options.in_place || options.q_fp8 ? args.q : view(outputs_, 0, form.q_heads);
            args.k_out = options.in_place ? args.k : view(outputs_, q_bytes_, form.k_heads);
            args.positions = place_ids ? rope::Positions::shared(static_cast<const int64_t*>(places_.data()) +
                                                                      s * tokens_,
                                                                  tokens_, cuda)
                                       : positions;
            args.slot_mapping = {static_cast<const int64_t*>(slots_.data()) + s * tokens_, tokens_, cuda};
            args.k_cache = k_cache;
            args.v_cache = v_cache;
            args.cos_sin_cache = form.cos_sin_cache(static_cast<const float*>(table_.data()), cuda);
            args.stream = stream_.get();
            if (options.q_fp8)
                args.q_out_fp8 = rope::Fp8Output::dense(static_cast<char*>(q_fp8_.data()) + std::size_t(s) * set_stride(q_written),
                                                        cuda, tokens_, form.q_heads, form.head_dim, options.cache_dtype)
                                     .with_scale(scales + 2, 1);
            if (s == 0) first_args_ = args;
            rope::RopeArgs rope_args{args.q, args.k, args.q_out, args.k_out, args.positions, rope::Direction::forward,
                                     args.stream, args.cos_sin_cache};
            ScatterCall scatter;
            scatter.k = args.k_out.data;
            scatter.v = args.v.data;
            scatter.slots = args.slot_mapping.slots;
            scatter.tokens = tokens_;
            scatter.heads = form.k_heads;
            scatter.head_dim = form.head_dim;
            scatter.dtype = options.dtype;
            scatter.cache_dtype = options.cache_dtype;
            scatter.k_scale = scales;
            scatter.v_scale = scales + 1;
            scatter.k_cache = k_cache_.data();
            scatter.v_cache = v_cache_.data();
            scatter.page_size = page_size;
            scatter.stride_page = k_cache.stride_page;
            scatter.stride_slot = k_cache.stride_slot;
            scatter.stride_head = k_cache.stride_head;
            try {  // What the library refuses (e.g. a cache dtype) is reported per backend by measure_rows.
                plans_.push_back(rope::make_kv_append_plan(config_, args, cuda));
                rope_plans_.push_back(rope::make_plan(config_, rope_args, cuda));
            } catch (const rope::Error&) {
                if (s == 0) break;
                throw;
            }
            scatters_.push_back(scatter);
        }
    }

    const CacheSize& cache() const { return cache_; }

#if ROPE_BENCH_FLASHINFER
    // FlashInfer's rows beside rope's (append_flashinfer.hpp): its fused kernel (op append) and, into
    // model-dtype caches, its plain append of k and v (op append-cache-only), against the same ceiling.
    std::vector<Row> measure_flashinfer(Row row) {
        row.backend = "flashinfer";
        row.form_detail = detail_ + "; FlashInfer's angle: each token's place in its sequence, int32";
        std::vector<Row> rows;
        for (const bool fused : {true, false}) {
            Row measured = row;
            measured.op = fused ? "append" : "append-cache-only";
            // What the call does that rope's does not, since the ceiling counts rope's bytes: the fused kernel
            // writes q in the cache's type and no rotated k back to a live k; the plain append rotates nothing.
            measured.form_detail += !fused          ? "; FlashInfer copies k and v as they are, q untouched"
                                    : options_.q_fp8 ? "; FlashInfer writes no k_out"
                                                     : "; FlashInfer writes q_out in the cache's type and no k_out";
            auto issue = [&](int64_t c) {
                const FlashInferAppend& call = flashinfer_calls_[std::size_t(c % sets_)];
                if (fused) flashinfer_rope_append_async(call, stream_.get());
                else flashinfer_append_async(call, stream_.get());
            };
            try {
                issue(0);
                stream_.synchronize();
            } catch (const rope::Error& error) {
                measured.not_run = "unsupported: " + std::string(error.what());
                rows.push_back(measured);
                continue;
            }
            std::vector<Measurement> runs;
            for (int run = 0; run < options_.runs; ++run)
                runs.push_back(cuda_measure(issue, options_.graph ? GpuClock::graph : GpuClock::events,
                                            options_.reps > 0 ? options_.reps : kDefaultGpuReps, copy_,
                                            stream_.get()));
            measured.summary = summarize(runs);
            measured.sets = sets_;
            measured.bytes = moved_;
            rows.push_back(measured);
        }
        return rows;
    }
#endif

    // The fused row and the unfused row of `backend`, or the one row saying why it refuses the call.
    std::vector<Row> measure_rows(rope::Backend& backend, Row row) {
        row.form_detail = detail_;
        try {
            rope::append_kv(backend, config_, first_args_);
        } catch (const rope::Error& error) {
            row.op = "append";
            row.not_run = "unsupported: " + std::string(error.what());
            return {row};
        }
        const GpuClock clock = options_.graph ? GpuClock::graph : GpuClock::events;
        const int reps = options_.reps > 0 ? options_.reps : kDefaultGpuReps;
        const Launch fused = [&](int64_t c) { backend.run_kv_append(plans_[std::size_t(c % sets_)]); };
        const Launch unfused = [&](int64_t c) {
            backend.run(rope_plans_[std::size_t(c % sets_)]);
            scatter_kv_async(scatters_[std::size_t(c % sets_)], stream_.get());
        };
        std::vector<Row> rows;
        for (const auto& [op, launch] : {std::pair<const char*, const Launch*>{"append", &fused},
                                         {"append-unfused", &unfused}}) {
            Row measured = row;
            measured.op = op;
            if (launch == &unfused && options_.q_fp8) {
                measured.not_run = "unsupported: --q-fp8: the unfused pair (RoPE, then the scatter) writes no FP8 q";
                rows.push_back(measured);
                continue;
            }
            std::vector<Measurement> runs;
            for (int run = 0; run < options_.runs; ++run)
                runs.push_back(cuda_measure(*launch, clock, reps, copy_, stream_.get()));
            measured.summary = summarize(runs);
            measured.sets = sets_;
            measured.bytes = moved_;
            rows.push_back(measured);
        }
        return rows;
    }

private:
#if ROPE_BENCH_FLASHINFER
    // FlashInfer's page table of the same rows (indptr, indices), each token's sequence and position per set,
    // a cos/sin table of every position, and q_out in the cache's type.
    void prepare_flashinfer(const Form& form, const std::vector<int64_t>& bounds, const std::vector<int64_t>& cached,
                            const std::vector<int64_t>& first_page, const std::vector<int64_t>& order) {
        const rope::Device cuda = rope::Device::cuda;
        std::vector<int32_t> indptr(first_page.begin(), first_page.end()), indices(order.begin(), order.end());
        std::vector<int32_t> last_page_len, batch_indices(std::size_t(tokens_), 0);
        std::vector<int32_t> positions(std::size_t(sets_ * tokens_), 0);
        int64_t rows = 1;
        for (std::size_t b = 0; b + 1 < bounds.size(); ++b) {
            const int64_t length = bounds[b + 1] - bounds[b], filled = cached[b] + sets_ * length;
            last_page_len.push_back(int32_t((filled - 1) % options_.page_size + 1));
            rows = std::max(rows, filled);
            for (int64_t t = bounds[b]; t < bounds[b + 1]; ++t) {
                batch_indices[std::size_t(t)] = int32_t(b);
                for (int64_t s = 0; s < sets_; ++s)
                    positions[std::size_t(s * tokens_ + t)] = int32_t(cached[b] + s * length + (t - bounds[b]));
            }
        }
        // Indices hold every sequence's pages in table order: entry first_page[b] + j is page j of sequence b.
        for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = int32_t(order[i]);
        const int64_t half = form.head_dim / 2;
        std::vector<float> cos_sin(std::size_t(rows * form.head_dim));
        for (int64_t p = 0; p < rows; ++p)
            for (int64_t i = 0; i < half; ++i) {
                const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / double(form.head_dim));
                cos_sin[std::size_t(p * form.head_dim + i)] = float(std::cos(angle));
                cos_sin[std::size_t(p * form.head_dim + half + i)] = float(std::sin(angle));
            }
        fi_indptr_ = on_device(indptr, cuda);
        fi_indices_ = on_device(indices, cuda);
        fi_last_page_len_ = on_device(last_page_len, cuda);
        fi_batch_indices_ = on_device(batch_indices, cuda);
        fi_positions_ = on_device(positions, cuda);
        fi_cos_sin_ = on_device(cos_sin, cuda);
        const std::size_t cache_element = options_.cache_dtype == rope::CacheDType::model
                                              ? std::size_t(rope::dtype_size(options_.dtype))
                                              : 1;
        const std::size_t q_out_bytes = std::size_t(tokens_ * form.q_heads * form.head_dim) * cache_element;
        fi_q_out_ = rope::Buffer(cuda, set_stride(q_out_bytes) * std::size_t(sets_));
        for (int64_t s = 0; s < sets_; ++s) {
            FlashInferAppend call;
            char* set = static_cast<char*>(inputs_.data()) + std::size_t(s) * stride_;
            call.q = set;
            call.k = set + q_bytes_;
            call.v = set + q_bytes_ + kv_bytes_;
            call.q_out = static_cast<char*>(fi_q_out_.data()) + std::size_t(s) * set_stride(q_out_bytes);
            call.k_cache = k_cache_.data();
            call.v_cache = v_cache_.data();
            call.indptr = static_cast<const int32_t*>(fi_indptr_.data());
            call.indices = static_cast<const int32_t*>(fi_indices_.data());
            call.last_page_len = static_cast<const int32_t*>(fi_last_page_len_.data());
            call.batch_indices = static_cast<const int32_t*>(fi_batch_indices_.data());
            call.positions = static_cast<const int32_t*>(fi_positions_.data()) + s * tokens_;
            call.cos_sin_cache = static_cast<const float*>(fi_cos_sin_.data());
            call.tokens = uint32_t(tokens_);
            call.q_heads = uint32_t(form.q_heads);
            call.kv_heads = uint32_t(form.k_heads);
            call.head_dim = uint32_t(form.head_dim);
            call.page_size = uint32_t(options_.page_size);
            call.sequences = uint32_t(bounds.size() - 1);
            call.dtype = options_.dtype;
            call.cache_dtype = options_.cache_dtype;
            call.interleave = options_.style == rope::Style::interleaved;
            // FlashInfer multiplies by quant_scale = 1 / scale (one scale for k and v).
            call.quant_scale = options_.cache_dtype == rope::CacheDType::model ? 1.0f : 1.0f / options_.fp8_scale;
            flashinfer_calls_.push_back(call);
        }
    }
    rope::Buffer fi_indptr_, fi_indices_, fi_last_page_len_, fi_batch_indices_, fi_positions_, fi_cos_sin_, fi_q_out_;
    std::vector<FlashInferAppend> flashinfer_calls_;
#endif

    const Options& options_;
    CacheSize cache_;
    rope::RopeConfig config_;
    int64_t tokens_ = 0;
    std::size_t q_bytes_ = 0, kv_bytes_ = 0, set_bytes_ = 0, stride_ = 0;  // A set: q, then k, then v.
    int64_t sets_ = 1;
    double moved_ = 0;  // Bytes the fused call moves.
    Sets copy_;         // The ceiling's copies: half of moved_, set by set.
    std::string detail_;
    rope::Buffer inputs_, outputs_, slots_, places_, k_cache_, v_cache_, scales_, copy_source_, copy_destination_;
    rope::Buffer q_fp8_;  // --q-fp8: each set's FP8 q output.
    rope::Buffer cu_seqlens_, ids_, table_;
    rope::CudaStream stream_;
    rope::KvAppendArgs first_args_;
    std::vector<rope::KvAppendPlan> plans_;
    std::vector<rope::Plan> rope_plans_;
    std::vector<ScatterCall> scatters_;
};
#endif

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

// The lines above a table: the machine, the caches the sets defeat, the method.
std::string preamble(const Options& options, const std::map<rope::Device, std::string>& caches) {
    std::ostringstream text;
    text << "# " << host_cpu_model();
#if ROPE_BENCH_CUDA
    if (caches.count(rope::Device::cuda)) text << "; " << cuda_device_name();
#endif
    for (const auto& [device, cache] : caches)
        text << "; " << (device == rope::Device::host ? "host" : "GPU") << " cache to defeat: " << cache;
    text << "\n# median per call (sets span >= 2x that cache); bytes = (q + k elements) x 2 x dtype size; ceiling ="
         << " the fastest copy of the same bytes (host: memcpy or in-place read-modify-write; GPU: cudaMemcpyAsync or"
         << " a 16-byte copy kernel, back to back or from a CUDA graph)";
    if (options.op == "rerotate") text << "; --op rerotate: the shape's H heads are the keys, and there is no q";
    if (options.runs > 1) text << "; " << options.runs << " runs: the median ratio, and its min and max";
    return text.str();
}

// The rows of every shape, backend and thread count (printed by main).
std::vector<Row> measure_all(const Options& options, std::map<rope::Device, std::string>& caches) {
    std::vector<Row> rows;
    bool graph_noted = false;
    for (const Shape& shape : options.shapes) {
        const int64_t kv_heads = options.kv_heads >= 0 ? options.kv_heads : shape.heads;
        const Form form = make_form(options, shape, kv_heads);
        Row shape_row;  // What every row of this shape shares.
        shape_row.shape = shape.text();
        shape_row.kv_heads = kv_heads;
        shape_row.dtype = rope::dtype_name(options.dtype);
        shape_row.style = rope::style_name(options.style);
        shape_row.layout = rope::layout_name(options.layout);
        shape_row.placement = options.in_place ? "in" : "out";
        shape_row.precise = options.precise;
        shape_row.position_offset = options.position_offset;
        shape_row.form = form.name;
        shape_row.form_detail = form.detail;
        if (options.op == "append") shape_row.cache_dtype = rope::cache_dtype_name(options.cache_dtype);
        if (options.op == "rerotate") {
            shape_row.op = "rerotate";
            shape_row.precise = true;  // rope::rerotate always takes the precise angle path.
            shape_row.form_detail = "keys from " + std::to_string(form.offset + kRerotateShift) + ".. to " +
                                    std::to_string(form.offset) + ".." +
                                    (form.detail.empty() ? "" : "; " + form.detail);
        }
        std::map<rope::Device, std::unique_ptr<Workload>> workloads;  // Built on first use.
#if ROPE_BENCH_CUDA
        std::unique_ptr<AppendWorkload> append;  // --op append: built on first use.
#endif
        for (const std::string& name : options.backends) {
            const rope::BackendInfo info = rope::backend_info(name);
            const bool host = info.device == rope::Device::host;
            if (host && options.graph && !std::exchange(graph_noted, true))
                std::cerr << "rope-bench: note: --graph applies to CUDA backends only; CPU backends are timed "
                             "as always (timing = clock)\n";
            // GPU backends ignore threads: run them once, not once per thread count.
            for (int threads : host ? options.threads : std::vector<int>{0}) {
                Row row = shape_row;
                row.backend = name;
                row.threads = host ? std::to_string(resolve_threads(threads)) : "-";
                row.timing = host ? "clock" : options.graph ? "graph" : "events";
                if (!info.available) row.not_run = "skipped: " + info.reason;
#if !ROPE_BENCH_CUDA
                if (row.not_run.empty() && !host) row.not_run = "skipped: rope-bench built without CUDA timing";
#endif
                if (options.op == "append") row.op = "append";
                if (row.not_run.empty() && options.op == "append" && host)
                    row.not_run = "unsupported: --op append is measured on CUDA backends";
#if ROPE_BENCH_CUDA
                if (row.not_run.empty() && options.op == "append") {
                    if (!append) append = std::make_unique<AppendWorkload>(options, form);
                    caches[info.device] = std::to_string(append->cache().bytes >> 20) + " MiB (" +
                                          append->cache().source + ")";
                    row.cache = caches[info.device];
                    const std::unique_ptr<rope::Backend> backend = rope::make_backend(name);
                    for (const Row& measured : append->measure_rows(*backend, row)) rows.push_back(measured);
                    if (options.format == "table") std::cerr << "done: " << name << " " << row.shape << "\n";
                    continue;
                }
#endif
                if (options.op == "qknorm") row.op = "qknorm";
                if (row.not_run.empty() && options.op == "qknorm" && host)
                    row.not_run = "unsupported: --op qknorm is measured on CUDA backends";
                if (row.not_run.empty()) {
                    std::unique_ptr<Workload>& workload = workloads[info.device];
                    if (!workload) workload = std::make_unique<Workload>(options, form, info.device);
                    caches[info.device] = std::to_string(workload->cache().bytes >> 20) + " MiB (" +
                                          workload->cache().source + ")";
                    row.cache = caches[info.device];
                    rope::BackendOptions backend_options;
                    backend_options.threads = resolve_threads(threads);
                    const std::unique_ptr<rope::Backend> backend = rope::make_backend(name, backend_options);
                    if (options.op == "qknorm") {
                        for (const Row& measured : workload->measure_qk_norm_rows(*backend, row))
                            rows.push_back(measured);
                        if (options.format == "table") std::cerr << "done: " << name << " " << row.shape << "\n";
                        continue;
                    }
                    row = workload->measure_row(*backend, backend_options.threads, row);
                }
                rows.push_back(row);
                if (options.format == "table") std::cerr << "done: " << name << " " << row.shape << "\n";
            }
        }
#if ROPE_BENCH_FLASHINFER
        if (options.op == "append") {  // FlashInfer beside rope, in the same run (a build with its headers).
            Row row = shape_row;
            row.backend = "flashinfer";
            row.op = "append";
            row.threads = "-";
            row.timing = options.graph ? "graph" : "events";
            const rope::BackendInfo cuda = rope::backend_info("cuda-naive");
            if (!cuda.available) {
                row.not_run = "skipped: " + cuda.reason;
                rows.push_back(row);
                continue;
            }
            if (!append) append = std::make_unique<AppendWorkload>(options, form);
            row.cache = std::to_string(append->cache().bytes >> 20) + " MiB (" + append->cache().source + ")";
            for (const Row& measured : append->measure_flashinfer(row)) rows.push_back(measured);
        }
#endif
    }
    return rows;
}

}  // namespace
}  // namespace rope_bench

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
    std::map<rope::Device, std::string> caches;  // For the preamble: what each device's sets defeat.
    try {
        const std::vector<rope_bench::Row> rows = rope_bench::measure_all(options, caches);
        rope_bench::write_rows(std::cout, rows, options.format, rope_bench::preamble(options, caches));
        if (!std::cout.flush()) {  // E.g. a full disk: the results are lost, so the run failed.
            std::cerr << "rope-bench: writing the results to standard output failed\n";
            return 1;
        }
    } catch (const rope_bench::UsageError& error) {
        std::cerr << "rope-bench: " << error.what() << "\n";
        return 2;
    } catch (const std::bad_alloc&) {
        std::cerr << "rope-bench: out of host memory for the q and k sets of these shapes\n";
        return 1;
    } catch (const std::exception& error) {
        std::cerr << "rope-bench: " << error.what() << "\n";
        return 1;
    }
    return 0;
}
