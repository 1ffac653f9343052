// Chapter 6: RoPE in real models.
//
// The same rotation, in the situations a model's code actually meets:
//   1. partial rotary: only the first rotary_dim features of a head rotate;
//   2. positions and the KV cache: decoding one token at a time with a position
//      offset, and padded batches with explicit position ids;
//   3. grouped-query attention: k with fewer heads than q, in one call;
//   4. frequency scaling for long contexts: linear, dynamic NTK, YaRN, Llama 3.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

constexpr double kPi = 3.14159265358979323846;

// Rotates q (and k, which may have fewer heads, or none) in place on the host.
void rotate(rope::Backend& backend, const rope::RopeConfig& config, std::vector<float>& q, const tutorial::Shape& qs,
            std::vector<float>& k, const tutorial::Shape& ks, rope::Positions positions = {},
            rope::Layout layout = rope::Layout::bshd) {
    auto q_view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, layout, qs.in(layout));
    auto k_view = rope::TensorView::contiguous(k.data(), rope::DType::f32, rope::Device::host, layout, ks.in(layout));
    rope::apply(backend, config, rope::RopeArgs::in_place(q_view, k_view, positions));
}

// The rows [first, first + count) of a [tokens, heads, head_dim] (bshd, batch 1) tensor.
std::vector<float> token_rows(const std::vector<float>& x, int64_t first, int64_t count, int64_t row_size) {
    return {x.begin() + first * row_size, x.begin() + (first + count) * row_size};
}

bool identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && tutorial::max_abs_difference(a, b) == 0.0;
}

}  // namespace

