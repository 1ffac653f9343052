// Calls large enough to fill the GPU: cuda-optimized's bandwidth regime.
//
// cuda-optimized launches its kernel in one of two shapes by the size of the
// call (cuda/optimized/backend.cu, device_launch.cuh): batches of 4 rows per
// thread once one thread per 16-byte chunk of every row would fill all of the
// GPU's thread slots (the bandwidth regime), a software pipeline of 2 rows
// below it. The randomised suites draw mostly small calls, so this test sizes
// its calls from the device's SM count (twice the threshold) and runs every
// form the bandwidth launch must handle: each dtype and pairing style, bhsd,
// bshd, heads and seq transposed in memory, packed sequences, in place and out
// of place, partial rotary (the pass-through copied out of place and left alone
// in place), grouped-query k, offsets, ids, M-RoPE, scaling and the inverse
// rotation, the precise mode and a caller's table. Each call is checked against
// the float64 oracle and cpu-naive, with poisoned outputs and nothing written
// outside the views (testing::check_call). Both CUDA backends run it; without a
// GPU it is skipped.
//
// The same forms in small calls (decode steps and a few tokens: the latency
// regime) follow, shaped so that some warps of cuda-optimized hold rows of one
// token and others straddle two, in both numberings of its units (token-major
// where a token's heads are adjacent, slice-major at one token per sequence):
// where a kernel lets a warp's lanes share a token's cos/sin (PairShare in
// cuda/optimized/prologue.cuh), both kinds of warp are covered.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "cuda_helpers.hpp"
#include "support.hpp"

using testing::Call;

