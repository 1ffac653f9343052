// rope::rerotate: a re-rotation is planned as a call of rope::apply with keys only
// and a relative PositionSource (to - from), so every backend runs it through its
// precise angle path unchanged. See rope/rerotate.hpp for what it computes.
#include "rope/rerotate.hpp"

#include <string>

#include "rope/detail/plan.hpp"
#include "rope/error.hpp"

namespace rope {
namespace {

// k's view with no heads: the plan's q, so that make_plan checks k and k_out as
// it checks them in any call and the backends rotate k's rows alone.
TensorView without_heads(TensorView view) {
    view.shape[view.layout == Layout::bshd ? 2 : 1] = 0;
    return view;
}

bool length_dependent(ScalingType type) { return type == ScalingType::dynamic || type == ScalingType::longrope; }

// Dynamic and longrope: the frequencies that both sides agree on (see rerotate's documentation).
FrequencyTable agreed_frequencies(const RopeConfig& config, const detail::PositionFacts& from,
                                  const detail::PositionFacts& to) {
    // A side whose every position is 0 turns by angle 0 with any frequencies.
    if (to.max_position == 1) return detail::build_frequency_table(config, from.max_position);
    FrequencyTable at_to = detail::build_frequency_table(config, to.max_position);
    if (from.max_position == 1) return at_to;
    const FrequencyTable at_from = detail::build_frequency_table(config, from.max_position);
    if (at_from.inv_freq != at_to.inv_freq || at_from.inv_freq_low != at_to.inv_freq_low)
        fail("scaling.type", scaling_type_name(config.scaling.type),
             "its frequencies for from (largest position + 1 = " + std::to_string(from.max_position) +
                 ") differ from those for to (" + std::to_string(to.max_position) +
                 "), and no rotation by a position difference turns one into the other: undo the rotation with "
                 "rope::apply (Direction::inverse, at from), then rotate at to with rope::apply");
    return at_to;
}

}  // namespace

void rerotate(Backend& backend, const RopeConfig& config, const RerotateArgs& args) {
    validate(config);
    const Geometry k = args.k.geometry();
    if (k.head_dim != config.head_dim)
        fail("k head_dim", k.head_dim, "must equal config.head_dim = " + std::to_string(config.head_dim));

    // The precise angle path: the only one that forms the difference before rounding
    // (and cuda-optimized's default-angle kernel, which never reads `from`, cannot run).
    RopeConfig precise = config;
    precise.precise_angles = true;
    // Keys rotated in a reordering style (HF's DeepSeek order) lie in its output order, and a
    // re-rotation keeps that layout: it turns their pairs where they lie.
    if (config.style == Style::interleaved_to_half) precise.style = Style::half_split;
    if (config.style == Style::half_to_interleaved) precise.style = Style::interleaved;
    RopeArgs call;
    call.q = call.q_out = without_heads(args.k);
    call.k = args.k;
    call.k_out = args.k_out;
    call.positions = args.to;
    call.stream = args.stream;
    Plan plan = detail::make_plan(precise, call, backend.device(), nullptr, "to");
    const detail::PositionFacts from =
        detail::check_positions("from", args.from, k.batch, k.seq, backend.device(), precise, false);
    if (!plan.empty() && length_dependent(config.scaling.type)) {
        const detail::PositionFacts to =
            detail::check_positions("to", args.to, k.batch, k.seq, backend.device(), precise, false);
        const FrequencyTable frequencies = agreed_frequencies(precise, from, to);
        plan.angles.inv_freq = frequencies.inv_freq;
        plan.angles.inv_freq_low = frequencies.inv_freq_low;
    }
    plan.positions.from = from.source;
    plan.positions.relative = true;
    // Rotated keys carry the attention factor already: the difference rotation is unscaled.
    plan.angles.cos_scale = plan.angles.sin_scale = 1.0f;
    detail::run_plan(backend, plan);
}

}  // namespace rope
