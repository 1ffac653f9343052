// cpu-naive: RoPE as plain loops. This is the readable specification: every
// other backend must produce what this one produces (up to float32 rounding).
// The lesson: tutorials/01_naive_cpu/chapter.md.
//
// For every sequence b, head h, token s and pair i:
//   position = the token's position on pair i's axis  (PositionSource::at; one
//                                                axis for text, three for M-RoPE)
//   angle = position * theta_i                   (float32, rope_angle; or the
//                                                precise mode's rope_angle_precise)
//   (cos, sin) of the angle, scaled              (rotation_factors; or read from
//                                                the caller's cos/sin table)
//   (x, y) = the pair's two features             (pair_elements)
//   (x, y) <- (x cos - y sin, y cos + x sin)     (rotate_pair; sin negated for the inverse),
//                                                read and written in place by rotate_pair_in_memory
// and the features past rotary_dim are copied through unchanged. HF's DeepSeek
// order (Style::interleaved_to_half) writes pair i to (i, i + rotary_dim/2), its
// reverse to (2i, 2i+1) (output_pair_elements), once the whole row is read. A
// rotary window past feature 0 arrives as plans of its own (detail::window_parts).
#include <memory>
#include <vector>

#include "rope/detail/backend_factories.hpp"
#include "rope/detail/kv_append_plan.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/detail/plan.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "rope/rotation.hpp"

