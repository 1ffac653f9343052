// cpu-eigen: RoPE as Eigen array expressions on OpenMP threads.
//
// It computes what cpu-naive computes (the same angle from the shared
// pair_angle, the same rotation), only faster; its cos and sin come from
// Eigen's SIMD routines, within 2 float32 ulps of cpu-naive's std::cos/std::sin.
// RoPE does a handful of flops per element against 8 bytes moved (fp32, read
// and written), so it is bound by memory bandwidth; speed comes from keeping
// the memory system busy all the time, with as little work as possible:
//
//   1. A head row is rotated as Eigen fixed-size arrays, several pairs per
//      instruction (SIMD). fp16/bf16 rows are widened to float32, rotated and
//      rounded back by plain loops without branches that the compiler
//      vectorises, compiled for SSE2, AVX2 and AVX-512 (the processor picks);
//      with AVX-512 both are widened, rotated and rounded in registers,
//      sixteen pairs at a time (bf16 rounded by the processor's own
//      instruction where it has AVX512-BF16), and fp16 rows elsewhere use the
//      processor's own conversions where it has them (F16C). Strided views
//      take a generic gather/scatter path.
//   2. cos/sin are computed once per (position, pair), by all threads
//      together and several pairs per instruction, into one table that every
//      head of q and k then reads (and every sequence, when they share
//      positions); cpu-naive recomputes them per head.
//   3. OpenMP threads each stream one contiguous stretch of memory (a range of
//      heads, or of tokens, whichever is contiguous in the layout), also when
//      decoding a single token, in an order the processor's own prefetchers
//      follow; out-of-place float32 outputs of half-split pairs larger than the
//      last-level cache are written with streaming stores, by whole lines.
//
// Read top to bottom: the row kernels, the cos/sin table, the work split and
// the walk over rows, and the backend that ties them together.
#include <omp.h>
#include <unistd.h>  // sysconf: the last-level cache size (streaming_output_bytes).

#include <Eigen/Core>
#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>      // __get_cpuid: whether the processor has F16C (processor_has_f16c).
#include <immintrin.h>  // F16C (rotate_f16c) and AVX-512 (rotate_avx512) instructions, streaming stores.
#endif
#include <algorithm>
#include <bit>  // std::countr_zero, std::countr_one (LineStreamer).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "rope/detail/backend_factories.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/detail/plan.hpp"
#include "rope/rotation.hpp"

