// Float64 RoPE for tests, written independently of the backends (see oracle.hpp).
#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace oracle {

namespace {

long element_index(const rope::TensorView& view, long b, long h, long s, long d) {
    // Strides are given in the order the layout names its axes.
    switch (view.layout) {
        case rope::Layout::bhsd:
            return b * view.strides[0] + h * view.strides[1] + s * view.strides[2] + d * view.strides[3];
        case rope::Layout::bshd:
            return b * view.strides[0] + s * view.strides[1] + h * view.strides[2] + d * view.strides[3];
        case rope::Layout::thd:  // [tokens, heads, dim]: one packed sequence, b is always 0.
            return s * view.strides[0] + h * view.strides[1] + d * view.strides[2];
    }
    throw std::invalid_argument("oracle: unknown layout");
}

struct Sizes {
    long batch, heads, seq, dim;
};

Sizes sizes_of(const rope::TensorView& view) {
    switch (view.layout) {
        case rope::Layout::bhsd: return {view.shape[0], view.shape[1], view.shape[2], view.shape[3]};
        case rope::Layout::bshd: return {view.shape[0], view.shape[2], view.shape[1], view.shape[3]};
        case rope::Layout::thd: return {1, view.shape[1], view.shape[0], view.shape[2]};
    }
    throw std::invalid_argument("oracle: unknown layout");
}

// The position of every token on every axis, [batch][seq][axes], read from
// the user-level Positions by their definition (oracle.hpp).
std::vector<long> position_table(const rope::Positions& p, long batch, long seq, long axes) {
    if (p.device != rope::Device::host && (p.ids != nullptr || p.cu_seqlens != nullptr))
        throw std::invalid_argument("oracle: positions must live on the host");
    std::vector<long> table(size_t(batch * seq * axes));
    auto at = [&](long b, long s, long a) -> long& { return table[size_t((b * seq + s) * axes + a)]; };
    if (p.ids != nullptr) {
        if (p.length != seq || p.cp_size != 1) throw std::invalid_argument("oracle: ids do not fit the tensor");
        for (long b = 0; b < batch; ++b)
            for (long s = 0; s < seq; ++s)
                for (long a = 0; a < axes; ++a) {
                    const long row = p.axes == 1 ? 0 : a;  // One row serves every axis of a single-axis call.
                    at(b, s, a) = p.ids[(row * p.rows + (p.rows == 1 ? 0 : b)) * p.length + s];
                }
        return table;
    }
    if (p.cu_seqlens != nullptr) {
        if (batch != 1) throw std::invalid_argument("oracle: packed sequences need batch 1");
        for (long k = 0; k < p.sequences; ++k) {
            const long first = p.cu_seqlens[k];
            const long start = p.starts != nullptr ? p.starts[k] : p.offset;
            const std::vector<long> held = held_tokens(p.cu_seqlens[k + 1] - first, p.cp_size, p.cp_rank);
            for (size_t j = 0; j < held.size(); ++j)
                for (long a = 0; a < axes; ++a) at(0, first + long(j), a) = start + held[j];
        }
        return table;
    }
    const std::vector<long> held = held_tokens(seq, p.cp_size, p.cp_rank);
    for (long b = 0; b < batch; ++b)
        for (long s = 0; s < seq; ++s)
            for (long a = 0; a < axes; ++a) at(b, s, a) = p.offset + held[size_t(s)];
    return table;
}

void deepseek_yarn(const rope::RopeConfig& config, long rotary, std::vector<double>& theta);

// Which axis turns each pair, and its theta, from RopeConfig::multi_axis's definition.
struct PairRule {
    std::vector<long> axis;
    std::vector<double> theta;
};

PairRule pair_rule(const rope::RopeConfig& config, long rotary) {
    const long pairs = rotary / 2;
    const rope::MultiAxis& multi = config.multi_axis;
    PairRule rule{std::vector<long>(size_t(pairs), 0), std::vector<double>(size_t(pairs))};
    std::vector<long> index_in_axis(static_cast<size_t>(pairs), 0);
    for (long j = 0; j < pairs; ++j) index_in_axis[size_t(j)] = j;
    long total = 0;
    for (int64_t n : multi.sections) total += n;
    if (multi.assignment != rope::AxisAssignment::single && total != pairs)
        throw std::invalid_argument("oracle: sections must sum to rotary_dim/2");

    if (multi.assignment == rope::AxisAssignment::mrope_interleaved) {
        // Everything temporal, then deal height pairs 1, 4, 7, ... and width pairs 2, 5, 8, ...
        for (long a = 1; a <= 2; ++a)
            for (long k = 0; k < multi.sections[size_t(a)]; ++k) {
                if (a + 3 * k >= pairs) throw std::invalid_argument("oracle: interleaved section too long");
                rule.axis[size_t(a + 3 * k)] = a;
            }
    } else if (multi.assignment != rope::AxisAssignment::single) {
        // Runs: sections[0] pairs of axis 0, then sections[1] of axis 1, ...
        long j = 0;
        for (size_t a = 0; a < multi.sections.size(); ++a)
            for (long k = 0; k < multi.sections[a]; ++k, ++j) {
                rule.axis[size_t(j)] = long(a);
                index_in_axis[size_t(j)] = k;
            }
    }
    const double log_base = std::log(config.base);
    for (long j = 0; j < pairs; ++j) {
        // Axial: each axis is a RoPE of its own over 2 * sections[a] features.
        const bool axial = multi.assignment == rope::AxisAssignment::axial;
        const double exponent = axial ? double(index_in_axis[size_t(j)]) / double(multi.sections[size_t(rule.axis[size_t(j)])])
                                      : 2.0 * double(j) / double(rotary);
        rule.theta[size_t(j)] = std::exp(-exponent * log_base);
        if (config.scaling.type == rope::ScalingType::linear) rule.theta[size_t(j)] /= config.scaling.factor;
    }
    if (config.scaling.type == rope::ScalingType::deepseek_yarn) deepseek_yarn(config, rotary, rule.theta);
    return rule;
}

// DeepSeek's YaRN, from the YaRN paper's "NTK-by-parts" as DeepSeek's reference code
// writes it: pair j keeps theta_j when its wavelength fits more than beta_fast
// times into the original context, is divided by factor below beta_slow, and a
// linear blend in j between the two (bounds floored / ceiled when truncating).
void deepseek_yarn(const rope::RopeConfig& config, long rotary, std::vector<double>& theta) {
    const rope::Scaling& s = config.scaling;
    const double pi = 3.14159265358979323846;
    // The pair index j at which 2 pi / theta_j * rotations = original context.
    auto bound = [&](double rotations) {
        return double(rotary) * std::log(double(s.original_max_position_embeddings) / (rotations * 2 * pi)) /
               (2 * std::log(config.base));
    };
    double low = bound(s.beta_fast), high = bound(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(rotary - 1));
    if (high == low) high += 0.001;
    for (size_t j = 0; j < theta.size(); ++j) {
        const double blend = std::min(1.0, std::max(0.0, (double(j) - low) / (high - low)));  // 1: interpolate
        theta[j] = (1 - blend) * theta[j] + blend * theta[j] / s.factor;
    }
}

// The magnitude of cos and sin: deepseek_yarn's mscale(factor, mscale) / mscale(factor, mscale_all_dim).
double magnitude(const rope::Scaling& s) {
    if (s.type != rope::ScalingType::deepseek_yarn) return 1.0;
    auto mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 1 + 0.1 * m * std::log(s.factor); };
    return mscale(s.mscale) / mscale(s.mscale_all_dim);
}