namespace rope {
namespace {

// Rotates every head of one operand (q or k). Storage is the element type in memory.
template <typename Storage>
void rotate_operand(const Plan& plan, const Operand& operand) {
    const auto* in = static_cast<const Storage*>(operand.in);
    auto* out = static_cast<Storage*>(operand.out);
    const Geometry& g = operand.in_geometry;
    const Geometry& o = operand.out_geometry;

    // A reordering style (HF's DeepSeek order) writes a pair where other pairs are read: the
    // rotated row is gathered here first and written once all of it is read (safe in place).
    const bool reordered = reorders(plan.style);
    std::vector<float> rotated(reordered ? size_t(plan.rotary_dim) : 0);

    for (int64_t b = 0; b < g.batch; ++b) {
        for (int64_t h = 0; h < g.heads; ++h) {
            for (int64_t s = 0; s < g.seq; ++s) {
                for (int64_t i = 0; reordered && i < plan.pairs; ++i) {
                    const int64_t position = plan.positions.at(b, s, plan.angles.pair_axis[size_t(i)]);
                    float cos_angle, sin_angle;
                    rotation_factors(plan.angles, position, i, cos_angle, sin_angle);
                    const PairIndex pair = pair_elements(plan.style, plan.rotary_dim, i);
                    float x = to_float(in[g.offset(b, h, s, pair.first)]);
                    float y = to_float(in[g.offset(b, h, s, pair.second)]);
                    rotate_pair(x, y, cos_angle, sin_angle);
                    const PairIndex to = output_pair_elements(plan.style, plan.rotary_dim, i);
                    rotated[size_t(to.first)] = x;
                    rotated[size_t(to.second)] = y;
                }
                for (int64_t d = 0; reordered && d < plan.rotary_dim; ++d)
                    out[o.offset(b, h, s, d)] = from_float<Storage>(rotated[size_t(d)]);
                for (int64_t i = 0; !reordered && i < plan.pairs; ++i) {
                    const int64_t position = plan.positions.at(b, s, plan.angles.pair_axis[size_t(i)]);
                    float cos_angle, sin_angle;
                    rotation_factors(plan.angles, position, i, cos_angle, sin_angle);
                    const PairIndex pair = pair_elements(plan.style, plan.rotary_dim, i);
                    rotate_pair_in_memory(in, g, out, o, b, h, s, pair, cos_angle, sin_angle);
                }
                // Partial rotary: the remaining features pass through untouched.
                for (int64_t d = plan.rotary_dim; d < g.head_dim; ++d)
                    out[o.offset(b, h, s, d)] = in[g.offset(b, h, s, d)];
            }
        }
    }
}

// Pair i of head h of token t of an append's q or k, read and rotated in float32 (the
// token's position on the pair's axis, rotation_factors, rotate_pair): the values both
// the model-dtype output and an FP8 target are made from.
template <typename Storage>
PairIndex rotated_pair(const Plan& rope, const Operand& operand, int64_t t, int64_t h, int64_t i, float& x, float& y) {
    const auto* in = static_cast<const Storage*>(operand.in);
    const Geometry& g = operand.in_geometry;
    float cos_angle, sin_angle;
    rotation_factors(rope.angles, rope.positions.at(0, t, rope.angles.pair_axis[size_t(i)]), i, cos_angle, sin_angle);
    const PairIndex pair = pair_elements(rope.style, rope.rotary_dim, i);
    x = to_float(in[g.offset(0, h, t, pair.first)]);
    y = to_float(in[g.offset(0, h, t, pair.second)]);
    rotate_pair(x, y, cos_angle, sin_angle);
    return pair;
}

// q's FP8 output: every token's q rows rotated in float32 and quantised, never rounded to
// the model dtype first; the pass-through features of partial rotary quantised as they are.
template <typename Storage>
void quantise_q_rows(const KvAppendPlan& plan) {
    const Plan& rope = plan.rope;
    const auto* q = static_cast<const Storage*>(rope.q.in);
    const Geometry& g = rope.q.in_geometry;
    for (int64_t t = 0; t < plan.tokens(); ++t) {
        for (int64_t h = 0; h < g.heads; ++h) {
            const int64_t row = plan.q_fp8.row_offset(t, 1, h);
            for (int64_t i = 0; i < rope.pairs; ++i) {
                float x, y;
                const PairIndex pair = rotated_pair<Storage>(rope, rope.q, t, h, i, x, y);
                store_cache_element(plan.q_fp8, row + pair.first, h, Storage{}, x);
                store_cache_element(plan.q_fp8, row + pair.second, h, Storage{}, y);
            }
            for (int64_t d = rope.rotary_dim; d < g.head_dim; ++d)
                store_cache_element(plan.q_fp8, row + d, h, Storage{}, to_float(q[g.offset(0, h, t, d)]));
        }
    }
}

// RoPE + KV append (rope::append_kv), the fused decode step of a serving engine.
// The lesson: tutorials/14_kv_cache_append/chapter.md. For every token t:
//   q_out[t] = RoPE(q[t])                                   (rotate_operand, as above)
//   k_out[t] = RoPE(k[t])                                   (the live key: always written)
//   slot = slot_mapping[t] if t < slot_count, else -1       (KvAppendPlan::slot_of)
//   if 0 <= slot < pages * page_size:                       (else padding: nothing cached)
//     k_cache[slot / page_size, slot % page_size] = k_out[t]   (FP8: quantised from float32)
//     v_cache[slot / page_size, slot % page_size] = v[t]       (unrotated)
// The angle comes from the positions, never from the slot. With an FP8 q output
// (KvAppendPlan::quantises_q) q's rotation goes there instead of q_out:
//   q_fp8[t] = quantize_fp8(RoPE(q[t]) in float32, scale)   (store_cache_element; q unchanged)
template <typename Storage>
void append_rows(const KvAppendPlan& plan) {
    const Plan& rope = plan.rope;
    if (plan.quantises_q())
        quantise_q_rows<Storage>(plan);
    else
        rotate_operand<Storage>(rope, rope.q);
    const auto* k = static_cast<const Storage*>(rope.k.in);
    auto* k_out = static_cast<Storage*>(rope.k.out);
    const Geometry& g = rope.k.in_geometry;
    const Geometry& o = rope.k.out_geometry;
    const auto* v = static_cast<const Storage*>(plan.v);
    for (int64_t t = 0; t < plan.tokens(); ++t) {
        const int64_t slot = plan.slot_of(t);
        for (int64_t h = 0; h < g.heads; ++h) {
            const int64_t k_row = slot < 0 ? 0 : plan.k_cache.row_offset(slot, plan.page_size, h);
            for (int64_t i = 0; i < rope.pairs; ++i) {
                float x, y;
                const PairIndex pair = rotated_pair<Storage>(rope, rope.k, t, h, i, x, y);
                const Storage x_stored = from_float<Storage>(x), y_stored = from_float<Storage>(y);
                k_out[o.offset(0, h, t, pair.first)] = x_stored;
                k_out[o.offset(0, h, t, pair.second)] = y_stored;
                if (slot < 0) continue;
                store_cache_element(plan.k_cache, k_row + pair.first, h, x_stored, x);
                store_cache_element(plan.k_cache, k_row + pair.second, h, y_stored, y);
            }
            for (int64_t d = rope.rotary_dim; d < g.head_dim; ++d) {  // Partial rotary: passed through.
                const Storage value = k[g.offset(0, h, t, d)];
                k_out[o.offset(0, h, t, d)] = value;
                if (slot >= 0) store_cache_element(plan.k_cache, k_row + d, h, value, to_float(value));
            }
            if (slot < 0) continue;
            const int64_t v_row = plan.v_cache.row_offset(slot, plan.page_size, h);
            for (int64_t d = 0; d < plan.v_geometry.head_dim; ++d) {
                const Storage value = v[plan.v_geometry.offset(0, h, t, d)];
                store_cache_element(plan.v_cache, v_row + d, h, value, to_float(value));
            }
        }
    }
}

// Re-rotation of cached keys (rope::rerotate_cache). The lesson:
// tutorials/17_rerotation/chapter.md. For every entry t with slot = slot_of(t) >= 0,
// every head h of the slot and every pair i:
//   delta = to[t] - from[t] on pair i's axis                (PositionSource::at, relative)
//   (cos, sin) of the precise angle of delta, unscaled      (rotation_factors)
//   the pair of cache row (slot, h), turned in place        (rotate_pair; the pairs of the
//                                                            window from rotary_offset on)
// Features outside the rotary window, and rows no slot names, are not touched.
template <typename Storage>
void rerotate_cache_rows(const KvAppendPlan& plan, int64_t first, int64_t last) {
    const Plan& rope = plan.rope;
    auto* cache = static_cast<Storage*>(plan.k_cache.data);
    for (int64_t t = first; t < last; ++t) {
        const int64_t slot = plan.slot_of(t);
        if (slot < 0) continue;  // Padding, or a slot past the cache.
        for (int64_t h = 0; h < plan.k_cache.heads; ++h) {
            Storage* const row = cache + plan.k_cache.row_offset(slot, plan.page_size, h) + rope.rotary_offset;
            for (int64_t i = 0; i < rope.pairs; ++i) {
                float cos_angle, sin_angle;
                rotation_factors(rope.angles, rope.positions.at(0, t, rope.angles.pair_axis[size_t(i)]), i, cos_angle,
                                 sin_angle);
                const PairIndex pair = pair_elements(rope.style, rope.rotary_dim, i);
                float x = to_float(row[pair.first]);
                float y = to_float(row[pair.second]);
                rotate_pair(x, y, cos_angle, sin_angle);
                row[pair.first] = from_float<Storage>(x);
                row[pair.second] = from_float<Storage>(y);
            }
        }
    }
}

class NaiveCpuBackend final : public Backend {
public:
    std::string name() const override { return "cpu-naive"; }
    Device device() const override { return Device::host; }
    void run(const Plan& plan) override {
        dispatch_dtype(plan.dtype, [&](auto storage) {
            using Storage = decltype(storage);
            rotate_operand<Storage>(plan, plan.q);
            rotate_operand<Storage>(plan, plan.k);
        });
    }
    void run_qk_norm(const QkNormPlan& plan) override { detail::run_qk_norm_cpu_naive(plan); }  // naive_qk_norm.cpp
    void run_kv_append(const KvAppendPlan& plan) override {
        dispatch_dtype(plan.rope.dtype, [&](auto storage) { append_rows<decltype(storage)>(plan); });
    }
    void run_rerotate_cache(const KvAppendPlan& plan) override {
        detail::rerotate_cache_cpu(plan, 0, plan.tokens());
    }
};

}  // namespace

void detail::rerotate_cache_cpu(const KvAppendPlan& plan, int64_t first, int64_t last) {
    dispatch_dtype(plan.rope.dtype, [&](auto storage) { rerotate_cache_rows<decltype(storage)>(plan, first, last); });
}

std::unique_ptr<Backend> make_cpu_naive_backend() { return std::make_unique<NaiveCpuBackend>(); }

}  // namespace rope