namespace rope {
namespace {

// ---------------------------------------------------------------------------
// 1. One head row
// ---------------------------------------------------------------------------

// Pairs rotated per step. Eight floats are two SSE2 registers (the portable
// baseline) or one AVX register; a fixed size lets Eigen unroll the step
// completely and keep x, y, cos and sin in registers (sixteen would spill
// SSE2's sixteen registers to the stack).
constexpr int64_t kLanes = 8;
using Lanes = Eigen::Array<float, kLanes, 1>;

// The first and second features of kLanes consecutive pairs, widened to float32.
struct PairBlock {
    Lanes x;
    Lanes y;
};

// Where one head row lives: its first element and the distance between features.
template <typename Element>
struct Row {
    Element* data;
    int64_t stride;  // stride_dim, in elements.
};

// x and y of interleaved pairs: every other float, starting at 0 or 1.
using EvenOdd = Eigen::Map<const Lanes, Eigen::Unaligned, Eigen::InnerStride<2>>;
using EvenOddOut = Eigen::Map<Lanes, Eigen::Unaligned, Eigen::InnerStride<2>>;

// Loads pairs [first, first + kLanes) of a row into registers.
//
// The fast case is float32 with unit stride: the pairs are plain memory, so
// Eigen::Map reads them in place as SIMD loads. Half-split pairs sit in two
// contiguous runs (x = features [i, i+8), y = [p+i, p+i+8)); interleaved pairs
// alternate, so x and y are one run of 16 features seen with an inner stride
// of 2. Any other row (a strided view, or fp16/bf16 to widen) is gathered
// element by element through the shared pairing rule.
//
// Forced inline (as is store_pairs): called out of line, the block would pass
// through memory instead of staying in registers, at twice the cost per row.
template <typename Storage, Style kStyle, bool kUnitStride>
EIGEN_ALWAYS_INLINE PairBlock load_pairs(Row<const Storage> row, int64_t rotary_dim, int64_t first) {
    const int64_t half = rotary_dim / 2;
    if constexpr (kUnitStride && std::is_same_v<Storage, float>) {
        if constexpr (kStyle == Style::half_split)
            return {Eigen::Map<const Lanes>(row.data + first), Eigen::Map<const Lanes>(row.data + half + first)};
        else
            return {EvenOdd(row.data + 2 * first), EvenOdd(row.data + 2 * first + 1)};
    } else {
        PairBlock block;
        for (int64_t lane = 0; lane < kLanes; ++lane) {
            const PairIndex pair = pair_elements(kStyle, rotary_dim, first + lane);
            block.x[lane] = to_float(row.data[pair.first * row.stride]);
            block.y[lane] = to_float(row.data[pair.second * row.stride]);
        }
        return block;
    }
}

// Stores a rotated block: the mirror image of load_pairs, rounding to Storage.
template <typename Storage, Style kStyle, bool kUnitStride>
EIGEN_ALWAYS_INLINE void store_pairs(Row<Storage> row, int64_t rotary_dim, int64_t first, const PairBlock& block) {
    const int64_t half = rotary_dim / 2;
    if constexpr (kUnitStride && std::is_same_v<Storage, float>) {
        if constexpr (kStyle == Style::half_split) {
            Eigen::Map<Lanes>(row.data + first) = block.x;
            Eigen::Map<Lanes>(row.data + half + first) = block.y;
        } else {
            EvenOddOut(row.data + 2 * first) = block.x;
            EvenOddOut(row.data + 2 * first + 1) = block.y;
        }
    } else {
        for (int64_t lane = 0; lane < kLanes; ++lane) {
            const PairIndex pair = pair_elements(kStyle, rotary_dim, first + lane);
            row.data[pair.first * row.stride] = from_float<Storage>(block.x[lane]);
            row.data[pair.second * row.stride] = from_float<Storage>(block.y[lane]);
        }
    }
}

// What every row of a call has in common.
struct RowShape {
    int64_t pairs;       // rotary_dim / 2.
    int64_t rotary_dim;  // Features that rotate.
    int64_t head_dim;    // Features per row; those past rotary_dim pass through.
};

// Rotates one head row by the angles whose (scaled, signed) cos and sin are
// given per pair: the kernel for float32 rows and for strided rows of any type.
//
// In place is safe because a block is loaded completely (both x and y) into
// registers before any of it is stored; no scratch copy of the row is needed.
// The shape comes by value: through a reference the compiler would have to
// reload it after every store, in case the row's memory aliased it.
template <typename Storage, Style kStyle, bool kUnitStride>
void rotate_row(Row<const Storage> in, Row<Storage> out, const float* cos, const float* sin, RowShape shape) {
    const int64_t pairs = shape.pairs, rotary_dim = shape.rotary_dim;
    int64_t i = 0;
    for (; i + kLanes <= pairs; i += kLanes) {
        //! [eight pairs at once]
        const PairBlock block = load_pairs<Storage, kStyle, kUnitStride>(in, rotary_dim, i);
        const Eigen::Map<const Lanes> c(cos + i), s(sin + i);
        // rotate_pair, written for kLanes pairs at once: one SIMD multiply per term.
        const PairBlock rotated{block.x * c - block.y * s, block.y * c + block.x * s};
        store_pairs<Storage, kStyle, kUnitStride>(out, rotary_dim, i, rotated);
        //! [eight pairs at once]
    }
    // The last pairs % kLanes pairs (e.g. rotary_dim 24 = 8 + 4 pairs) take the scalar rule.
    for (; i < pairs; ++i) {
        const PairIndex pair = pair_elements(kStyle, rotary_dim, i);
        float x = to_float(in.data[pair.first * in.stride]);
        float y = to_float(in.data[pair.second * in.stride]);
        rotate_pair(x, y, cos[i], sin[i]);
        out.data[pair.first * out.stride] = from_float<Storage>(x);
        out.data[pair.second * out.stride] = from_float<Storage>(y);
    }
    // Partial rotary: features past rotary_dim are copied through as stored
    // (bit for bit). In place they already are where they belong.
    if (out.data == in.data) return;
    for (int64_t d = rotary_dim; d < shape.head_dim; ++d) out.data[d * out.stride] = in.data[d * in.stride];
}

// Longest rotary part a contiguous fp16/bf16 row may have to be widened on the stack.
constexpr int64_t kMaxWidenedDim = 1024;

// Compiled several times, for SSE2 (any x86-64), AVX2 and AVX-512; the
// program picks the widest the processor has when it starts (GCC's
// target_clones). A plain loop is then 4, 8 or 16 floats per instruction.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROPE_WIDEST_SIMD __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define ROPE_WIDEST_SIMD
#endif

// The middle step of the widened kernels below: the shared rotate_pair on
// every pair of a contiguous float32 row. Inlined, so that it is compiled
// (and vectorised) for each caller's instruction set.
template <Style kStyle>
EIGEN_ALWAYS_INLINE void rotate_float_row(float* row, const float* cos, const float* sin, RowShape shape) {
    for (int64_t i = 0; i < shape.pairs; ++i) {
        const PairIndex pair = pair_elements(kStyle, shape.rotary_dim, i);
        rotate_pair(row[pair.first], row[pair.second], cos[i], sin[i]);
    }
}

// Contiguous fp16/bf16 rows: widen the rotary features into a float32 row,
// rotate it, and round it back. Three plain loops, with no branch, that the
// compiler vectorises (the conversions are rope/dtype.hpp's, the rotation is
// the shared rotate_pair); converting pair by pair inside the rotation would
// leave them scalar.
template <typename Storage, Style kStyle>
ROPE_WIDEST_SIMD void rotate_widened(Row<const Storage> in, Row<Storage> out, const float* cos, const float* sin,
                                     RowShape shape) {
    float row[kMaxWidenedDim];
    const int64_t rotary_dim = shape.rotary_dim;
    convert_to_float(in.data, rotary_dim, row);
    rotate_float_row<kStyle>(row, cos, sin, shape);
    convert_from_float(row, rotary_dim, out.data);
    // Partial rotary: features past rotary_dim are copied through as stored.
    if (out.data == in.data) return;
    for (int64_t d = rotary_dim; d < shape.head_dim; ++d) out.data[d] = in.data[d];
}

// fp16 rows on a processor that converts half floats itself (F16C, here with
// AVX2: x86-64 processors since 2013 or 2015). One instruction widens eight halves
// (vcvtph2ps) and one rounds eight floats to nearest, ties to even
// (vcvtps2ph): the same values as rope/dtype.hpp's bit arithmetic, which
// takes tens of instructions for the same eight. fp16 rows spend more time in
// that arithmetic than in waiting for memory: on one core of the 2-core VM
// this was tuned on, a row in cache cost 0.53 ns per element with the bit
// arithmetic and 0.31 with these instructions.
//
// The instructions differ from rope::to_float16 on NaN only: they keep the
// NaN's payload bits, rope gives every NaN as sign | 0x7e00; the rounding
// loop puts rope's NaN back (checked on all 2^32 floats), so the results are
// rotate_widened's bits. (Widening also quiets a signalling NaN, as the
// rotation's first multiply does anyway. Where both terms of x*c - y*s are
// NaN, the result's sign is whichever NaN the compiled code keeps: IEEE 754
// leaves it open, and two compilations of one loop may keep different ones.)
#if defined(__GNUC__) && defined(__x86_64__)
#define ROPE_HAVE_F16C_KERNEL 1
// Whether the processor has F16C: bit 29 of CPUID leaf 1's ECX. (Asked of CPUID
// directly: Clang 16's __builtin_cpu_supports does not know "f16c".) The
// operating system's support for the AVX registers comes with "avx2".
bool processor_has_f16c() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

template <Style kStyle>
__attribute__((target("avx2,f16c"))) void rotate_f16c(Row<const float16> in, Row<float16> out, const float* cos,
                                                     const float* sin, RowShape shape) {
    float row[kMaxWidenedDim];
    const int64_t rotary_dim = shape.rotary_dim;
    const int64_t whole = rotary_dim - rotary_dim % 8;  // Features in groups of eight.
    for (int64_t d = 0; d < whole; d += 8) {
        const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.data + d));
        _mm256_storeu_ps(row + d, _mm256_cvtph_ps(halves));
    }
    convert_to_float(in.data + whole, rotary_dim - whole, row + whole);

    rotate_float_row<kStyle>(row, cos, sin, shape);