std::vector<double> rotate_with(const rope::RopeConfig& config, const rope::TensorView& x,
                                const rope::Positions& positions, rope::Direction direction,
                                const rope::CosSinCache* table, const std::vector<double>* input = nullptr) {
    // The oracle's independence is in the rotation; the other scaling types'
    // frequencies are checked against HuggingFace's own (tests/scaling_test.cpp),
    // so refuse them here rather than silently rotating with unscaled ones.
    if (config.scaling.type != rope::ScalingType::none && config.scaling.type != rope::ScalingType::linear &&
        config.scaling.type != rope::ScalingType::deepseek_yarn)
        throw std::invalid_argument("oracle::rotate supports scaling none, linear and deepseek_yarn only");
    if (table != nullptr && (table->device != rope::Device::host || table->dtype != rope::DType::f32))
        throw std::invalid_argument("oracle: the cos/sin table must be float32 on the host");
    const Sizes n = sizes_of(x);
    const long offset = config.rotary_offset;  // The window: features [offset, offset + rotary).
    const long rotary = config.rotary_dim == 0 ? config.head_dim - offset : config.rotary_dim;
    const long pairs = rotary / 2;
    const long axes = config.multi_axis.assignment == rope::AxisAssignment::single ? 1 : long(config.multi_axis.sections.size());
    const PairRule rule = pair_rule(config, rotary);
    const std::vector<long> position = position_table(positions, n.batch, n.seq, axes);
    const double sign = direction == rope::Direction::forward ? 1.0 : -1.0;

    // cos + i sin of pair j at position p: computed, or read from the caller's table.
    const double scale = magnitude(config.scaling);
    auto turn = [&](long p, long j) -> std::complex<double> {
        if (table == nullptr) return scale * std::polar(1.0, sign * double(p) * rule.theta[size_t(j)]);
        if (p < 0 || p >= table->rows) return {NAN, NAN};
        const long stride = table->row_stride == 0 ? table->cols : table->row_stride;
        const float* row = static_cast<const float*>(table->data) + p * stride;
        return {double(row[j]), sign * double(row[pairs + j])};
    };

    const std::vector<double> in = input != nullptr ? *input : values(x);
    std::vector<double> out = in;
    // Pair j is read at (2j, 2j+1) for GPT-J, at (j, j + pairs) for NeoX, and written where
    // it was read. HF's DeepSeek order reads at (2j, 2j+1) and writes at (j, j + pairs);
    // half_to_interleaved the reverse; the inverse of either reads where its forward wrote
    // and writes where it read (the transpose).
    const bool forward = direction == rope::Direction::forward;
    const bool to_half = config.style == rope::Style::interleaved_to_half;
    const bool to_interleaved = config.style == rope::Style::half_to_interleaved;
    const bool read_adjacent =
        config.style == rope::Style::interleaved || (to_half && forward) || (to_interleaved && !forward);
    const bool write_adjacent =
        config.style == rope::Style::interleaved || (to_half && !forward) || (to_interleaved && forward);
    for (long b = 0; b < n.batch; ++b) {
        for (long s = 0; s < n.seq; ++s) {
            for (long h = 0; h < n.heads; ++h) {
                const double* source = in.data() + ((b * n.heads + h) * n.seq + s) * n.dim + offset;
                double* row = out.data() + ((b * n.heads + h) * n.seq + s) * n.dim + offset;
                for (long j = 0; j < pairs; ++j) {
                    const long p = position[size_t((b * n.seq + s) * axes + rule.axis[size_t(j)])];
                    const std::complex<double> turned =
                        std::complex<double>(source[read_adjacent ? 2 * j : j],
                                             source[read_adjacent ? 2 * j + 1 : j + pairs]) *
                        turn(p, j);
                    row[write_adjacent ? 2 * j : j] = turned.real();
                    row[write_adjacent ? 2 * j + 1 : j + pairs] = turned.imag();
                }
            }
        }
    }
    return out;
}

}  // namespace

