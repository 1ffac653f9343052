// cpu-eigen's kernels for contiguous rows, with the widest instructions the
// processor has. fp16/bf16 rows are widened to float32, rotated by the shared
// rotate_pair, and rounded back; converting an element costs more than rotating
// it, so those rows are bound by that arithmetic rather than by memory. float32
// rows need no conversion, but the Eigen kernel (rotate_row.cpp) is compiled for
// the portable baseline, SSE2: four floats per instruction, which leaves a row
// bound by its instructions rather than by memory on a processor that moves
// sixteen.
//
//   rotate_widened  fp16/bf16 on any processor: three plain loops the compiler
//                   vectorises, compiled for SSE2, AVX2 and AVX-512 (the
//                   processor picks);
//   rotate_f16c     fp16 where the processor converts half floats itself (F16C);
//   rotate_avx512   float32, fp16 and bf16 with AVX-512, in registers, sixteen
//                   pairs a step; bf16 rounded by the processor's own instruction
//                   where it has AVX512-BF16.
//
// All give the same bits as rotate_widened, the Eigen kernel and cpu-naive: the
// products are rounded one by one (cpu/CMakeLists.txt compiles cpu-eigen with
// -ffp-contract=off) and every conversion rounds as rope/dtype.hpp's does.
#include <cstdint>
#include <type_traits>

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>      // __get_cpuid: whether the processor has F16C (processor_has_f16c).
#include <immintrin.h>  // F16C (rotate_f16c) and AVX-512 (rotate_avx512) instructions.
#endif

#include <Eigen/Core>  // EIGEN_ALWAYS_INLINE.

#include "rope/dtype.hpp"
#include "rope/rotation.hpp"
#include "row.hpp"

namespace rope::cpu_eigen {
namespace {

// Compiled several times, for SSE2 (any x86-64), AVX2 and AVX-512; the
// program picks the widest the processor has when it starts (GCC's
// target_clones). A plain loop is then 4, 8 or 16 floats per instruction.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROPE_WIDEST_SIMD __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define ROPE_WIDEST_SIMD
#endif

// The shared rotate_pair on every pair of a contiguous float32 row: the middle
// step of the widened kernels. Inlined, so that it is compiled (and vectorised)
// for each caller's instruction set.
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
// AVX2). One instruction widens eight halves
// (vcvtph2ps) and one rounds eight floats to nearest, ties to even
// (vcvtps2ph): the same values as rope/dtype.hpp's bit arithmetic, which
// takes tens of instructions for the same eight, and fp16 rows spend more time
// in that arithmetic than in waiting for memory.
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

// Rows with AVX-512: fp16 and bf16 widened, rotated and rounded in registers,
// sixteen pairs per step, with no float32 row in memory between the three loops
// of rotate_widened; float32 rows sixteen pairs per step where Eigen's SSE2 takes
// four. Interleaved 2-byte pairs arrive as sixteen 32-bit lanes, one pair each
// (split_pairs, join_pairs); interleaved float32 pairs as two vectors of eight.
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
// AVX512-DQ (a float's class, below) is part of the target: every processor with AVX512-BW
// has it, and the kernels are picked only where the processor reports F, BW and DQ, since the
// compiler may use DQ's instructions anywhere here. The target also allows AVX512-BF16 (bf16
// conversions), for the one kernel that uses them (Bf16Instruction, below), which is picked only
// where the processor has them. The compiler emits those instructions for their intrinsics only:
// no other code here has their semantics, so the other kernels run without them.
#define ROPE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16")))

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
    // below for the whole vector.
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
// for the integer arithmetic of round_to_top_half, the arithmetic that bounds
// bf16 rows. It rounds to nearest, ties to even, and quiets a NaN as
// rope::to_bfloat16 does, but reads subnormal floats as zero: a vector with one
// takes the integer arithmetic instead (rotated values are almost never
// subnormal, so the branch is almost never taken).
struct Bf16Instruction {};
ROPE_AVX512 inline __mmask16 subnormal_lanes(__m512 values) {
    return _mm512_fpclass_ps_mask(values, 0x20);  // Class 0x20: subnormal, either sign.
}
ROPE_AVX512 inline __m512i join_pairs(__m512 x, __m512 y, Bf16Instruction /*rounding*/) {
    if ((subnormal_lanes(x) | subnormal_lanes(y)) != 0) return join_pairs(x, y, bfloat16{});
    // Rounded x then rounded y, 32 halves; then x_i and y_i side by side, a pair per lane.
    const __m512i halves = __m512i(_mm512_cvtne2ps_pbh(y, x));
    const __m512i x_then_y = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,  //
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(x_then_y, halves);
}

// Sixteen interleaved float32 pairs (32 floats, two vectors) as x and y, and back: the
// even and the odd floats of the two vectors gathered by one permutation each.
ROPE_AVX512 inline WidePairs split_pairs(__m512 low, __m512 high) {
    const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return {_mm512_permutex2var_ps(low, evens, high), _mm512_permutex2var_ps(low, odds, high)};
}
struct InterleavedFloats {
    __m512 low, high;  // Pairs 0-7 and 8-15, x then y each.
};
ROPE_AVX512 inline InterleavedFloats join_pairs(WidePairs pairs) {
    const __m512i first_eight = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i last_eight = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    return {_mm512_permutex2var_ps(pairs.x, first_eight, pairs.y), _mm512_permutex2var_ps(pairs.x, last_eight, pairs.y)};
}

// Sixteen consecutive elements of a row as float32, and back (rounded as Rounding says).
ROPE_AVX512 inline __m512 load_16(const float* at) { return _mm512_loadu_ps(at); }
template <typename Storage>
ROPE_AVX512 inline __m512 load_16(const Storage* at) {
    return widen_16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)), Storage{});
}
template <typename Rounding>
ROPE_AVX512 inline void store_16(float* at, __m512 values) {
    _mm512_storeu_ps(at, values);
}
template <typename Rounding, typename Storage>
ROPE_AVX512 inline void store_16(Storage* at, __m512 values) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), narrow_16(values, Rounding{}));
}