    const __m128i magnitude_bits = _mm_set1_epi16(0x7fff), sign_bit = _mm_set1_epi16(int16_t(0x8000));
    const __m128i infinity = _mm_set1_epi16(0x7c00), quiet_nan = _mm_set1_epi16(0x7e00);
    for (int64_t d = 0; d < whole; d += 8) {
        __m128i halves = _mm256_cvtps_ph(_mm256_loadu_ps(row + d), _MM_FROUND_TO_NEAREST_INT);
        // A half is a NaN when its magnitude is above infinity's; it becomes sign | 0x7e00.
        const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(halves, magnitude_bits), infinity);
        const __m128i rope_nan = _mm_or_si128(_mm_and_si128(halves, sign_bit), quiet_nan);
        halves = _mm_or_si128(_mm_andnot_si128(nan, halves), _mm_and_si128(nan, rope_nan));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data + d), halves);
    }
    convert_from_float(row + whole, rotary_dim - whole, out.data + whole);
    // Partial rotary: features past rotary_dim are copied through as stored.
    if (out.data == in.data) return;
    for (int64_t d = rotary_dim; d < shape.head_dim; ++d) out.data[d] = in.data[d];
}
#endif

// fp16 and bf16 rows with AVX-512 (x86-64 processors since 2017): widened,
// rotated and rounded in registers, sixteen pairs per step, with no float32
// row in memory between the three loops of rotate_widened. Interleaved pairs
// arrive as sixteen 32-bit lanes, one pair each (split_pairs, join_pairs).
// The results are rotate_widened's bits: the products are rounded one by one
// (-ffp-contract=off compiles every kernel here), bf16 rounds with
// rope::to_bfloat16's integer arithmetic on sixteen lanes at once (or the
// processor's own instruction, below), and fp16 with the processor's
// conversion plus rope's NaN, as in rotate_f16c.
#if defined(__GNUC__) && defined(__x86_64__)
#define ROPE_HAVE_AVX512_KERNEL 1
// GCC 12 reports the AVX-512 headers' internal placeholder operands as maybe
// uninitialised in these kernels: a false report (GCC bug 105593, fixed in 13).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The target also allows AVX512-BF16 (bf16 conversions, processors since 2020), for the
// one kernel that uses them (Bf16Instruction, below), which is picked only where the
// processor has them. The compiler emits those instructions for their intrinsics only:
// no other code here has their semantics, so the other kernels run on any AVX-512 processor.
#define ROPE_AVX512 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Sixteen stored elements widened to float32 (exact).
ROPE_AVX512 inline __m512 widen_16(__m256i elements, bfloat16 /*storage*/) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(elements), 16));  // the top half of a float
}
ROPE_AVX512 inline __m512 widen_16(__m256i elements, float16 /*storage*/) { return _mm512_cvtph_ps(elements); }

// rope::to_bfloat16 on sixteen lanes: each float32 with 0x7fff plus its lowest kept bit
// added (a NaN quieted instead), so that its top half is the rounded bf16.
ROPE_AVX512 inline __m512i round_to_top_half(__m512 values) {
    const __m512i bits = _mm512_castps_si512(values);
    const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lowest_kept));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(bits, _mm512_set1_epi32(0x400000)));
}

// Sixteen float32 values rounded to nearest, ties to even, a NaN becoming rope's NaN.
ROPE_AVX512 inline __m256i narrow_16(__m512 values, bfloat16 /*storage*/) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_to_top_half(values), 16));
}
ROPE_AVX512 inline __m256i narrow_16(__m512 values, float16 /*storage*/) {
    const __m256i halves = _mm512_cvtps_ph(values, _MM_FROUND_TO_NEAREST_INT);
    // Rotated values are almost never NaN: one comparison of the floats skips rope's NaN
    // below for the whole vector. fp16 in place, 2 threads, alternating runs, medians of 3:
    // half-split 50 -> 56% and 56 -> 62% of the ceiling at [1,32,4096,128] and
    // [8,32,1024,128], interleaved 52 -> 51% and 51 -> 58%.
    if (_mm512_cmp_ps_mask(values, values, _CMP_UNORD_Q) == 0) return halves;
    // A half is a NaN when its magnitude is above infinity's; it becomes sign | 0x7e00.
    const __m256i magnitude = _mm256_and_si256(halves, _mm256_set1_epi16(0x7fff));
    const __m256i nan = _mm256_cmpgt_epi16(magnitude, _mm256_set1_epi16(0x7c00));
    const __m256i rope_nan = _mm256_or_si256(_mm256_and_si256(halves, _mm256_set1_epi16(int16_t(0x8000))),
                                             _mm256_set1_epi16(0x7e00));
    return _mm256_blendv_epi8(halves, rope_nan, nan);
}

// Sixteen interleaved pairs, one per 32-bit lane (x in the low half, y in the high
// half), as widened x and y; and back. A bf16 is the top half of a float32, so its
// lanes only need shifting and masking; fp16 lanes are narrowed to two runs of halves.
struct WidePairs {
    __m512 x, y;
};
ROPE_AVX512 inline WidePairs split_pairs(__m512i lanes, bfloat16 /*storage*/) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(lanes, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(lanes, _mm512_set1_epi32(int32_t(0xffff0000u))))};
}
ROPE_AVX512 inline __m512i join_pairs(__m512 x, __m512 y, bfloat16 /*storage*/) {
    return _mm512_or_si512(_mm512_srli_epi32(round_to_top_half(x), 16),
                           _mm512_and_si512(round_to_top_half(y), _mm512_set1_epi32(int32_t(0xffff0000u))));
}
ROPE_AVX512 inline WidePairs split_pairs(__m512i lanes, float16 storage) {
    return {widen_16(_mm512_cvtepi32_epi16(lanes), storage),
            widen_16(_mm512_cvtepi32_epi16(_mm512_srli_epi32(lanes, 16)), storage)};
}
ROPE_AVX512 inline __m512i join_pairs(__m512 x, __m512 y, float16 storage) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(narrow_16(x, storage)),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow_16(y, storage)), 16));
}