std::vector<long> held_tokens(long local_length, long cp_size, long cp_rank) {
    std::vector<long> held;
    if (cp_size == 1) {
        for (long t = 0; t < local_length; ++t) held.push_back(t);
        return held;
    }
    const long chunk = local_length / 2;
    for (long c : {cp_rank, 2 * cp_size - 1 - cp_rank})
        for (long t = c * chunk; t < (c + 1) * chunk; ++t) held.push_back(t);
    return held;
}

double read(const rope::TensorView& view, long b, long h, long s, long d) {
    const long i = element_index(view, b, h, s, d);
    switch (view.dtype) {
        case rope::DType::f32: return static_cast<const float*>(view.data)[i];
        case rope::DType::f16: {
            _Float16 half;
            std::memcpy(&half, static_cast<const uint16_t*>(view.data) + i, 2);
            return static_cast<double>(half);
        }
        case rope::DType::bf16: {
            // bfloat16 is the upper half of a float32.
            const uint32_t bits = uint32_t(static_cast<const uint16_t*>(view.data)[i]) << 16;
            float value;
            std::memcpy(&value, &bits, 4);
            return value;
        }
    }
    return NAN;
}

std::vector<double> values(const rope::TensorView& view) {
    const Sizes n = sizes_of(view);
    std::vector<double> out;
    out.reserve(size_t(n.batch * n.heads * n.seq * n.dim));
    for (long b = 0; b < n.batch; ++b)
        for (long h = 0; h < n.heads; ++h)
            for (long s = 0; s < n.seq; ++s)
                for (long d = 0; d < n.dim; ++d) out.push_back(read(view, b, h, s, d));
    return out;
}