// x and y of sixteen half-split pairs, stored at @p x_at and @p y_at (rounded as Rounding says).
template <typename Rounding, typename Storage>
ROPE_AVX512 inline void store_pairs_16(Storage* x_at, Storage* y_at, WidePairs pairs, Rounding /*rounding*/) {
    store_16<Rounding>(x_at, pairs.x);
    store_16<Rounding>(y_at, pairs.y);
}
// bf16 by the processor's instruction: x and y rounded by one instruction (x in the low half,
// y in the high half) after one test of both for subnormals.
ROPE_AVX512 inline void store_pairs_16(bfloat16* x_at, bfloat16* y_at, WidePairs pairs, Bf16Instruction /*rounding*/) {
    if ((subnormal_lanes(pairs.x) | subnormal_lanes(pairs.y)) != 0) {
        store_pairs_16(x_at, y_at, pairs, bfloat16{});
        return;
    }
    const __m512i halves = __m512i(_mm512_cvtne2ps_pbh(pairs.y, pairs.x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x_at), _mm512_castsi512_si256(halves));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y_at), _mm512_extracti64x4_epi64(halves, 1));
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
            const WidePairs rotated = rotate_16({load_16(in.data + i), load_16(in.data + pairs + i)}, c, s);
            store_pairs_16(out.data + i, out.data + pairs + i, rotated, Rounding{});
        } else if constexpr (std::is_same_v<Storage, float>) {
            // Sixteen pairs = 32 floats in a row, two 64-byte loads and stores.
            const float* const at = in.data + 2 * i;
            const InterleavedFloats rotated =
                join_pairs(rotate_16(split_pairs(_mm512_loadu_ps(at), _mm512_loadu_ps(at + 16)), c, s));
            _mm512_storeu_ps(out.data + 2 * i, rotated.low);
            _mm512_storeu_ps(out.data + 2 * i + 16, rotated.high);
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

}  // namespace

template <typename Storage>
RowKernel<Storage> wide_row_kernel(Style style, int64_t rotary_dim) {
#ifdef ROPE_HAVE_AVX512_KERNEL
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq");
    if constexpr (std::is_same_v<Storage, bfloat16>) {
        if (avx512 && __builtin_cpu_supports("avx512bf16"))
            return style == Style::half_split ? rotate_avx512<Storage, Style::half_split, Bf16Instruction>
                                              : rotate_avx512<Storage, Style::interleaved, Bf16Instruction>;
    }
    if (avx512)
        return style == Style::half_split ? rotate_avx512<Storage, Style::half_split>
                                          : rotate_avx512<Storage, Style::interleaved>;
#endif
    if constexpr (std::is_same_v<Storage, float>) {
        return nullptr;  // The Eigen kernel: no conversion to widen, nothing else to gain.
    } else {
#ifdef ROPE_HAVE_F16C_KERNEL
        if constexpr (std::is_same_v<Storage, float16>) {
            if (rotary_dim <= kMaxWidenedDim && __builtin_cpu_supports("avx2") && processor_has_f16c())
                return style == Style::half_split ? rotate_f16c<Style::half_split> : rotate_f16c<Style::interleaved>;
        }
#endif
        if (rotary_dim <= kMaxWidenedDim)
            return style == Style::half_split ? rotate_widened<Storage, Style::half_split>
                                              : rotate_widened<Storage, Style::interleaved>;
        return nullptr;
    }
}

template RowKernel<float> wide_row_kernel<float>(Style, int64_t);
template RowKernel<float16> wide_row_kernel<float16>(Style, int64_t);
template RowKernel<bfloat16> wide_row_kernel<bfloat16>(Style, int64_t);

}  // namespace rope::cpu_eigen