// bf16 rounding by the processor's instruction (AVX512-BF16): one instruction
// for sixteen lanes (thirty-two when two vectors are joined) instead of about ten
// for the integer arithmetic of round_to_top_half. That arithmetic was what bound
// bf16 rows on the 2-core VM: in the cache a 256-byte bf16 row cost more than a
// 512-byte fp32 row (58 against 26 ns), and from memory with two threads the
// instruction took [1,32,4096,128] and [8,32,1024,128] in place from 44 and 52% of
// the ceiling to 60 and 68% (alternating runs, medians of 3). It rounds to nearest,
// ties to even, and quiets a NaN as rope::to_bfloat16 does, but reads subnormal
// floats as zero: a vector with one takes the integer arithmetic instead (rotated
// values are almost never subnormal, so the branch costs nothing measurable).
struct Bf16Instruction {};
ROPE_AVX512 inline __mmask16 subnormal_lanes(__m512 values) {
    const __m512i bits = _mm512_castps_si512(values);
    return _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)) &  // exponent 0 ...
           _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007fffff));    // ... and a fraction.
}
ROPE_AVX512 inline __m256i narrow_16(__m512 values, Bf16Instruction /*rounding*/) {
    if (subnormal_lanes(values) != 0) return narrow_16(values, bfloat16{});
    return __m256i(_mm512_cvtneps_pbh(values));
}
ROPE_AVX512 inline __m512i join_pairs(__m512 x, __m512 y, Bf16Instruction /*rounding*/) {
    if ((subnormal_lanes(x) | subnormal_lanes(y)) != 0) return join_pairs(x, y, bfloat16{});
    // Rounded x then rounded y, 32 halves; then x_i and y_i side by side, a pair per lane.
    const __m512i halves = __m512i(_mm512_cvtne2ps_pbh(y, x));
    const __m512i x_then_y = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,  //
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(x_then_y, halves);
}

// rotate_pair on sixteen pairs: x c - y s and y c + x s, each product rounded.
ROPE_AVX512 inline WidePairs rotate_16(WidePairs pair, __m512 c, __m512 s) {
    return {_mm512_sub_ps(_mm512_mul_ps(pair.x, c), _mm512_mul_ps(pair.y, s)),
            _mm512_add_ps(_mm512_mul_ps(pair.y, c), _mm512_mul_ps(pair.x, s))};
}

// Rounding picks the narrowing: Storage's own arithmetic, or Bf16Instruction.
template <typename Storage, Style kStyle, typename Rounding = Storage>
ROPE_AVX512 void rotate_avx512(Row<const Storage> in, Row<Storage> out, const float* cos, const float* sin,
                               RowShape shape) {
    const int64_t pairs = shape.pairs, rotary_dim = shape.rotary_dim;
    const int64_t whole = pairs - pairs % 16;  // Pairs in groups of sixteen.
    for (int64_t i = 0; i < whole; i += 16) {
        const __m512 c = _mm512_loadu_ps(cos + i), s = _mm512_loadu_ps(sin + i);
        if constexpr (kStyle == Style::half_split) {
            // x = features [i, i + 16), y = [pairs + i, pairs + i + 16): two runs of sixteen.
            auto* x_at = reinterpret_cast<const __m256i*>(in.data + i);
            auto* y_at = reinterpret_cast<const __m256i*>(in.data + pairs + i);
            const WidePairs widened{widen_16(_mm256_loadu_si256(x_at), Storage{}),
                                    widen_16(_mm256_loadu_si256(y_at), Storage{})};
            const WidePairs rotated = rotate_16(widened, c, s);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data + i), narrow_16(rotated.x, Rounding{}));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data + pairs + i), narrow_16(rotated.y, Rounding{}));
        } else {
            // Sixteen pairs = 32 features in a row, one 64-byte load and store.
            const WidePairs rotated = rotate_16(split_pairs(_mm512_loadu_si512(in.data + 2 * i), Storage{}), c, s);
            _mm512_storeu_si512(out.data + 2 * i, join_pairs(rotated.x, rotated.y, Rounding{}));
        }
    }
    // The last pairs % 16 pairs take the scalar rule.
    for (int64_t i = whole; i < pairs; ++i) {
        const PairIndex pair = pair_elements(kStyle, rotary_dim, i);
        float x = to_float(in.data[pair.first]);
        float y = to_float(in.data[pair.second]);
        rotate_pair(x, y, cos[i], sin[i]);
        out.data[pair.first] = from_float<Storage>(x);
        out.data[pair.second] = from_float<Storage>(y);
    }
    // Partial rotary: features past rotary_dim are copied through as stored.
    if (out.data == in.data) return;
    for (int64_t d = rotary_dim; d < shape.head_dim; ++d) out.data[d] = in.data[d];
}
#undef ROPE_AVX512
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif


// A row kernel with style, storage and stride case fixed at compile time.
template <typename Storage>
using RowKernel = void (*)(Row<const Storage>, Row<Storage>, const float*, const float*, RowShape);

// Picks the kernel for one operand once per call, not once per row: the
// choice depends only on the storage type, the style, the operand's strides
// and the rotary width.
template <typename Storage>
RowKernel<Storage> pick_row_kernel(Style style, const Operand& operand, int64_t rotary_dim) {
    const bool contiguous = operand.in_geometry.stride_dim == 1 && operand.out_geometry.stride_dim == 1;
    if constexpr (!std::is_same_v<Storage, float>) {
#ifdef ROPE_HAVE_AVX512_KERNEL
        const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
        if constexpr (std::is_same_v<Storage, bfloat16>) {
            if (contiguous && avx512 && __builtin_cpu_supports("avx512bf16"))
                return style == Style::half_split ? rotate_avx512<Storage, Style::half_split, Bf16Instruction>
                                                  : rotate_avx512<Storage, Style::interleaved, Bf16Instruction>;
        }
        if (contiguous && avx512)
            return style == Style::half_split ? rotate_avx512<Storage, Style::half_split>
                                              : rotate_avx512<Storage, Style::interleaved>;
#endif
#ifdef ROPE_HAVE_F16C_KERNEL
        if constexpr (std::is_same_v<Storage, float16>) {
            if (contiguous && rotary_dim <= kMaxWidenedDim && __builtin_cpu_supports("avx2") &&
                processor_has_f16c())
                return style == Style::half_split ? rotate_f16c<Style::half_split> : rotate_f16c<Style::interleaved>;
        }
#endif
        if (contiguous && rotary_dim <= kMaxWidenedDim)
            return style == Style::half_split ? rotate_widened<Storage, Style::half_split>
                                              : rotate_widened<Storage, Style::interleaved>;
    }
    if (style == Style::half_split)
        return contiguous ? rotate_row<Storage, Style::half_split, true> : rotate_row<Storage, Style::half_split, false>;
    return contiguous ? rotate_row<Storage, Style::interleaved, true> : rotate_row<Storage, Style::interleaved, false>;
}

// ---------------------------------------------------------------------------
// 2. cos and sin, once per (position, pair)
// ---------------------------------------------------------------------------

// Consecutive tokens of one row of positions (b for per-sequence ids, 0 when
// the batch shares them) whose cos/sin are computed together: a "slab".
struct Slab {
    int64_t position_row = 0;
    int64_t first_token = 0;
    int64_t tokens = 0;
};