std::vector<double> rotate(const rope::RopeConfig& config, const rope::TensorView& x,
                           const rope::Positions& positions, rope::Direction direction) {
    return rotate_with(config, x, positions, direction, nullptr);
}

std::vector<double> rotate(const rope::RopeConfig& config, const rope::TensorView& x,
                           const rope::Positions& positions, rope::Direction direction,
                           const rope::CosSinCache& table) {
    // The table is the rotation (docs/api.md): a scaling of the config, whose
    // frequencies and attention factor the table already holds, is not applied on top.
    rope::RopeConfig unscaled = config;
    if (table.data != nullptr) unscaled.scaling = rope::Scaling{};
    return rotate_with(unscaled, x, positions, direction, table.data != nullptr ? &table : nullptr);
}

std::vector<double> qk_norm(const rope::RopeConfig& config, const rope::TensorView& x, const std::vector<double>& weight,
                            bool gemma, bool across_heads, double eps, const rope::Positions& positions,
                            const rope::CosSinCache& table) {
    // RMSNorm from its definition, in float64: y = x / sqrt(mean(x^2) + eps) * w (or * (1 + w)),
    // the mean over one head row, or over every head of the token.
    const Sizes n = sizes_of(x);
    std::vector<double> normalized = values(x);  // dense (b, h, s, d)
    const long group_heads = across_heads ? n.heads : 1;
    for (long b = 0; b < n.batch; ++b)
        for (long s = 0; s < n.seq; ++s)
            for (long h0 = 0; h0 < n.heads; h0 += group_heads) {
                auto at = [&](long h, long d) -> double& {
                    return normalized[size_t(((b * n.heads + h) * n.seq + s) * n.dim + d)];
                };
                double squares = 0;
                for (long h = h0; h < h0 + group_heads; ++h)
                    for (long d = 0; d < n.dim; ++d) squares += at(h, d) * at(h, d);
                const double scale = 1.0 / std::sqrt(squares / double(group_heads * n.dim) + eps);
                for (long h = h0; h < h0 + group_heads; ++h)
                    for (long d = 0; d < n.dim; ++d) {
                        const double w = weight[size_t((across_heads ? h * n.dim : 0) + d)];
                        at(h, d) = at(h, d) * scale * (gemma ? 1.0 + w : w);
                    }
            }
    rope::RopeConfig unscaled = config;
    if (table.data != nullptr) unscaled.scaling = rope::Scaling{};
    return rotate_with(unscaled, x, positions, rope::Direction::forward, table.data != nullptr ? &table : nullptr,
                       &normalized);
}