int main() {
    tutorial::print_title(6, "Real models",
                          "partial rotary, cache offsets, padded batches, grouped-query heads and long-context "
                          "scaling are all the same rotation with different bookkeeping");
    tutorial::Checks checks;
    auto backend = rope::make_backend("cpu-naive");

    tutorial::print_section("1. Partial rotary: Phi-2 rotates 32 of 80 features");
    {
        // Phi-2: head_dim 80, partial_rotary_factor 0.4, so rotary_dim = 32.
        rope::RopeConfig config;
        //! [partial rotary]
        config.head_dim = 80;
        config.rotary_dim = 32;
        //! [partial rotary]
        const tutorial::Shape shape{.batch = 1, .heads = 4, .seq = 64, .head_dim = 80};
        const std::vector<float> input = tutorial::random_values(size_t(shape.numel()), 61);
        std::vector<float> q = input, no_k;
        rotate(*backend, config, q, shape, no_k, {.batch = 1, .heads = 0, .seq = 64, .head_dim = 80});
        bool tail_untouched = true;
        for (size_t row = 0; row < q.size() / 80; ++row)
            for (size_t d = 32; d < 80; ++d) tail_untouched = tail_untouched && q[row * 80 + d] == input[row * 80 + d];
        tutorial::Formula formula;
        formula.rotary_dim = 32;
        formula.layout = rope::Layout::bshd;
        const double error = tutorial::relative_l2(q, tutorial::rope_float64(input, shape, formula));
        std::printf("features 0..31 rotate (theta_i = base^(-2i/32): the exponent uses rotary_dim, not head_dim);\n"
                    "features 32..79 pass through. Relative L2 against float64: %.1e\n", error);
        checks.expect(tail_untouched && error < 2e-6,
                      "partial rotary: features past rotary_dim are bit for bit unchanged, the rest match float64");
        // A classic bug elsewhere: rotary_dim > head_dim silently rotating into the next head.
        rope::RopeConfig too_wide = config;
        too_wide.rotary_dim = 96;
        try {
            rope::validate(too_wide);
            checks.expect(false, "rotary_dim = 96 > head_dim = 80 is rejected");
        } catch (const rope::Error& error) {
            std::printf("rotary_dim 96 with head_dim 80 -> %s\n", error.what());
            checks.expect(true, "rotary_dim > head_dim is rejected, not silently run into the next head");
        }
    }

    tutorial::print_section("2. Positions: the KV cache and padded batches");
    rope::RopeConfig llama;  // LLaMA-3-8B: head_dim 128, base 500000, 32 query heads, 8 key heads.
    llama.head_dim = 128;
    llama.base = 500000.0;
    const int64_t prompt = 24, generated = 8, total = prompt + generated;
    {
        // The whole sequence at once...
        const tutorial::Shape qs{.batch = 1, .heads = 32, .seq = total, .head_dim = 128};
        const tutorial::Shape ks{.batch = 1, .heads = 8, .seq = total, .head_dim = 128};
        const std::vector<float> q_input = tutorial::random_values(size_t(qs.numel()), 62);
        const std::vector<float> k_input = tutorial::random_values(size_t(ks.numel()), 63);
        std::vector<float> q_full = q_input, k_full = k_input;
        rotate(*backend, llama, q_full, qs, k_full, ks);
        // ...and as a model generates it: the prompt (positions 0..23), then one token
        // per step at position 24, 25, ...: the offset is the number of tokens in the cache.
        const int64_t q_row = 32 * 128, k_row = 8 * 128;
        std::vector<float> q_steps = token_rows(q_input, 0, prompt, q_row);
        std::vector<float> k_steps = token_rows(k_input, 0, prompt, k_row);
        rotate(*backend, llama, q_steps, {.batch = 1, .heads = 32, .seq = prompt, .head_dim = 128}, k_steps,
               {.batch = 1, .heads = 8, .seq = prompt, .head_dim = 128});
        //! [decode with an offset]
        for (int64_t step = 0; step < generated; ++step) {
            std::vector<float> q_token = token_rows(q_input, prompt + step, 1, q_row);
            std::vector<float> k_token = token_rows(k_input, prompt + step, 1, k_row);
            rotate(*backend, llama, q_token, {.batch = 1, .heads = 32, .seq = 1, .head_dim = 128}, k_token,
                   {.batch = 1, .heads = 8, .seq = 1, .head_dim = 128}, rope::Positions::starting_at(prompt + step));
            q_steps.insert(q_steps.end(), q_token.begin(), q_token.end());
            k_steps.insert(k_steps.end(), k_token.begin(), k_token.end());  // The KV cache grows by one rotated key.
        }
        //! [decode with an offset]
        std::printf("prompt of %ld tokens, then %ld decode steps with Positions::starting_at(%ld + step)\n",
                    long(prompt), long(generated), long(prompt));
        checks.expect(identical(q_steps, q_full) && identical(k_steps, k_full),
                      "token-by-token decode with offsets equals the full-sequence rotation, bit for bit");
    }
    {
        // A batch of two prompts padded on the left to the same length: sequence 1 has
        // 5 pad tokens. HuggingFace gives its real tokens positions 0, 1, ... (position_ids
        // from the attention mask), so each sequence needs its own row of ids.
        const int64_t seq = 16, pads = 5;
        std::vector<int64_t> ids(2 * seq);
        for (int64_t s = 0; s < seq; ++s) {
            ids[size_t(s)] = s;                                     // Sequence 0: no padding.
            ids[size_t(seq + s)] = s < pads ? 0 : s - pads;         // Sequence 1: pads get 0 (masked anyway).
        }
        const tutorial::Shape qs{.batch = 2, .heads = 4, .seq = seq, .head_dim = 128};
        const std::vector<float> input = tutorial::random_values(size_t(qs.numel()), 64);
        std::vector<float> padded = input, none;
        //! [ids per sequence]
        rotate(*backend, llama, padded, qs, none, {.batch = 2, .heads = 0, .seq = seq, .head_dim = 128},
               rope::Positions::per_sequence(ids.data(), 2, seq));
        //! [ids per sequence]
        // Sequence 1's real tokens, rotated alone without padding, at positions 0..10.
        const int64_t row = 4 * 128;
        std::vector<float> alone(input.begin() + (seq + pads) * row, input.end());
        rotate(*backend, llama, alone, {.batch = 1, .heads = 4, .seq = seq - pads, .head_dim = 128}, none,
               {.batch = 1, .heads = 0, .seq = seq - pads, .head_dim = 128});
        const std::vector<float> padded_real(padded.begin() + (seq + pads) * row, padded.end());
        std::printf("left-padded batch: sequence 1 = %ld pads + %ld tokens, ids per sequence\n", long(pads),
                    long(seq - pads));
        checks.expect(identical(padded_real, alone),
                      "with per-sequence ids, a padded sequence's tokens rotate as if it were alone");
    }

    tutorial::print_section("3. Grouped-query attention: 32 query heads, 8 key heads, one call");
    {
        const tutorial::Shape qs{.batch = 1, .heads = 32, .seq = 64, .head_dim = 128};
        const tutorial::Shape ks{.batch = 1, .heads = 8, .seq = 64, .head_dim = 128};
        const std::vector<float> q_input = tutorial::random_values(size_t(qs.numel()), 65);
        const std::vector<float> k_input = tutorial::random_values(size_t(ks.numel()), 66);
        std::vector<float> q_together = q_input, k_together = k_input;
        rotate(*backend, llama, q_together, qs, k_together, ks);
        std::vector<float> q_alone = q_input, k_alone = k_input, none;
        rotate(*backend, llama, q_alone, qs, none, {.batch = 1, .heads = 0, .seq = 64, .head_dim = 128});
        rotate(*backend, llama, k_alone, ks, none, {.batch = 1, .heads = 0, .seq = 64, .head_dim = 128});
        std::printf("each key head serves 4 query heads at attention time, but is rotated once, here, and\n"
                    "cached rotated: k moves a quarter of q's bytes\n");
        checks.expect(identical(q_together, q_alone) && identical(k_together, k_alone),
                      "one call with 32 q heads and 8 k heads equals rotating each tensor on its own");
    }

    tutorial::print_section("4. Long contexts: scaling the frequencies");
    // A model trained on 4096 tokens, run on 16384: factor 4. Each scaling type only
    // changes the frequency table (theta_i and an attention factor); the backends are untouched.
    const int64_t trained = 4096, target = 16384;
    auto table_for = [&](rope::ScalingType type, int64_t length) {
        rope::RopeConfig config;
        config.head_dim = 128;
        config.base = 10000.0;
        //! [scaling]
        config.scaling.type = type;
        if (type != rope::ScalingType::none) {
            config.scaling.factor = 4.0;
            config.scaling.original_max_position_embeddings = trained;
        }
        //! [scaling]
        return rope::make_frequency_table(config, length);
    };
    const rope::FrequencyTable plain = table_for(rope::ScalingType::none, target);
    std::printf("head_dim 128, base 10000, trained on %ld tokens, factor 4. Wavelength (tokens) of pairs:\n",
                long(trained));
    std::printf("%-24s %9s %9s %9s %9s %9s %9s\n", "type", "pair 0", "16", "32", "48", "63", "attn");
    struct Variant {
        const char* name;
        rope::ScalingType type;
        int64_t length;
    };
    const Variant variants[] = {{"none", rope::ScalingType::none, target},
                                {"linear", rope::ScalingType::linear, target},
                                {"dynamic (call of 4096)", rope::ScalingType::dynamic, trained},
                                {"dynamic (call of 16384)", rope::ScalingType::dynamic, target},
                                {"yarn", rope::ScalingType::yarn, target},
                                {"llama3", rope::ScalingType::llama3, target}};
    for (const Variant& v : variants) {
        const rope::FrequencyTable table = table_for(v.type, v.length);
        std::printf("%-24s", v.name);
        for (int i : {0, 16, 32, 48, 63}) std::printf(" %9.0f", 2 * kPi / table.inv_freq[size_t(i)]);
        std::printf(" %9.4f\n", table.attention_factor);
    }
    std::printf("Slow pairs (long wavelengths) would show phases never seen in training at 16384 tokens;\n"
                "every type slows them down. Linear also slows the fast pairs, blurring neighbours; YaRN and\n"
                "Llama 3 leave pairs that turn many times within 4096 tokens alone.\n");

    // Checks of each rule against its definition, not against the library's code.
    {
        // Linear: position m with factor 4 turns exactly like position m / 4 without scaling.
        rope::RopeConfig linear;
        linear.head_dim = 128;
        linear.scaling = {.type = rope::ScalingType::linear, .factor = 4.0};
        rope::RopeConfig none;
        none.head_dim = 128;
        const tutorial::Shape one{.batch = 1, .heads = 1, .seq = 1, .head_dim = 128};
        std::vector<float> a = tutorial::random_values(128, 67), b = a, no_k;
        const tutorial::Shape no_heads{.batch = 1, .heads = 0, .seq = 1, .head_dim = 128};
        rotate(*backend, linear, a, one, no_k, no_heads, rope::Positions::starting_at(4 * 3001));
        rotate(*backend, none, b, one, no_k, no_heads, rope::Positions::starting_at(3001));
        checks.expect(identical(a, b), "linear: position 12004 with factor 4 rotates exactly like position 3001");
    }
    {
        const rope::FrequencyTable short_call = table_for(rope::ScalingType::dynamic, trained);
        const rope::FrequencyTable long_call = table_for(rope::ScalingType::dynamic, target);
        checks.expect(short_call.inv_freq == plain.inv_freq && long_call.inv_freq[63] < plain.inv_freq[63],
                      "dynamic: unchanged up to the trained length, slower beyond it");
        std::printf("dynamic NTK's frequencies depend on the call's length: keys cached during a short call\n"
                    "were rotated with other angles than a long call would use (a known KV-cache caveat).\n");
    }
    {
        const rope::FrequencyTable yarn = table_for(rope::ScalingType::yarn, target);
        // Pairs that turn more than beta_fast = 32 times within the trained length keep theta_i;
        // those turning fewer than beta_slow = 1 times are divided by the factor.
        bool ok = true;
        for (int i = 0; i < 64; ++i) {
            const double turns = trained * double(plain.inv_freq[size_t(i)]) / (2 * kPi);
            const double ratio = double(yarn.inv_freq[size_t(i)]) / plain.inv_freq[size_t(i)];
            if (turns > 32.0 * 1.5) ok = ok && std::fabs(ratio - 1.0) < 1e-6;
            if (turns < 1.0 / 1.5) ok = ok && std::fabs(ratio - 0.25) < 1e-6;
        }
        const double expected_attention = 0.1 * std::log(4.0) + 1.0;
        checks.expect(ok && std::fabs(yarn.attention_factor - expected_attention) < 1e-6,
                      "yarn: fast pairs kept, slow pairs divided by 4, attention factor 0.1 ln 4 + 1 = " +
                          tutorial::fixed(expected_attention, 4));
    }
    {
        rope::RopeConfig config;  // Llama 3.1: base 500000, factor 8, trained on 8192, low 1, high 4.
        config.head_dim = 128;
        config.base = 500000.0;
        config.scaling = {.type = rope::ScalingType::llama3, .factor = 8.0, .original_max_position_embeddings = 8192,
                          .low_freq_factor = 1.0, .high_freq_factor = 4.0};
        const rope::FrequencyTable table = rope::make_frequency_table(config, 131072);
        config.scaling = {};
        const rope::FrequencyTable base = rope::make_frequency_table(config, 131072);
        bool ok = true;
        for (int i = 0; i < 64; ++i) {
            const double wavelength = 2 * kPi / base.inv_freq[size_t(i)];
            const double ratio = double(table.inv_freq[size_t(i)]) / base.inv_freq[size_t(i)];
            if (wavelength < 8192.0 / 4.0) ok = ok && std::fabs(ratio - 1.0) < 1e-6;
            if (wavelength > 8192.0 / 1.0) ok = ok && std::fabs(ratio - 0.125) < 1e-6;
        }
        checks.expect(ok, "llama3 (Llama 3.1's settings): wavelengths under 2048 kept, over 8192 divided by 8");
    }
    std::printf("The library's tables also match HuggingFace transformers' own (golden vectors in tests/).\n");

    return checks.finish("cache-offset decode = full rotation, bit for bit; YaRN x4: slowest wavelength " +
                         tutorial::fixed(2 * kPi / plain.inv_freq[63], 0) + " -> " +
                         tutorial::fixed(2 * kPi / table_for(rope::ScalingType::yarn, target).inv_freq[63], 0) + " tokens");
}