// Fills table row @p t of @p slab: entry [t * pairs + i] holds cos and sin of
// pair i at that token, already scaled by the attention factor and, for the
// inverse, with sin negated, so the row kernel only multiplies.
void fill_trig_row(const Plan& plan, const Slab& slab, int64_t t, float* cos, float* sin) {
    const TokenPositions positions = token_positions(plan.positions, plan.axes, slab.position_row, slab.first_token + t);
    const AngleRule& rule = plan.angles;
    float* const cos_row = cos + t * plan.pairs;
    float* const sin_row = sin + t * plan.pairs;
    if (rule.table.data != nullptr) {
        // A caller's table is read as given, through the shared rule.
        for (int64_t i = 0; i < plan.pairs; ++i)
            rotation_factors(rule, positions.of_pair(rule, plan.axes, i), i, cos_row[i], sin_row[i]);
        return;
    }
    // The same float32 angles as every backend (the shared pair_angle), then
    // their cos and sin with Eigen's SIMD routines, four pairs per instruction
    // (1.8 times faster here than std::cos and std::sin one at a time). Eigen's
    // results are within 2 ulps (1.2e-7) of cpu-naive's std::cos/std::sin, at
    // any angle: past about 2e4 radians a lane falls back to an exact (slower)
    // reduction of the angle.
    for (int64_t i = 0; i < plan.pairs; ++i)
        sin_row[i] = pair_angle(rule.precise, positions.of_pair(rule, plan.axes, i), rule.inv_freq[size_t(i)],
                                rule.inv_freq_low[size_t(i)]);
    Eigen::Map<Eigen::ArrayXf> angles(sin_row, plan.pairs);
    Eigen::Map<Eigen::ArrayXf>(cos_row, plan.pairs) = rule.cos_scale * angles.cos();
    angles = rule.sin_scale * angles.sin();
}

// ---------------------------------------------------------------------------
// 3. Splitting the work among threads, and walking it
// ---------------------------------------------------------------------------

// Bytes of cos + sin for one slab (4096 tokens at head_dim 128). The table is
// shared by all threads; a long sequence is done slab after slab.
//
// Filling it is the one part of a call with no memory traffic: at
// [1, 32, 4096, 128] (64 heads share each position) it is still a tenth of an
// fp32 call, while the memory bus idles (a call that skipped it measured 11%
// faster). Overlapping it does not pay here: filling the next, smaller slab's
// table a few pairs after each row (512 or 2048 tokens, 16 or 64 pairs at a
// time) measured from 7% slower to 2% faster than this simple two-phase order.
constexpr int64_t kSlabTableBytes = 2 * 1024 * 1024;
// Bytes of table per block of tokens when a token's heads are adjacent in
// memory ([b, s, h, d]: 128 tokens at head_dim 128): it stays in L2 while the
// block's rows of every head stream by.
constexpr int64_t kBlockTableBytes = 64 * 1024;
// Heads walked side by side, token by token, where a head's tokens are
// adjacent ([b, h, s, d]); a block is then the whole slab. Each token's cos/sin
// row is read from L1 by all of them, and each thread keeps this many streams
// of memory going. On the 2-core VM this was tuned on, in place at fp32, four
// reached 103 to 122% of the read-modify-write ceiling in alternating runs
// against 84 to 89% for one head at a time (each head one unbroken stream,
// but its table row read from L2 or L3 for every row), and two or eight
// heads 80 to 103%. (More than 100%: a thread streaming four regions at once
// got more from this VM's memory than the ceiling's loop did with one; the
// read-modify-write ceiling now walks four stretches side by side too.)
constexpr int64_t kHeadsSideBySide = 4;
// Stretches per thread: enough that an uneven last stretch costs little.
constexpr int64_t kStretchesPerThread = 8;
// Bytes per cache line (x86-64 and most ARM cores): the unit memory moves in.
constexpr int64_t kCacheLine = 64;
// Bytes (read + written) each thread should have at least: waking a thread and
// joining it costs microseconds (5 to 10 on the 2-core VM this was tuned on),
// in which one core moves about this much. Below it, fewer threads are faster.
constexpr int64_t kMinBytesPerThread = 256 * 1024;
// Outputs (q_out + k_out bytes) from which an out-of-place call writes its
// rows with streaming stores (see LineStreamer): more than the last-level
// cache holds, so the next operation would not have found them in the cache
// anyway. Smaller outputs are written normally and stay in the cache for it.
// The size is the processor's own (glibc reads it from CPUID), 32 MiB where
// the system does not say. Measured: on a VM with a 32 MiB L3, streaming
// [1,32,4096,128] fp32 (128 MiB of output) took the call from 50 to 68-73% of
// the ceiling. The 2-core VM this was tuned on reports its host's 260 MiB L3,
// shared with the host's other cores, so a lower threshold (8 MiB per
// processor) was tried there: with one thread streaming won (56 against 53%
// and 64 against 57% at [1,32,4096,128] and [8,32,1024,128]), with two it did
// not (56 against 54%, 50 against 57%; alternating runs, medians of 5), so the
// threshold stays the reported cache.
int64_t streaming_output_bytes() {
    static const int64_t bytes = [] {
        long reported = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
        reported = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
        return reported > 0 ? int64_t(reported) : int64_t(32) * 1024 * 1024;
    }();
    return bytes;
}

// Writes a thread's finished rows to memory with streaming (non-temporal) stores.
//
// An ordinary store to a line that is not in the cache first reads the line
// from memory (a "read for ownership"), so writing to a separate output moves
// three bytes for every two rotated: read the input, read the output's old
// line, write it back. A streaming store sends a whole line straight to memory
// without reading it, and without keeping it in the cache.
//
// Only whole lines may be streamed: a streaming store that covers part of a
// line leaves the memory controller to merge it with the line's old bytes, a
// read and a write for every part. Rows need not start on a line: malloc's
// large blocks start 16 bytes past a page, so each 512-byte fp32 row of such a
// tensor covers parts of 9 lines, the first and last shared with its
// neighbours in memory. Streaming those parts row by row made out-of-place
// fp32 calls twice as slow as ordinary stores on the 2-core VM, with the
// threshold above lowered to stream them (26.5 against 13.8 ms at
// [1, 32, 4096, 128]); by whole lines only, the two were even with two
// threads. So the part of a line a row leaves open is kept in a slot until
// the neighbouring row brings the rest (the next token of the same head, a few
// rows later in the walk), and then the whole line is streamed; parts still
// open when the thread leaves its stretch are written with ordinary stores
// (then another thread may own the rest of that line).
class LineStreamer {
public:
    // Copies @p bytes from @p from (a finished row in L1) to @p to.
    void write(const void* from, void* to, int64_t bytes) {
        const auto* source = static_cast<const unsigned char*>(from);
        const uintptr_t at = reinterpret_cast<uintptr_t>(to), end = at + uintptr_t(bytes);
        const uintptr_t first_whole = (at + kCacheLine - 1) / kCacheLine * kCacheLine;  // First line inside.
        const uintptr_t past_whole = end / kCacheLine * kCacheLine;                    // Past the last one.
        if (first_whole >= past_whole) {  // No whole line: the row is open at both ends of one or two lines.
            keep_parts(at, end, source);
            return;
        }
        keep_parts(at, first_whole, source);
        stream_lines(first_whole, source + (first_whole - at), int64_t(past_whole - first_whole) / kCacheLine);
        keep_parts(past_whole, end, source + (past_whole - at));
    }

