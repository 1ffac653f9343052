// Chapter 15: QK-norm before RoPE.
//
// Qwen3, Gemma 3 and OLMo 2 normalise every head of q and k with an RMSNorm and
// then rotate. One fused call (rope::apply_qk_norm) does both. The chapter checks
// it on every backend available here against the formula in float64 (the norm
// written below, the rotation tutorial.hpp's rope_float64), shows how much the
// models' own bf16 rounding points move the result (the HF modes), and reproduces
// two bugs that run and quietly degrade (marked THE BUG), each with the check
// that catches it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

constexpr int64_t kSeq = 16, kQHeads = 4, kKHeads = 2, kHeadDim = 128, kOffset = 300;
constexpr double kEps = 1e-6;

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = rope::to_bfloat16(values[i]).bits;
    return bits;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& bits) {
    std::vector<float> values(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) values[i] = rope::to_float(rope::bfloat16{bits[i]});
    return values;
}

/// The RMSNorm from its definition, in float64: each group (one head row, or all heads of a
/// token) divided by sqrt(mean(x^2) + eps), times w (gemma: 1 + w), then RoPE in float64.
std::vector<double> norm_then_rope(const std::vector<float>& x, int64_t heads, const std::vector<float>& weight,
                                   bool gemma, bool across, const rope::RopeConfig& config) {
    std::vector<double> normalized(x.size());
    const int64_t group = across ? heads : 1;
    for (int64_t s = 0; s < kSeq; ++s)
        for (int64_t h0 = 0; h0 < heads; h0 += group) {
            const size_t first = size_t((s * heads + h0) * kHeadDim), count = size_t(group * kHeadDim);
            double squares = 0;
            for (size_t e = first; e < first + count; ++e) squares += double(x[e]) * x[e];
            const double inverse = 1.0 / std::sqrt(squares / double(count) + kEps);
            for (size_t e = first; e < first + count; ++e) {
                const double w = weight[across ? e - size_t(s * heads * kHeadDim) : (e - first) % kHeadDim];
                normalized[e] = x[e] * inverse * (gemma ? 1.0 + w : w);
            }
        }
    // rope_float64 reads floats; the rotation is linear, so the float64 values are rotated as
    // their float32 part plus the remainder, each exactly representable.
    std::vector<float> high(x.size()), low(x.size());
    for (size_t e = 0; e < x.size(); ++e) {
        high[e] = float(normalized[e]);
        low[e] = float(normalized[e] - double(high[e]));
    }
    const tutorial::Shape shape{1, heads, kSeq, kHeadDim};
    tutorial::Formula formula = tutorial::Formula::of(config);
    formula.layout = rope::Layout::bshd;
    formula.offset = kOffset;
    std::vector<double> out = tutorial::rope_float64(high, shape, formula);
    const std::vector<double> rest = tutorial::rope_float64(low, shape, formula);
    for (size_t e = 0; e < out.size(); ++e) out[e] += rest[e];
    return out;
}

struct Result {
    std::vector<float> q, k;
    std::string error;
};

/// One fused call on @p backend: bf16 q [seq, 4, 128] and k [seq, 2, 128] (bshd, batch 1),
/// float32 weights, out of place into NaN-poisoned outputs.
Result run(rope::Backend& backend, const rope::RopeConfig& config, const std::vector<uint16_t>& q,
           const std::vector<uint16_t>& k, const std::vector<float>& q_weight, const std::vector<float>& k_weight,
           rope::QkNormKind kind, rope::QkNormRounding rounding) {
    const rope::Device device = backend.device();
    const uint16_t nan_bits = 0x7fc0;
    const rope::Buffer q_in = tutorial::on_device(device, q), k_in = tutorial::on_device(device, k);
    const rope::Buffer q_out = tutorial::on_device(device, std::vector<uint16_t>(q.size(), nan_bits));
    const rope::Buffer k_out = tutorial::on_device(device, std::vector<uint16_t>(k.size(), nan_bits));
    const rope::Buffer qw = tutorial::on_device(device, q_weight), kw = tutorial::on_device(device, k_weight);
    auto view = [&](const rope::Buffer& buffer, int64_t heads) {
        return rope::TensorView::contiguous(buffer.data(), rope::DType::bf16, device, rope::Layout::bshd,
                                            {1, kSeq, heads, kHeadDim});
    };
    rope::QkNormArgs args;
    args.q = view(q_in, kQHeads);
    args.k = view(k_in, kKHeads);
    args.q_out = view(q_out, kQHeads);
    args.k_out = view(k_out, kKHeads);
    args.q_weight = {qw.data(), rope::DType::f32, device, int64_t(q_weight.size())};
    args.k_weight = {kw.data(), rope::DType::f32, device, int64_t(k_weight.size())};
    args.kind = kind;
    args.rounding = rounding;
    args.eps = kEps;
    args.positions = rope::Positions::starting_at(kOffset);
    Result result;
    try {
        rope::apply_qk_norm(backend, config, args);
        if (device == rope::Device::cuda) rope::cuda_synchronize();
    } catch (const rope::Error& error) {
        result.error = error.what();
    }
    std::vector<uint16_t> q_bits(q.size()), k_bits(k.size());
    q_out.copy_to_host(q_bits.data());
    k_out.copy_to_host(k_bits.data());
    result.q = from_bf16(q_bits);
    result.k = from_bf16(k_bits);
    return result;
}

