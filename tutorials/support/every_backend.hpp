#pragma once
// What chapters 8 to 12, 16 and 17 share: one rope call on one backend from host vectors
// (the tensors, ids, cu_seqlens and table copied to the backend's memory, the
// outputs poisoned with NaN so an element never written shows), the same call
// on every backend available here, and the comparison with the float64 formula
// (tutorial.hpp's rope_float64) at the tolerances those chapters state.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace tutorial {

// float32 angles at positions below 200 carry errors near position * 6e-8 radians
// (chapter 7): relative L2 errors of 1e-7 to 1e-6. Every bug these chapters show
// is off by 1e-4 (an fp16 table) to 1.
constexpr double kRelTolerance = 4e-6;
constexpr double kAbsTolerance = 4e-5;

/// How far a float32 result is from float64 (a NaN anywhere makes it fail).
struct Distance {
    double rel_l2 = 0, max_abs = 0;
    bool within() const { return rel_l2 < kRelTolerance && max_abs < kAbsTolerance; }
    std::string text() const { return "rel L2 " + sci(rel_l2, 1) + ", max abs " + sci(max_abs, 1); }
};

inline Distance distance(const std::vector<float>& got, const std::vector<double>& want) {
    return {relative_l2(got, want), max_abs_difference(got, want)};
}

/// q and k of one call, on the host, token after token: q is [tokens, q_heads,
/// head_dim], k [tokens, k_heads, head_dim]. Stored as bshd [batch, seq, heads,
/// head_dim], or as one packed thd tensor [seq, heads, head_dim].
struct Tensors {
    int64_t batch = 1, seq = 0;  ///< Packed: batch 1 and seq = total tokens.
    int64_t q_heads = 0, k_heads = 0, head_dim = 0;
    bool packed = false;
    std::vector<float> q, k;
};

/// Random q and k (never zeros: an unrotated zero looks rotated).
inline Tensors random_tensors(int64_t batch, int64_t seq, int64_t q_heads, int64_t k_heads, int64_t head_dim,
                              bool packed, uint32_t seed) {
    Tensors t{batch, seq, q_heads, k_heads, head_dim, packed, {}, {}};
    t.q = random_values(size_t(batch * seq * q_heads * head_dim), seed);
    t.k = random_values(size_t(batch * seq * k_heads * head_dim), seed + 1000);
    return t;
}

/// Host copies of what a call's positions read. run() copies the arrays to
/// the backend's memory and builds rope::Positions from those copies.
struct PositionArrays {
    int64_t offset = 0;
    std::vector<int64_t> ids{};  ///< Explicit ids [axes, seq], shared by the batch; empty: none.
    int64_t axes = 1;
    std::vector<int64_t> cu_seqlens{};  ///< Packed sequences; empty: none.
    std::vector<int64_t> starts{};      ///< First position of each packed sequence; empty: 0 (or offset).
    int64_t cp_size = 1, cp_rank = 0;
};

/// The float64 formula of @p config at the positions @p arrays describe (unsharded),
/// optionally reading cos and sin from @p table: q's (`heads` = in.q_heads) or k's.
inline std::vector<double> reference(const std::vector<float>& x, int64_t heads, const Tensors& in,
                                     const rope::RopeConfig& config, const PositionArrays& arrays,
                                     const std::vector<float>* table = nullptr) {
    Formula f = Formula::of(config);
    f.layout = rope::Layout::bshd;  // thd is bshd with batch 1.
    f.offset = arrays.offset;
    if (!arrays.ids.empty()) f.ids = &arrays.ids, f.id_axes = arrays.axes;
    if (!arrays.cu_seqlens.empty()) f.cu_seqlens = &arrays.cu_seqlens;
    if (!arrays.starts.empty()) f.starts = &arrays.starts;
    f.table = table;
    return rope_float64(x, Shape{in.batch, heads, in.seq, in.head_dim}, f);
}

/// What a call left in its outputs, and the rope::Error's message if it was refused.
struct Outcome {
    std::vector<float> q, k;
    std::string error;
};

/// The outputs start as quiet NaN, so an element a backend never writes is visible.
inline const float kPoison = std::nanf("");

/// Copies `values` into memory of `device` (a plain host copy for CPU backends).
template <typename T>
rope::Buffer on_device(rope::Device device, const std::vector<T>& values) {
    rope::Buffer buffer(device, values.size() * sizeof(T));
    buffer.copy_from_host(values.data());
    return buffer;
}