    // Writes the parts still open with ordinary stores, and orders this
    // thread's streaming stores before whatever it does next (they are not
    // ordered like ordinary stores): called before a thread leaves its stretch.
    void finish() {
        for (Part& part : parts_)
            if (part.line != 0) write_part(part);
#if defined(__GNUC__) && defined(__x86_64__)
        _mm_sfence();
#endif
    }

private:
    // An open line: its address, which of its bytes are here, and those bytes.
    struct Part {
        uintptr_t line = 0;  // 0: the slot is free.
        uint64_t filled = 0;  // Bit b: byte b is here.
        alignas(16) unsigned char bytes[kCacheLine];
    };
    // Open lines a thread may have at once: one per head it walks side by side
    // (kHeadsSideBySide); more only costs ordinary stores for the oldest.
    static constexpr int kParts = 8;

    // Streams @p lines whole lines from @p source to the aligned address @p line.
    static void stream_lines(uintptr_t line, const unsigned char* source, int64_t lines) {
#if defined(__GNUC__) && defined(__x86_64__)
        static const bool wide = __builtin_cpu_supports("avx512f");
        if (wide) return stream_lines_avx512(line, source, lines);
        // Four 16-byte streaming stores (SSE2, any x86-64) issued back to back
        // fill one write-combining buffer, which goes to memory as one line.
        for (int64_t b = 0; b < lines * kCacheLine; b += 16)
            _mm_stream_si128(reinterpret_cast<__m128i*>(line + b),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + b)));
#else
        std::memcpy(reinterpret_cast<void*>(line), source, size_t(lines * kCacheLine));
#endif
    }
#if defined(__GNUC__) && defined(__x86_64__)
    // With AVX-512 a line is one store: nothing can flush the write-combining
    // buffer half full. (Two threads, alternating runs, medians of 5: 56 and 50%
    // of the ceiling at [1,32,4096,128] and [8,32,1024,128], against 48 and 51%
    // with four 16-byte stores.)
    __attribute__((target("avx512f"))) static void stream_lines_avx512(uintptr_t line, const unsigned char* source,
                                                                       int64_t lines) {
        for (int64_t b = 0; b < lines * kCacheLine; b += kCacheLine)
            _mm512_stream_si512(reinterpret_cast<__m512i*>(line + b), _mm512_loadu_si512(source + b));
    }
#endif

    // Keeps the bytes [at, end) (within one or two lines) until their lines are whole.
    void keep_parts(uintptr_t at, uintptr_t end, const unsigned char* source) {
        while (at < end) {
            const uintptr_t line = at - at % kCacheLine;
            const int64_t begin = int64_t(at - line);
            const int64_t count = std::min<int64_t>(kCacheLine - begin, int64_t(end - at));
            keep_part(line, begin, count, source);
            at += uintptr_t(count);
            source += count;
        }
    }

    void keep_part(uintptr_t line, int64_t begin, int64_t count, const unsigned char* source) {
        Part* part = nullptr;
        for (Part& candidate : parts_)
            if (candidate.line == line) part = &candidate;
        if (part == nullptr) {
            for (Part& candidate : parts_)
                if (candidate.line == 0 && part == nullptr) part = &candidate;
            if (part == nullptr) {  // All slots open: the oldest goes out with ordinary stores.
                part = &parts_[oldest_];
                write_part(*part);
                oldest_ = (oldest_ + 1) % kParts;
            }
            part->line = line;
        }
        std::memcpy(part->bytes + begin, source, size_t(count));
        part->filled |= ((uint64_t(1) << count) - 1) << begin;  // count < 64 here.
        if (part->filled == ~uint64_t(0)) {
            stream_lines(line, part->bytes, 1);
            *part = Part{};
        }
    }

    // Writes an open line's bytes with ordinary stores, run by run, and frees its slot.
    static void write_part(Part& part) {
        uint64_t filled = part.filled;
        while (filled != 0) {
            const int begin = std::countr_zero(filled);
            const int count = std::countr_one(filled >> begin);
            std::memcpy(reinterpret_cast<void*>(part.line + uintptr_t(begin)), part.bytes + begin, size_t(count));
            filled &= count + begin == 64 ? 0 : ~uint64_t(0) << (begin + count);
        }
        part = Part{};
    }

    Part parts_[kParts];
    int oldest_ = 0;
};

// How one slab's rows are cut into stretches of work for the threads.
//
// The "owners" of a slab are its (sequence, q or k head) pairs: every row of
// a slab belongs to one owner and one token. A stretch is a block of tokens
// times a group of owners. Stretches are numbered so that each thread's
// contiguous range of them is a contiguous stretch of memory: for [b, h, s, d]
// (a head's tokens adjacent) groups of heads vary slowest, so threads split the heads;
// for [b, s, h, d] (a token's heads adjacent) blocks of tokens vary slowest,
// so threads split the tokens. Two threads streaming two separate regions
// measured 10 to 20% faster here than both hopping over the same heads.
// Within a stretch rows are always walked token by token (RowWalk).
struct WorkSplit {
    int64_t position_rows = 1;     // Distinct rows of positions: 1 (shared) or batch.
    int64_t owners = 0;            // Owners per position row: sequences sharing it * (q + k heads).
    int64_t slab_tokens = 1;       // Tokens per slab (its table is kSlabTableBytes at most).
    int64_t slabs_per_row = 1;     // ceil(seq / slab_tokens).
    int64_t block_tokens = 1;      // Tokens per block.
    int64_t owner_groups = 1;      // Groups the owners are cut into.
    bool heads_outer = true;       // Threads split heads (true) or tokens (false).
    int64_t seq = 0;

