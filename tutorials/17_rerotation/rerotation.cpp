// Chapter 17: re-rotating cached keys.
//
// A KV cache holds keys already rotated at their positions. Evicting tokens
// (StreamingLLM: keep the attention sinks and a recent window), shifting a
// window or compacting a context moves the kept keys to new positions: each
// must turn by angle(to) - angle(from). The chapter moves a cache's keys with
// rope::rerotate on every backend available here and checks them against the
// float64 formula of the raw keys at their new positions (tutorial.hpp), then
// reproduces what engines do instead (marked THE BUG): un-rotating and
// re-rotating with float32 angles, and many small in-place corrections.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

constexpr int64_t kHeads = 2, kHeadDim = 64;

/// Keys [1, seq, kHeads, kHeadDim] (bshd), float32, on the host.
rope::TensorView keys_view(std::vector<float>& keys, rope::Device device = rope::Device::host, void* data = nullptr) {
    const int64_t seq = int64_t(keys.size()) / (kHeads * kHeadDim);
    return rope::TensorView::contiguous(data ? data : keys.data(), rope::DType::f32, device, rope::Layout::bshd,
                                        {1, seq, kHeads, kHeadDim});
}

/// The keys rotated at @p ids by rope::apply (what a model writes into its cache);
/// Direction::inverse un-rotates them instead.
std::vector<float> rotated(const rope::RopeConfig& config, std::vector<float> keys, const std::vector<int64_t>& ids,
                           rope::Direction direction = rope::Direction::forward) {
    auto naive = rope::make_backend("cpu-naive");
    rope::TensorView k = keys_view(keys), no_q = k;
    no_q.shape[2] = 0;  // Keys only.
    const int64_t seq = k.shape[1];
    rope::apply(*naive, config, rope::RopeArgs::in_place(no_q, k, rope::Positions::shared(ids.data(), seq), direction));
    return keys;
}

//! [rerotate]
/// Keys rotated at positions @p from, turned to positions @p to on @p backend: the
/// keys and both id rows copied to the backend's memory, re-rotated in place, copied back.
std::vector<float> rerotated(rope::Backend& backend, const rope::RopeConfig& config, std::vector<float> keys,
                             const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
    const rope::Device device = backend.device();
    rope::Buffer k(device, keys.size() * sizeof(float)), from_ids(device, from.size() * 8), to_ids(device, to.size() * 8);
    k.copy_from_host(keys.data());
    from_ids.copy_from_host(from.data());
    to_ids.copy_from_host(to.data());
    const int64_t seq = int64_t(from.size());
    rope::rerotate(backend, config,
                   rope::RerotateArgs::in_place(
                       keys_view(keys, device, k.data()),
                       rope::Positions::shared(static_cast<const int64_t*>(from_ids.data()), seq, device),
                       rope::Positions::shared(static_cast<const int64_t*>(to_ids.data()), seq, device)));
    k.copy_to_host(keys.data());
    return keys;
}
//! [rerotate]

/// The float64 formula: the raw keys rotated at @p ids (tutorial.hpp, independent of rope).
std::vector<double> exact(const rope::RopeConfig& config, const std::vector<float>& raw, const std::vector<int64_t>& ids) {
    tutorial::Formula f = tutorial::Formula::of(config);
    f.ids = &ids;
    f.layout = rope::Layout::bshd;
    const tutorial::Shape shape{1, kHeads, int64_t(ids.size()), kHeadDim};
    return tutorial::rope_float64(raw, shape, f);
}