/// Elements of @p got farther than one bf16 ulp from @p want rounded to bf16 (and than 2e-6:
/// float32's own rounding of values of order 1, seen where x cos - y sin cancels to nearly 0).
int64_t beyond_one_ulp(const std::vector<float>& got, const std::vector<double>& want) {
    int64_t count = 0;
    for (size_t e = 0; e < got.size(); ++e) {
        const float rounded = rope::to_float(rope::to_bfloat16(float(want[e])));
        const double ulp = std::max(rounded == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(rounded) - 7), 2e-6);
        if (!(std::fabs(double(got[e]) - rounded) <= ulp)) ++count;
    }
    return count;
}

double fraction_different(const std::vector<float>& a, const std::vector<float>& b) {
    int64_t differ = 0;
    for (size_t e = 0; e < a.size(); ++e) differ += a[e] != b[e];
    return double(differ) / double(a.size());
}

}  // namespace

int main() {
    tutorial::print_title(15, "QK-norm before RoPE",
                          "an RMSNorm per head (or across heads) then the rotation, fused; where the model's code "
                          "rounds to bf16 changes a quarter of the elements, so rope offers both the float32 result "
                          "and each model's HF rounding, bit for bit");
    tutorial::Checks checks;
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");

    rope::RopeConfig config;  // Qwen3's RoPE: half-split, head_dim 128, base 1e6
    config.head_dim = kHeadDim;
    config.base = 1000000.0;
    // Positions from 300: the default float32 angle is off by up to position * 6e-8 radians
    // (chapter 7), more than one ulp of a result near zero. The precise angles are not.
    config.precise_angles = true;
    // Projections of two scales (a norm must not care), stored in bf16.
    std::vector<float> q_values = tutorial::random_values(size_t(kSeq * kQHeads * kHeadDim), 1501);
    for (size_t e = 0; e < q_values.size(); ++e) q_values[e] *= 8.0f;
    const std::vector<uint16_t> q = to_bf16(q_values);
    const std::vector<uint16_t> k = to_bf16(tutorial::random_values(size_t(kSeq * kKHeads * kHeadDim), 1502));
    const std::vector<float> q_exact = from_bf16(q), k_exact = from_bf16(k);
    // Llama-style weights near 1; Gemma's are stored as offsets near 0; OLMo 2's cover all heads.
    std::vector<float> llama = tutorial::random_values(kHeadDim, 1503), gemma = llama;
    for (float& w : llama) w = 1.0f + 0.5f * w;
    for (float& w : gemma) w = 0.5f * w;
    std::vector<float> olmo_q = tutorial::random_values(size_t(kQHeads * kHeadDim), 1504), olmo_k = olmo_q;
    olmo_k.resize(size_t(kKHeads * kHeadDim));
    for (float& w : olmo_q) w = 1.0f + 0.5f * w;
    for (float& w : olmo_k) w = 1.0f + 0.5f * w;

    struct Model {
        const char* name;
        rope::QkNormKind kind;
        rope::QkNormRounding rounding;
        const std::vector<float>& q_weight;
        const std::vector<float>& k_weight;
    };
    const Model models[] = {
        {"Qwen3 (weight * x_hat)", rope::QkNormKind::per_head, rope::QkNormRounding::hf_qwen3, llama, llama},
        {"Gemma 3 (x_hat * (1 + weight))", rope::QkNormKind::per_head_gemma, rope::QkNormRounding::hf_gemma3, gemma,
         gemma},
        {"OLMo 2 (across heads)", rope::QkNormKind::across_heads, rope::QkNormRounding::hf_olmo2, olmo_q, olmo_k},
    };

    tutorial::print_section("The float32 mode against float64, on every backend");
    for (const Model& m : models) {
        const bool g = m.kind == rope::QkNormKind::per_head_gemma, across = m.kind == rope::QkNormKind::across_heads;
        const std::vector<double> q_want = norm_then_rope(q_exact, kQHeads, m.q_weight, g, across, config);
        const std::vector<double> k_want = norm_then_rope(k_exact, kKHeads, m.k_weight, g, across, config);
        for (const auto& backend : backends.available) {
            const Result r = run(*backend, config, q, k, m.q_weight, m.k_weight, m.kind, rope::QkNormRounding::float32);
            const int64_t off = beyond_one_ulp(r.q, q_want) + beyond_one_ulp(r.k, k_want);
            checks.expect(r.error.empty() && off == 0, backend->name() + ", " + m.name +
                                                            ": every element within one bf16 ulp of float64 (" +
                                                            std::to_string(off) + " beyond)");
        }
    }

    tutorial::print_section("Where each model rounds (cpu-naive; every backend gives the same bits)");
    std::printf("  %-32s %22s %16s %16s\n", "model", "elements != float32", "rel L2 (HF)", "rel L2 (fp32)");
    double smallest_share = 1.0, largest_share = 0.0;
    for (const Model& m : models) {
        const bool g = m.kind == rope::QkNormKind::per_head_gemma, across = m.kind == rope::QkNormKind::across_heads;
        const std::vector<double> q_want = norm_then_rope(q_exact, kQHeads, m.q_weight, g, across, config);
        const Result exact = run(*naive, config, q, k, m.q_weight, m.k_weight, m.kind, rope::QkNormRounding::float32);
        const Result hf = run(*naive, config, q, k, m.q_weight, m.k_weight, m.kind, m.rounding);
        const double share = fraction_different(hf.q, exact.q);
        smallest_share = std::min(smallest_share, share);
        largest_share = std::max(largest_share, share);
        const double hf_error = tutorial::relative_l2(hf.q, q_want), exact_error = tutorial::relative_l2(exact.q, q_want);
        std::printf("  %-32s %21.1f%% %16s %16s\n", m.name, 100.0 * share, tutorial::sci(hf_error).c_str(),
                    tutorial::sci(exact_error).c_str());
        checks.expect(share > 0.05 && hf_error < 1e-2 && exact_error < hf_error,
                      std::string(m.name) + ": HF's rounding moves " + tutorial::fixed(100 * share, 1) +
                          "% of the elements by an ulp or more; float32 is the closer to float64");
        for (const auto& backend : backends.available) {
            if (backend->name() == "cpu-naive") continue;
            const Result other = run(*backend, config, q, k, m.q_weight, m.k_weight, m.kind, m.rounding);
            // CUDA's sincosf and the host's cos/sin may differ in float32's last bit; rounded to bf16,
            // that moves an operand of the rotation (below 4) by one ulp, 2^-6, also where it cancels.
            const bool same = other.q == hf.q && other.k == hf.k;
            const bool close = tutorial::max_abs_difference(other.q, hf.q) <= 1.0 / 64 &&
                               tutorial::max_abs_difference(other.k, hf.k) <= 1.0 / 64;
            checks.expect(backend->device() == rope::Device::host ? same : close,
                          backend->name() + ", " + m.name + ": the HF rounding " +
                              (backend->device() == rope::Device::host
                                   ? "bit for bit cpu-naive's"
                                   : "within one ulp of the rotation's operands of cpu-naive's"));
        }
    }

    tutorial::print_section("Bugs, on cpu-naive");
    {
        const std::vector<double> want = norm_then_rope(q_exact, kQHeads, gemma, true, false, config);
        // THE BUG: Gemma's weight applied Llama-style (weight * x_hat): its weights are offsets from 1.
        const Result llama_style = run(*naive, config, q, k, gemma, gemma, rope::QkNormKind::per_head,
                                       rope::QkNormRounding::float32);
        const double error = tutorial::relative_l2(llama_style.q, want);
        std::printf("  Gemma weights read as Llama's: rel L2 %s against float64\n", tutorial::sci(error).c_str());
        bugs.expect_caught(checks, error > 1e-2, "Gemma's (1 + weight) read as weight: caught against float64");
    }
    {
        const std::vector<double> want = norm_then_rope(q_exact, kQHeads, olmo_q, false, true, config);
        // THE BUG: OLMo 2 run as a per-head norm (each head's own mean), reading the first head_dim
        // values of its weight: it runs, and every head is normalised by the wrong mean.
        const Result per_head = run(*naive, config, q, k, std::vector<float>(olmo_q.begin(), olmo_q.begin() + kHeadDim),
                                    std::vector<float>(olmo_k.begin(), olmo_k.begin() + kHeadDim),
                                    rope::QkNormKind::per_head, rope::QkNormRounding::float32);
        const double error = tutorial::relative_l2(per_head.q, want);
        std::printf("  OLMo 2 normalised per head: rel L2 %s against float64\n", tutorial::sci(error).c_str());
        bugs.expect_caught(checks, error > 1e-2, "OLMo 2's across-heads norm done per head: caught against float64");
    }
    {
        // Bad input: a weight of the wrong length is refused, naming it; nothing is written.
        std::vector<float> short_weight(kHeadDim - 1, 1.0f);
        const Result refused = run(*naive, config, q, k, short_weight, llama, rope::QkNormKind::per_head,
                                   rope::QkNormRounding::float32);
        std::printf("  weight of 127 values -> %s\n", refused.error.c_str());
        bool untouched = true;
        for (const float v : refused.q) untouched = untouched && std::isnan(v);
        checks.expect(refused.error.find("q_weight.size") != std::string::npos && untouched,
                      "a weight of the wrong length: a rope::Error naming q_weight.size, nothing written");
    }
    return checks.finish("HF's bf16 rounding differs from the float32 result in " +
                         tutorial::fixed(100 * smallest_share, 0) + "% to " + tutorial::fixed(100 * largest_share, 0) +
                         "% of the elements; " + bugs.text());
}