    Slab slab(int64_t index) const {
        const int64_t first_token = (index % slabs_per_row) * slab_tokens;
        return {index / slabs_per_row, first_token, std::min(slab_tokens, seq - first_token)};
    }
    int64_t blocks(const Slab& slab) const { return (slab.tokens + block_tokens - 1) / block_tokens; }
    int64_t stretches(const Slab& slab) const { return blocks(slab) * owner_groups; }
};

WorkSplit split_work(const Plan& plan, int64_t threads) {
    WorkSplit split;
    const bool per_sequence_ids = plan.positions.per_sequence();
    split.position_rows = per_sequence_ids ? plan.batch : 1;
    split.owners = (per_sequence_ids ? 1 : plan.batch) * (plan.q.in_geometry.heads + plan.k.in_geometry.heads);
    split.seq = plan.seq;
    const int64_t table_row_bytes = 2 * int64_t(sizeof(float)) * plan.pairs;
    split.slab_tokens = std::clamp<int64_t>(kSlabTableBytes / table_row_bytes, 1, plan.seq);
    split.slabs_per_row = (plan.seq + split.slab_tokens - 1) / split.slab_tokens;
    split.heads_outer = plan.q.in_geometry.stride_seq < plan.q.in_geometry.stride_head;

    // Enough stretches for every thread, cut from whichever axis comes first.
    const int64_t target_stretches = threads * kStretchesPerThread;
    if (split.heads_outer) {
        // Heads first, kHeadsSideBySide per group at most; the slab is cut into
        // blocks only when there are too few heads for the threads.
        split.owner_groups = std::max(std::min(split.owners, target_stretches),
                                      (split.owners + kHeadsSideBySide - 1) / kHeadsSideBySide);
        const int64_t blocks = std::clamp<int64_t>((target_stretches + split.owners - 1) / split.owners, 1, split.slab_tokens);
        split.block_tokens = (split.slab_tokens + blocks - 1) / blocks;
    } else {
        split.block_tokens = std::clamp<int64_t>(kBlockTableBytes / table_row_bytes, 1, split.slab_tokens);
        const int64_t blocks = split.blocks(split.slab(0));
        split.owner_groups = std::clamp<int64_t>((target_stretches + blocks - 1) / blocks, 1, split.owners);
    }
    return split;
}

// One head row ready to rotate: where its input and output live, and the
// kernel for its operand (q and k may differ in strides).
//
// No software prefetching: the walk's few streams (RowWalk) are what the
// processor's own prefetchers follow. Asking for the next 8 rows with
// prefetch instructions, as this backend did until 2026-12-04, cost 5 to 7 ns
// per row with the rows in L2 (one thread, 2-core AMD EPYC VM) and, from
// memory, lost 6.6 points of the ceiling on average over the 24 target rows
// of bench-cpu (19 of 24 slower; 2 threads, the two builds alternating).
template <typename Storage>
struct HeadRow {
    Row<const Storage> in;
    Row<Storage> out;
    RowKernel<Storage> kernel;
};

// The rows of one stretch, in the order a thread visits them: token by token,
// and each token's owners in order, so that a token's cos/sin row is read
// once from the table and then from L1. For [b, s, h, d] that is memory's
// own order (a token's heads are adjacent); for [b, h, s, d] the stretch's few
// heads (kHeadsSideBySide) advance side by side, each its own stream.
template <typename Storage>
class RowWalk {
public:
    // A position in the walk: which owner (sequence, head) and which token.
    struct Cursor {
        int64_t sequence;
        int64_t head;   // Counting q's heads first, then k's.
        int64_t owner;  // 0 .. owners-1 within the stretch.
        int64_t token;  // 0 .. tokens-1 within the block.
        HeadRow<Storage> row;
    };

    RowWalk(const Plan& plan, const RowKernel<Storage> (&kernels)[2], const WorkSplit& split, const Slab& slab,
            int64_t stretch)
        : plan_(plan), kernels_(kernels), heads_(plan.q.in_geometry.heads + plan.k.in_geometry.heads) {
        const int64_t blocks = split.blocks(slab);
        const int64_t block = split.heads_outer ? stretch % blocks : stretch / split.owner_groups;
        const int64_t group = split.heads_outer ? stretch / blocks : stretch % split.owner_groups;
        const int64_t owner_begin = group * split.owners / split.owner_groups;
        const int64_t owner_end = (group + 1) * split.owners / split.owner_groups;
        // Shared positions: the position row is 0 and the owners span the batch.
        // Per-sequence ids: the owners are the heads of sequence position_row.
        first_sequence_ = slab.position_row + owner_begin / heads_;
        first_head_ = owner_begin % heads_;
        owners_ = owner_end - owner_begin;
        first_token_ = block * split.block_tokens;  // Within the slab.
        tokens_ = std::min(split.block_tokens, slab.tokens - first_token_);
        slab_first_token_ = slab.first_token;
    }

    int64_t size() const { return owners_ * tokens_; }

    Cursor first() const {
        Cursor cursor{first_sequence_, first_head_, 0, 0, {}};
        locate(cursor);
        return cursor;
    }

    // Row of the slab's cos/sin table that the cursor's token uses.
    int64_t table_row(const Cursor& cursor) const { return first_token_ + cursor.token; }

    // Steps @p cursor to the next row; only call it when there is one.
    //
    // The cursor is changed field by field, in place. Assigning it a whole new
    // Cursor let the compiler write the fields one by one and then copy the
    // struct with wide vector moves, which wait for those writes to finish: a
    // stall on every row. Built for the processor (ROPE_NATIVE=ON), one thread,
    // rows in L2, the 2-core VM: 42 -> 26 ns per fp32 row, 48 -> 25 per bf16
    // row; the portable build was as fast either way (31 and 27 ns).
    void advance(Cursor& cursor) const {
        ++cursor.owner;
        if (++cursor.head == heads_) cursor.head = 0, ++cursor.sequence;
        if (cursor.owner == owners_) {
            cursor.sequence = first_sequence_;
            cursor.head = first_head_;
            cursor.owner = 0;
            ++cursor.token;
        }
        locate(cursor);
    }

private:
    // Fills in the addresses of the cursor's row.
    void locate(Cursor& cursor) const {
        const int64_t q_heads = plan_.q.in_geometry.heads;
        const bool is_q = cursor.head < q_heads;
        const Operand& operand = is_q ? plan_.q : plan_.k;
        const int64_t head = is_q ? cursor.head : cursor.head - q_heads;
        const int64_t s = slab_first_token_ + first_token_ + cursor.token;
        const Geometry& in = operand.in_geometry;
        const Geometry& out = operand.out_geometry;
        HeadRow<Storage>& row = cursor.row;
        row.in.data = static_cast<const Storage*>(operand.in) + in.offset(cursor.sequence, head, s, 0);
        row.in.stride = in.stride_dim;
        row.out.data = static_cast<Storage*>(operand.out) + out.offset(cursor.sequence, head, s, 0);
        row.out.stride = out.stride_dim;
        row.kernel = kernels_[is_q ? 0 : 1];
    }

