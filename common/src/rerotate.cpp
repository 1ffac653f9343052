// rope::rerotate: a re-rotation is planned as a call of rope::apply with keys only
// and a relative PositionSource (to - from), so every backend runs it through its
// precise angle path unchanged. See rope/rerotate.hpp for what it computes.
#include "rope/rerotate.hpp"

#include <string>

#include "rope/detail/kv_append_plan.hpp"
#include "rope/detail/plan.hpp"
#include "rope/detail/rerotate_plan.hpp"
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

// The plan of a re-rotation of args.k (checked as rope::apply checks its keys).
Plan detail::make_rerotate_plan(const RopeConfig& config, const RerotateArgs& args, Device device) {
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
    Plan plan = detail::make_plan(precise, call, device, nullptr, "to");
    const detail::PositionFacts from =
        detail::check_positions("from", args.from, k.batch, k.seq, device, precise, false);
    if (!plan.empty() && length_dependent(config.scaling.type)) {
        const detail::PositionFacts to =
            detail::check_positions("to", args.to, k.batch, k.seq, device, precise, false);
        const FrequencyTable frequencies = agreed_frequencies(precise, from, to);
        plan.angles.inv_freq = frequencies.inv_freq;
        plan.angles.inv_freq_low = frequencies.inv_freq_low;
    }
    plan.positions.from = from.source;
    plan.positions.relative = true;
    // Rotated keys carry the attention factor already: the difference rotation is unscaled.
    plan.angles.cos_scale = plan.angles.sin_scale = 1.0f;
    return plan;
}

void rerotate(Backend& backend, const RopeConfig& config, const RerotateArgs& args) {
    detail::run_plan(backend, detail::make_rerotate_plan(config, args, backend.device()));
}

// The cache's re-rotation is planned as rope::rerotate of a [T, heads, head_dim]
// tensor standing for the rows the slots name (its memory is never read: the
// backends reach each row through its slot), so it takes rope::rerotate's
// positions, angles and refusals unchanged; the cache and the slots are checked
// as rope::append_kv checks them.
void rerotate_cache(Backend& backend, const RopeConfig& config, const RerotateCacheArgs& args) {
    validate(config);
    const Device device = backend.device();
    const PagedCache& cache = args.k_cache;
    const SlotMapping& slots = args.slot_mapping;
    if (cache.dtype != CacheDType::model)
        fail("k_cache.dtype", cache_dtype_name(cache.dtype),
             "must be model: an FP8 cache would be dequantised, turned and quantised again, rounding twice "
             "(re-rotate keys while they are in the model dtype)");
    if (args.dtype != DType::f32 && args.dtype != DType::f16 && args.dtype != DType::bf16)
        fail("dtype", int(args.dtype), "must be fp32, fp16 or bf16");
    if (slots.count < 0) fail("slot_mapping.count", slots.count, "must be >= 0");
    if (slots.count > 0 && slots.slots == nullptr) fail("slot_mapping.slots", "null", "count > 0 needs the slots");
    if (slots.count > 0 && slots.device != device)
        fail("slot_mapping.device", device_name(slots.device), "this backend runs on " + std::string(device_name(device)));
    const int64_t entries = slots.count;
    Geometry rows{};
    rows.heads = cache.heads;
    rows.head_dim = config.head_dim;
    detail::check_cache("k_cache", cache, rows, "config", args.dtype, device);
    if (cache.heads < 1) fail("k_cache.heads", cache.heads, "must be >= 1");
    if (detail::cache_overlaps(cache, args.dtype, slots.slots, entries * 8))
        fail("k_cache.data", cache.data, "overlaps slot_mapping.slots (the cache is written while the slots are read)");
    int64_t slot_limit = 0;
    __builtin_mul_overflow(cache.pages, cache.page_size, &slot_limit);  // Checked by check_cache.
    detail::check_host_slots(slots, slot_limit);

    // The stand-in: dense [entries, heads, head_dim] at the cache's address (aligned,
    // on its device), never dereferenced.
    const TensorView stand_in = TensorView::contiguous(cache.data, args.dtype, device, Layout::thd,
                                                       {entries, cache.heads, config.head_dim, 1});
    KvAppendPlan plan;
    plan.rope = detail::make_rerotate_plan(config, RerotateArgs{stand_in, stand_in, args.from, args.to, args.stream},
                                           device);
    plan.slots = slots.slots;
    plan.slot_count = entries;
    plan.page_size = cache.page_size;
    plan.slot_limit = slot_limit;
    plan.k_cache = CacheTarget{cache.data,        cache.dtype,       cache.heads, cache.head_dim, cache.stride_page,
                               cache.stride_slot, cache.stride_head, nullptr,     0};
    const BackendLimits limits = backend.limits();
    if (plan.rope.rotary_dim > limits.max_rotary_dim)
        fail("rotary_dim", plan.rope.rotary_dim,
             backend.name() + " accepts rotary_dim <= " + std::to_string(limits.max_rotary_dim));
    if (plan.empty()) return;
    backend.run_rerotate_cache(plan);
}

void Backend::run_rerotate_cache(const KvAppendPlan&) {
    fail("backend", name(), "does not implement rope::rerotate_cache");
}

}  // namespace rope