std::vector<double> rerotate(const rope::RopeConfig& config, const rope::TensorView& x, const rope::Positions& from,
                             const rope::Positions& to) {
    if (config.scaling.type != rope::ScalingType::none && config.scaling.type != rope::ScalingType::linear)
        throw std::invalid_argument("oracle::rerotate supports scaling none and linear only");
    const Sizes n = sizes_of(x);
    const long rotary = config.rotary_dim == 0 ? config.head_dim : config.rotary_dim;
    const long pairs = rotary / 2;
    const long axes = config.multi_axis.assignment == rope::AxisAssignment::single ? 1 : long(config.multi_axis.sections.size());
    const PairRule rule = pair_rule(config, rotary);
    const std::vector<long> start = position_table(from, n.batch, n.seq, axes);
    const std::vector<long> end = position_table(to, n.batch, n.seq, axes);
    std::vector<double> out = values(x);
    for (long b = 0; b < n.batch; ++b)
        for (long s = 0; s < n.seq; ++s)
            for (long h = 0; h < n.heads; ++h) {
                double* row = out.data() + ((b * n.heads + h) * n.seq + s) * n.dim;
                for (long j = 0; j < pairs; ++j) {
                    const size_t at = size_t((b * n.seq + s) * axes + rule.axis[size_t(j)]);
                    const long double theta = rule.theta[size_t(j)];
                    const long double angle = (long double)(end[at]) * theta - (long double)(start[at]) * theta;
                    const bool interleaved = config.style == rope::Style::interleaved;
                    const long first = interleaved ? 2 * j : j;
                    const long second = interleaved ? 2 * j + 1 : j + pairs;
                    const std::complex<long double> turned =
                        std::complex<long double>(row[first], row[second]) * std::polar<long double>(1.0L, angle);
                    row[first] = double(turned.real());
                    row[second] = double(turned.imag());
                }
            }
    return out;
}

Appended append_kv(const rope::RopeConfig& config, const rope::TensorView& q, const rope::TensorView& k,
                   const rope::TensorView& v, const rope::Positions& positions, const std::vector<long>& slots,
                   const rope::PagedCache& k_cache, const rope::PagedCache& v_cache,
                   const rope::CosSinCache& table) {
    Appended result;
    result.q = rotate(config, q, positions, rope::Direction::forward, table);
    result.k = rotate(config, k, positions, rope::Direction::forward, table);
    const Sizes nk = sizes_of(k), nv = sizes_of(v);
    for (long t = 0; t < long(slots.size()) && t < nk.seq; ++t) {
        const long slot = slots[size_t(t)];
        // Padding: rotated, not cached. A slot past the cache is written nowhere either (what
        // the CUDA kernels do with a device slot validation could not read; host slots are refused).
        if (slot < 0 || slot >= k_cache.pages * k_cache.page_size) continue;
        const long page = slot / k_cache.page_size, in_page = slot % k_cache.page_size;
        for (long h = 0; h < nk.heads; ++h) {
            const long k_row = page * k_cache.stride_page + in_page * k_cache.stride_slot + h * k_cache.stride_head;
            for (long d = 0; d < nk.dim; ++d)
                result.k_cache.push_back({k_row + d, h, t, d, result.k[size_t((h * nk.seq + t) * nk.dim + d)]});
            const long v_row = page * v_cache.stride_page + in_page * v_cache.stride_slot + h * v_cache.stride_head;
            for (long d = 0; d < nv.dim; ++d) result.v_cache.push_back({v_row + d, h, t, d, read(v, 0, h, t, d)});
        }
    }
    return result;
}

ErrorStats compare(const std::vector<double>& got, const std::vector<double>& want) {
    ErrorStats stats;
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        if (!std::isfinite(got[i])) {
            ++stats.non_finite;
            continue;
        }
        const double diff = got[i] - want[i];
        diff2 += diff * diff;
        ref2 += want[i] * want[i];
        stats.max_abs = std::max(stats.max_abs, std::fabs(diff));
    }
    if (got.size() != want.size()) stats.non_finite += long(got.size() > want.size() ? got.size() - want.size() : want.size() - got.size());
    stats.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    return stats;
}

}  // namespace oracle