    const Plan& plan_;
    const RowKernel<Storage> (&kernels_)[2];  // For q's rows and for k's.
    int64_t heads_;                  // q heads + k heads: owners per sequence.
    int64_t first_sequence_ = 0;     // Sequence of the stretch's first owner.
    int64_t first_head_ = 0;         // Its head.
    int64_t owners_ = 0;             // Owners in the stretch.
    int64_t first_token_ = 0;        // First token of the block, within the slab.
    int64_t tokens_ = 0;             // Tokens in the block.
    int64_t slab_first_token_ = 0;   // First token of the slab, within the sequence.
};

// ---------------------------------------------------------------------------
// 4. The backend
// ---------------------------------------------------------------------------

// The cos/sin table is kept between calls (allocating 2 MiB on every call
// would cost page faults each time), one per calling thread: threads that
// call one backend object at once each fill and read their own table, so the
// object holds no state a concurrent call could disturb.
class EigenCpuBackend final : public Backend {
public:
    explicit EigenCpuBackend(const BackendOptions& options) : requested_threads_(options.threads) {}

    std::string name() const override { return "cpu-eigen"; }
    Device device() const override { return Device::host; }

    void run(const Plan& plan) override {
        dispatch_dtype(plan.dtype, [&](auto storage) { run_typed<decltype(storage)>(plan); });
    }

private:
    // Threads for this call. Read on every call (not cached at construction)
    // so that 0 keeps following OMP_NUM_THREADS / omp_set_num_threads.
    int64_t thread_count() const {
        return requested_threads_ > 0 ? requested_threads_ : int64_t(omp_get_max_threads());
    }

    template <typename Storage>
    void run_typed(const Plan& plan) {
        const WorkSplit split = split_work(plan, thread_count());
        // No thread that would get too little to do: a decode step of a small
        // model is over before a second thread has woken up.
        const int64_t bytes = (plan.q.in_geometry.numel() + plan.k.in_geometry.numel()) * 2 * int64_t(sizeof(Storage));
        const int team = int(std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, thread_count()));
        // The shared table grows here, outside the parallel region, and only
        // when a call needs more than any before it.
        const size_t table_size = size_t(split.slab_tokens * plan.pairs);
        thread_local std::vector<float> cos_table, sin_table;  // This calling thread's (see above).
        if (cos_table.size() < table_size) cos_table.resize(table_size), sin_table.resize(table_size);
        float* const cos = cos_table.data();
        float* const sin = sin_table.data();

        const RowKernel<Storage> kernels[2] = {pick_row_kernel<Storage>(plan.style, plan.q, plan.rotary_dim),
                                               pick_row_kernel<Storage>(plan.style, plan.k, plan.rotary_dim)};
        const RowShape shape{plan.pairs, plan.rotary_dim, plan.head_dim};
        const int64_t slabs = split.position_rows * split.slabs_per_row;
        // Large out-of-place float32 calls with half-split pairs stream their rows
        // out (see LineStreamer): each row is rotated into a buffer in L1, then
        // written by whole lines. Not the others (one thread on the 2-core VM,
        // alternating runs, median of 3 each, % of the ceiling): fp32 interleaved
        // rows lost 3 and 13 points at [1,32,4096,128] and [8,32,1024,128] (48 vs
        // 51, 44 vs 56), bf16 11 (32 vs 43); half-split fp32 gained 3 and 7 (56 vs
        // 53, 64 vs 57).
        const bool contiguous_outputs = plan.q.out_geometry.stride_dim == 1 && plan.k.out_geometry.stride_dim == 1;
        const int64_t output_bytes = (plan.q.out_geometry.numel() + plan.k.out_geometry.numel()) * int64_t(sizeof(Storage));
        const bool streaming = std::is_same_v<Storage, float> && plan.style == Style::half_split &&
                               plan.q.out != plan.q.in && contiguous_outputs &&
                               plan.head_dim <= kMaxWidenedDim && output_bytes > streaming_output_bytes();

#pragma omp parallel num_threads(team)
        {
            alignas(64) Storage finished_row[kMaxWidenedDim];  // This thread's, for streaming.
            LineStreamer streamer;
            for (int64_t slab_index = 0; slab_index < slabs; ++slab_index) {
                const Slab slab = split.slab(slab_index);
                // All threads compute the slab's table together; the loop's implicit
                // barrier then makes it complete and visible before any row uses it.
#pragma omp for schedule(static)
                for (int64_t t = 0; t < slab.tokens; ++t) fill_trig_row(plan, slab, t, cos, sin);

                // Static schedule: each thread one contiguous range of stretches, so one
                // contiguous stretch of memory. The implicit barrier at the end keeps
                // the table until every thread is done with it.
#pragma omp for schedule(static)
                for (int64_t stretch = 0; stretch < split.stretches(slab); ++stretch) {
                    const RowWalk<Storage> walk(plan, kernels, split, slab, stretch);
                    const int64_t rows = walk.size();
                    auto row = walk.first();
                    for (int64_t i = 0; i < rows; ++i) {
                        const int64_t entry = walk.table_row(row) * plan.pairs;
                        if (streaming) {
                            row.row.kernel(row.row.in, {finished_row, 1}, cos + entry, sin + entry, shape);
                            streamer.write(finished_row, row.row.out.data, plan.head_dim * int64_t(sizeof(Storage)));
                        } else {
                            row.row.kernel(row.row.in, row.row.out, cos + entry, sin + entry, shape);
                        }
                        if (i + 1 < rows) walk.advance(row);
                    }
                    if (streaming) streamer.finish();
                }
            }
        }
    }

    int requested_threads_;  // BackendOptions::threads (0: OpenMP default).
};

}  // namespace

std::unique_ptr<Backend> make_cpu_eigen_backend(const BackendOptions& options) {
    return std::make_unique<EigenCpuBackend>(options);
}

}  // namespace rope