namespace {

enum class Form { offset, ids, packed, mrope, table };

struct LargeCase {
    const char* name;
    rope::DType dtype;
    rope::Style style;
    rope::Layout layout;  // bhsd or bshd; ignored for Form::packed (thd).
    int64_t rotary_dim;   // Of head_dim 128.
    bool in_place;
    Form form;
    bool precise = false;
    bool inverse = false;     // The inverse rotation (sin negated), with linear scaling.
    bool transposed = false;  // Heads and seq swapped in memory.
};

const LargeCase kCases[] = {
    {"f32 half-split bhsd in place", rope::DType::f32, rope::Style::half_split, rope::Layout::bhsd, 128, true,
     Form::offset},
    {"bf16 half-split bshd out of place, offset", rope::DType::bf16, rope::Style::half_split, rope::Layout::bshd, 128,
     false, Form::offset},
    {"f16 interleaved bhsd out of place, partial rotary", rope::DType::f16, rope::Style::interleaved,
     rope::Layout::bhsd, 64, false, Form::offset},
    {"bf16 interleaved bshd in place, partial rotary", rope::DType::bf16, rope::Style::interleaved,
     rope::Layout::bshd, 64, true, Form::offset},
    {"f32 bshd ids per sequence, linear scaling, inverse", rope::DType::f32, rope::Style::half_split,
     rope::Layout::bshd, 128, true, Form::ids, false, true},
    {"bf16 packed sequences", rope::DType::bf16, rope::Style::half_split, rope::Layout::bshd, 128, true, Form::packed},
    {"bf16 M-RoPE, bshd out of place", rope::DType::bf16, rope::Style::half_split, rope::Layout::bshd, 128, false,
     Form::mrope},
    {"f32 bhsd view of bshd memory", rope::DType::f32, rope::Style::half_split, rope::Layout::bhsd, 128, false,
     Form::offset, false, false, true},
    {"bf16 precise angles", rope::DType::bf16, rope::Style::half_split,
     rope::Layout::bshd, 128, true, Form::offset, true},
    {"f32 a caller's table", rope::DType::f32, rope::Style::half_split,
     rope::Layout::bhsd, 128, true, Form::table},
};

constexpr int64_t kHeadDim = 128, kQHeads = 12, kKHeads = 4, kBatch = 2;

// Tokens per sequence for which one thread per 16-byte chunk of every row
// (rotating chunks only: a lower bound) is twice the GPU's thread slots.
int64_t seq_filling_twice(const LargeCase& c) {
    const int64_t width = 16 / rope::dtype_size(c.dtype);  // Values per 16-byte vector.
    const int64_t chunks = c.rotary_dim / 2 / width;
    const int64_t slots = testing::cuda::thread_slots();
    const int64_t rows = kBatch * (kQHeads + kKHeads) * chunks;
    return (2 * slots + rows - 1) / rows;
}

// The sizes of a call: sequences, tokens per sequence, q's and k's heads.
struct Sizes {
    int64_t batch = kBatch, seq = 0, q_heads = kQHeads, k_heads = kKHeads;
};

Call make_large_call(const LargeCase& c, const Sizes& sizes, int64_t& max_position) {
    const int64_t seq = sizes.seq, batch = sizes.batch;
    std::mt19937_64& rng = testing::rng();
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.rotary_dim = c.rotary_dim;
    config.style = c.style;
    config.base = 500000.0;
    config.precise_angles = c.precise;
    if (c.inverse) config.scaling = {.type = rope::ScalingType::linear, .factor = 4.0};
    if (c.form == Form::mrope) config.multi_axis = {rope::AxisAssignment::mrope_contiguous, {16, 24, 24}};
    Call call;
    if (c.form == Form::packed) {
        // batch * seq tokens in sequences of uneven lengths (two halves in a small call).
        const int64_t total = batch * seq;
        const std::vector<int64_t> lengths =
            total >= 16 ? std::vector<int64_t>{total / 2 + 3, total / 3, total - (total / 2 + 3) - total / 3}
            : total >= 2 ? std::vector<int64_t>{total - total / 2, total / 2}
                         : std::vector<int64_t>{total};
        call = testing::make_packed_call(config, c.dtype, lengths, sizes.q_heads, sizes.k_heads);
        max_position = lengths.front();
    } else {
        auto shape = [&](int64_t heads) {
            return c.layout == rope::Layout::bhsd ? std::array<int64_t, 4>{batch, heads, seq, kHeadDim}
                                                  : std::array<int64_t, 4>{batch, seq, heads, kHeadDim};
        };
        call = testing::make_call(config, c.dtype, c.layout, shape(sizes.q_heads), shape(sizes.k_heads));
        max_position = seq;
    }
    if (c.transposed) {
        const testing::StorageOptions transposed{testing::Arrangement::transposed, 0};
        testing::arrange(call, {transposed, transposed, transposed, transposed}, rng);
    }
    call.in_place = c.in_place;
    if (c.inverse) call.direction = rope::Direction::inverse;
    std::uniform_int_distribution<int64_t> id(0, 32767);
    switch (c.form) {
        case Form::offset:
            call.offset = c.precise ? 3000000 : 1000;  // Precise angles matter at large positions.
            max_position = call.offset + seq;
            break;
        case Form::ids:
        case Form::mrope:
            call.id_axes = c.form == Form::mrope ? 3 : 1;
            call.id_rows = batch;
            for (int64_t i = 0; i < call.id_axes * batch * seq; ++i) call.ids.push_back(id(rng));
            max_position = 32768;
            break;
        case Form::table: {
            // cos and sin of random angles: any finite table is valid input.
            const int64_t rows = seq, pairs = c.rotary_dim / 2;
            std::uniform_real_distribution<float> angle(0.0f, 2.0f * std::numbers::pi_v<float>);
            call.table.assign(size_t(rows * c.rotary_dim), 0.0f);
            for (int64_t p = 0; p < rows; ++p)
                for (int64_t i = 0; i < pairs; ++i) {
                    const float a = angle(rng);
                    call.table[size_t(p * c.rotary_dim + i)] = std::cos(a);
                    call.table[size_t(p * c.rotary_dim + pairs + i)] = std::sin(a);
                }
            call.table_rows = rows;
            call.table_cols = call.table_row_stride = c.rotary_dim;
            max_position = 1;  // No angle is computed: only float32 rounding of the products.
            break;
        }
        case Form::packed:
            break;
    }
    return call;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("CUDA: calls that fill the GPU (the bandwidth regime) against the oracle", B,
                          bandwidth_regime) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (const LargeCase& c : kCases) {
        const int64_t seq = seq_filling_twice(c);
        const std::string name = c.name;
        CAPTURE(name);
        CAPTURE(seq);
        int64_t max_position = 0;
        const Call call = make_large_call(c, {.seq = seq}, max_position);
        const testing::Tolerance tolerance = testing::oracle_tolerance(c.dtype, max_position);
        testing::check_call(*backend, call, tolerance.rel_l2, tolerance.max_abs);
    }
}

TEST_CASE_TEMPLATE_APPLY(bandwidth_regime, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("CUDA: small calls of head_dim 128 (decode steps, a few tokens) against the oracle", B,
                          latency_regime) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // One decode token of Llama's 32 + 8 heads, and of 6 + 1 (7 rows a token: warps straddle tokens);
    // a batch of decode tokens; a few tokens of two sequences.
    const Sizes sizes[] = {{1, 1, 32, 8}, {1, 1, 6, 1}, {3, 1, 32, 8}, {2, 3, 6, 1}, {1, 5, 32, 8}};
    for (const LargeCase& c : kCases)
        for (const Sizes& size : sizes) {
            const std::string name = c.name;
            CAPTURE(name);
            CAPTURE(size.batch);
            CAPTURE(size.seq);
            CAPTURE(size.q_heads);
            int64_t max_position = 0;
            const Call call = make_large_call(c, size, max_position);
            const testing::Tolerance tolerance = testing::oracle_tolerance(c.dtype, max_position);
            testing::check_call(*backend, call, tolerance.rel_l2, tolerance.max_abs);
        }
}

TEST_CASE_TEMPLATE_APPLY(latency_regime, CudaBackends);