/// Rows @p rows (tokens) of keys [seq, kHeads, kHeadDim].
std::vector<float> take(const std::vector<float>& keys, const std::vector<int64_t>& rows) {
    std::vector<float> kept;
    for (int64_t row : rows)
        kept.insert(kept.end(), keys.begin() + row * kHeads * kHeadDim, keys.begin() + (row + 1) * kHeads * kHeadDim);
    return kept;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(17, "Re-rotating cached keys",
                          "kept keys move to new positions in one rotation by angle(to) - angle(from), its angle "
                          "difference formed in double before rounding: one rotation's error however far and however "
                          "often keys move; float32 un-rotate-then-rotate and successive corrections drift");
    (void)argc, (void)argv;  // No figure data.
    tutorial::Checks checks;
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    const rope::RopeConfig config{.head_dim = kHeadDim};

    tutorial::print_section("Eviction with attention sinks");
    // A cache of 24 tokens, rotated at positions 0..23. Keep the 4 sinks and the 12 most
    // recent tokens; evict tokens 4..11. The kept keys move to positions 0..15.
    const int64_t cached = 24;
    std::vector<int64_t> all(cached);
    std::iota(all.begin(), all.end(), 0);
    const std::vector<float> raw = tutorial::random_values(size_t(cached * kHeads * kHeadDim), 1701);
    const std::vector<float> cache = rotated(config, raw, all);
    const std::vector<int64_t> from{0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};
    std::vector<int64_t> to(from.size());
    std::iota(to.begin(), to.end(), 0);
    std::printf("kept tokens at positions %s\n  move to positions    %s\n", tutorial::join(from).c_str(),
                tutorial::join(to).c_str());
    const std::vector<float> kept = take(cache, from);
    const std::vector<double> want = exact(config, take(raw, from), to);
    tutorial::expect_everywhere(checks, backends, "re-rotated keys = raw keys rotated at the new positions (float64)",
                                [&](rope::Backend& backend) {
                                    const tutorial::Distance d = tutorial::distance(rerotated(backend, config, kept, from, to), want);
                                    return tutorial::Verdict{d.within(), d.text()};
                                });

    tutorial::print_section("Far along a long context");
    // The same move 1,000,000 positions later: the keys sit at 1e6 + from and go to 1e6 + to.
    const int64_t far = 1'000'000;
    std::vector<int64_t> far_from = from, far_to = to;
    for (int64_t& p : far_from) p += far;
    for (int64_t& p : far_to) p += far;
    rope::RopeConfig precise = config;
    precise.precise_angles = true;  // The cache itself rotated accurately, so that only the move is measured.
    const std::vector<float> far_cache = rotated(precise, take(raw, from), far_from);
    const std::vector<double> far_want = exact(config, take(raw, from), far_to);
    auto naive = rope::make_backend("cpu-naive");
    const tutorial::Distance direct = tutorial::distance(rerotated(*naive, config, far_cache, far_from, far_to), far_want);
    std::printf("  rope::rerotate:                              %s\n", direct.text().c_str());
    checks.expect(direct.within(), "one re-rotation near position 1e6 is as accurate as one near 0");
    // THE BUG: un-rotate at `from`, then rotate at `to`, both with float32 angles
    // float32(position) * theta_i: each off by up to position * 6e-8 radians (chapter 7).
    const std::vector<float> twice =
        rotated(config, rotated(config, far_cache, far_from, rope::Direction::inverse), far_to);
    const tutorial::Distance two_rotations = tutorial::distance(twice, far_want);
    std::printf("  un-rotate then rotate, float32 angles:       %s\n", two_rotations.text().c_str());
    bugs.expect_caught(checks, !two_rotations.within(),
                       "un-rotating and re-rotating with float32 angles near 1e6: caught against float64");

    tutorial::print_section("Ten small corrections against one move");
    // THE BUG: engines shift a window a few positions at a time, each a rotation of the
    // stored keys: every step rounds the angle and the stored keys once more.
    const std::vector<int64_t> shifts{3, 1, 2, 2, 3, 1, 1, 3, 2, 2};
    const int64_t total = std::accumulate(shifts.begin(), shifts.end(), int64_t(0));
    std::vector<int64_t> start(from.size()), end(from.size());
    for (size_t t = 0; t < from.size(); ++t) start[t] = 40'000 + int64_t(t), end[t] = start[t] - total;
    const std::vector<float> start_cache = rotated(precise, take(raw, from), start);
    const std::vector<double> end_want = exact(config, take(raw, from), end);
    std::vector<float> stepped = start_cache;
    std::vector<int64_t> here = start;
    for (int64_t shift : shifts) {
        std::vector<int64_t> next = here;
        for (int64_t& p : next) p -= shift;
        stepped = rerotated(*naive, config, stepped, here, next);
        here = next;
    }
    const double one = tutorial::relative_l2(rerotated(*naive, config, start_cache, start, end), end_want);
    const double ten = tutorial::relative_l2(stepped, end_want);
    std::printf("  one move by %ld: rel L2 %s; ten moves of 1 to 3: rel L2 %s (%.1fx)\n", long(total),
                tutorial::sci(one).c_str(), tutorial::sci(ten).c_str(), ten / one);
    bugs.expect_caught(checks, ten > 2 * one, "ten successive corrections drift past one direct move");

    tutorial::print_section("The inverse: to = 0");
    const std::vector<int64_t> zeros(from.size(), 0);
    tutorial::expect_everywhere(checks, backends, "re-rotating to position 0 gives back the raw keys",
                                [&](rope::Backend& backend) {
                                    const std::vector<float> back = rerotated(backend, config, kept, from, zeros);
                                    const std::vector<float> raw_kept = take(raw, from);
                                    const tutorial::Distance d =
                                        tutorial::distance(back, std::vector<double>(raw_kept.begin(), raw_kept.end()));
                                    return tutorial::Verdict{d.within(), d.text()};
                                });

    tutorial::print_section("Frequencies that depend on the length");
    // Dynamic NTK scaling takes other frequencies past original_max_position_embeddings:
    // keys rotated at 5000 and moved to 3 were rotated with frequencies of another table.
    rope::RopeConfig dynamic = config;
    dynamic.scaling = rope::Scaling{.type = rope::ScalingType::dynamic, .factor = 2.0,
                                    .original_max_position_embeddings = 1024};
    std::vector<int64_t> late(from.size()), early(from.size());
    for (size_t t = 0; t < from.size(); ++t) late[t] = 5000 + int64_t(t), early[t] = int64_t(t);
    std::string refusal;
    try {
        rerotated(*naive, dynamic, kept, late, early);
    } catch (const rope::Error& error) {
        refusal = error.what();
    }
    std::printf("  %s\n", refusal.c_str());
    checks.expect(refusal.find("scaling.type = dynamic") != std::string::npos,
                  "a move between two frequency tables is refused, naming scaling.type");

    return checks.finish(bugs.text() + "; near position 1e6 one re-rotation is off by " + tutorial::sci(direct.rel_l2) +
                         ", float32 un-rotate-then-rotate by " + tutorial::sci(two_rotations.rel_l2));
}