/// Rotates `in` out of place on `backend`, with the positions `arrays`
/// describe and, if `table` is not empty, that cos/sin table ([rows,
/// rotary_dim], float32). Everything goes through the backend's memory, so a
/// CUDA backend gets device copies of the tensors, ids and table.
inline Outcome run(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& in,
                   const PositionArrays& arrays, const std::vector<float>& table = {}) {
    const rope::Device device = backend.device();
    const rope::Buffer q_in = on_device(device, in.q), k_in = on_device(device, in.k);
    const rope::Buffer q_out = on_device(device, std::vector<float>(in.q.size(), kPoison));
    const rope::Buffer k_out = on_device(device, std::vector<float>(in.k.size(), kPoison));
    const rope::Buffer ids = on_device(device, arrays.ids), cu_seqlens = on_device(device, arrays.cu_seqlens);
    const rope::Buffer starts = on_device(device, arrays.starts), cos_sin = on_device(device, table);

    auto view = [&](const rope::Buffer& buffer, int64_t heads) {
        if (in.packed)
            return rope::TensorView::packed(buffer.data(), rope::DType::f32, device, {in.seq, heads, in.head_dim});
        return rope::TensorView::contiguous(buffer.data(), rope::DType::f32, device, rope::Layout::bshd,
                                            {in.batch, in.seq, heads, in.head_dim});
    };
    rope::Positions positions = rope::Positions::starting_at(arrays.offset);
    if (!arrays.ids.empty()) {
        positions =
            rope::Positions::multi_axis(static_cast<const int64_t*>(ids.data()), arrays.axes, 1, in.seq, device);
    } else if (!arrays.cu_seqlens.empty()) {
        positions = rope::Positions::packed(static_cast<const int64_t*>(cu_seqlens.data()),
                                            int64_t(arrays.cu_seqlens.size()) - 1,
                                            static_cast<const int64_t*>(starts.data()), device);
        positions.offset = arrays.offset;  // Every sequence's start when there are no starts.
    }
    if (arrays.cp_size > 1) positions = positions.sharded(arrays.cp_size, arrays.cp_rank);
    rope::RopeArgs args = rope::RopeArgs::out_of_place(view(q_in, in.q_heads), view(k_in, in.k_heads),
                                                       view(q_out, in.q_heads), view(k_out, in.k_heads), positions);
    if (!table.empty()) {
        const int64_t cols = config.effective_rotary_dim();
        args.cos_sin_cache = rope::CosSinCache::dense(static_cast<const float*>(cos_sin.data()),
                                                      int64_t(table.size()) / cols, cols, device);
    }
    Outcome outcome{std::vector<float>(in.q.size()), std::vector<float>(in.k.size()), ""};
    try {
        rope::apply(backend, config, args);
        if (device == rope::Device::cuda) rope::cuda_synchronize();  // The launch is asynchronous.
    } catch (const rope::Error& error) {
        outcome.error = error.what();
    }
    q_out.copy_to_host(outcome.q.data());
    k_out.copy_to_host(outcome.k.data());
    return outcome;
}

/// Whether two results are the same bits, NaN for NaN (memcmp, not ==).
inline bool identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Whether every output element still holds the poison: nothing was written.
inline bool untouched(const std::vector<float>& out) { return identical(out, std::vector<float>(out.size(), kPoison)); }

/// Token rows [first, last) of x, whose tokens are `row` floats each.
inline std::vector<float> token_rows(const std::vector<float>& x, int64_t first, int64_t last, int64_t row) {
    return {x.begin() + first * row, x.begin() + last * row};
}

/// Every backend available here; the others are listed as skipped.
struct Backends {
    std::vector<std::unique_ptr<rope::Backend>> available;
    int64_t skipped = 0;
};

inline Backends every_backend() {
    print_section("Backends");
    Backends backends;
    for (const rope::BackendInfo& info : rope::list_backends()) {
        if (!info.available) {
            std::printf("  %-15s skipped: %s\n", info.name.c_str(), info.reason.c_str());
            ++backends.skipped;
            continue;
        }
        std::printf("  %-15s runs every check below\n", info.name.c_str());
        backends.available.push_back(rope::make_backend(info.name));
    }
    return backends;
}

/// One line of a check: passed or not, and what it measured.
struct Verdict {
    bool passed = false;
    std::string detail;
};

/// Runs `measure` (Backend& -> Verdict) on every available backend and records
/// one check: passed on all of them. The line lists each backend's detail.
template <typename Measure>
void expect_everywhere(Checks& checks, const Backends& backends, const std::string& what, Measure measure) {
    bool passed = true;
    std::string details;
    for (const auto& backend : backends.available) {
        const Verdict verdict = measure(*backend);
        passed = passed && verdict.passed;
        details += (details.empty() ? "" : "; ") + backend->name() + " " + verdict.detail;
    }
    checks.expect(passed && !backends.available.empty(), what + " [" + details + "]");
}

/// A float64 comparison as a Verdict (a refused call fails, with rope's message).
inline Verdict against_float64(const Outcome& outcome, const std::vector<double>& q_want,
                               const std::vector<double>& k_want) {
    if (!outcome.error.empty()) return {false, "refused: " + outcome.error};
    const Distance q = distance(outcome.q, q_want), k = distance(outcome.k, k_want);
    const Distance worst = q.rel_l2 >= k.rel_l2 || std::isnan(q.rel_l2) ? q : k;
    return {q.within() && k.within(), worst.text()};
}

/// A call on `backend` against the float64 formula of the same config and positions.
inline Verdict matches_float64(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& in,
                               const PositionArrays& arrays, const std::vector<float>& table = {}) {
    const std::vector<float>* t = table.empty() ? nullptr : &table;
    return against_float64(run(backend, config, in, arrays, table),
                           reference(in.q, in.q_heads, in, config, arrays, t),
                           reference(in.k, in.k_heads, in, config, arrays, t));
}

/// Counts the reproduced bugs a chapter shows and how many its checks catch.
struct BugCount {
    int shown = 0, caught = 0;
    void expect_caught(Checks& checks, bool catches, const std::string& what) {
        ++shown;
        if (catches) ++caught;
        checks.expect(catches, what);
    }
    std::string text() const { return std::to_string(caught) + " of " + std::to_string(shown) + " reproduced bugs caught"; }
};

inline std::string join(const std::vector<int64_t>& values, const char* separator = " ") {
    std::string text;
    for (size_t i = 0; i < values.size(); ++i) text += (i ? separator : "") + std::to_string(values[i]);
    return text;
}

}  // namespace tutorial
