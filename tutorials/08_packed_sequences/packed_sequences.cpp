// Chapter 8: packed sequences.
//
// Training and serving concatenate sequences of different lengths into one
// tensor [total_tokens, heads, head_dim] and describe them with cu_seqlens (and
// optional per-sequence starts). The chapter checks that bookkeeping on every
// backend available here against the float64 formula (tutorial.hpp), shows
// why the grid of a packed kernel must be sized by the total tokens, and
// reproduces the one-key-head bug that shipped (marked THE BUG) with the check
// that catches it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

using tutorial::Outcome;
using tutorial::PositionArrays;
using tutorial::Tensors;
using tutorial::Verdict;

/// Position of every token of a pack, the obvious way: walk the sequences.
/// Token t of sequence b (cu_seqlens[b] <= t < cu_seqlens[b+1]) is at
/// t - cu_seqlens[b] + starts[b] (starts empty: every sequence starts at 0).
std::vector<int64_t> packed_positions(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& starts) {
    std::vector<int64_t> positions;
    for (size_t b = 0; b + 1 < cu_seqlens.size(); ++b)
        for (int64_t t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t)
            positions.push_back(t - cu_seqlens[b] + (starts.empty() ? 0 : starts[b]));
    return positions;
}

/// What a grid of one block per token does instead: token t finds its sequence
/// by binary search, the last b with cu_seqlens[b] <= t (empty sequences are
/// skipped by construction). The caller guards t < cu_seqlens.back().
int64_t sequence_of(const std::vector<int64_t>& cu_seqlens, int64_t t) {
    return int64_t(std::upper_bound(cu_seqlens.begin(), cu_seqlens.end() - 1, t) - cu_seqlens.begin()) - 1;
}

/// The issue's packed batch: lengths from 1 to 8192 totalling 32768 tokens.
/// Every power of two from 8192 down to 1 twice (32766 tokens), and two more
/// one-token sequences: 30 sequences.
std::vector<int64_t> issue_batch_lengths() {
    std::vector<int64_t> lengths;
    for (int64_t length = 8192; length >= 1; length /= 2) lengths.insert(lengths.end(), {length, length});
    lengths.insert(lengths.end(), {1, 1});
    return lengths;
}

/// Whether a packed call rotates every sequence exactly as a call of that
/// sequence alone, from its start, does: bit for bit (the same position gives
/// the same float32 angle, whatever else is in the tensor).
Verdict packed_equals_alone(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& pack,
                            const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& starts) {
    const Outcome together = tutorial::run(backend, config, pack, {.cu_seqlens = cu_seqlens, .starts = starts});
    const int64_t q_row = pack.q_heads * pack.head_dim, k_row = pack.k_heads * pack.head_dim;
    bool same = together.error.empty();
    for (size_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
        const int64_t first = cu_seqlens[b], last = cu_seqlens[b + 1];
        const Tensors alone{1,
                            last - first,
                            pack.q_heads,
                            pack.k_heads,
                            pack.head_dim,
                            false,
                            tutorial::token_rows(pack.q, first, last, q_row),
                            tutorial::token_rows(pack.k, first, last, k_row)};
        const Outcome single = tutorial::run(backend, config, alone, {.offset = starts.empty() ? 0 : starts[b]});
        same = same && tutorial::identical(single.q, tutorial::token_rows(together.q, first, last, q_row)) &&
               tutorial::identical(single.k, tutorial::token_rows(together.k, first, last, k_row));
    }
    return {same, same ? "identical" : "DIFFERS"};
}

/// THE BUG (a stand-in): a kernel that rotates key heads two at a time, for
/// h < 2 * (heads / 2). With an even head count it is right; with one key head
/// it writes nothing, and k_out keeps what it held (NaN here, stale memory in
/// a real run). One fused kernel shipped NaN for exactly that case: a packed
/// call with a single key head, while the multi-head query was fine.
std::vector<float> two_heads_at_a_time(std::vector<float> k_out, int64_t heads, int64_t head_dim) {
    const int64_t written = 2 * (heads / 2);
    for (size_t e = 0; e < k_out.size(); ++e)
        if (int64_t(e) / head_dim % heads >= written) k_out[e] = tutorial::kPoison;  // Never written.
    return k_out;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(8, "Packed sequences",
                          "a packed token's position is its place in its own sequence plus that sequence's start; "
                          "the grid is sized by the total tokens, and a one-head key test catches what an "
                          "eight-head one misses");
    tutorial::Checks checks;
    tutorial::Csv csv(tutorial::csv_path(argc, argv, "tutorial-08-packed-sequences"));
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");  // Where the bug is reproduced.
    rope::RopeConfig plain;
    plain.head_dim = 64;

    tutorial::print_section("cu_seqlens and starts");
    // Four sequences of 3, 5, 1 and 7 tokens. Sequence 1 continues 10 cached
    // tokens and sequence 3 four (chunked prefill), so they start there.
    const std::vector<int64_t> cu = rope::cu_seqlens_from_lengths({3, 5, 1, 7}), starts{0, 10, 0, 4};
    const std::vector<int64_t> positions = packed_positions(cu, starts);
    std::printf("cu_seqlens [%s], starts [%s]\n", tutorial::join(cu, ", ").c_str(),
                tutorial::join(starts, ", ").c_str());
    std::printf("token t of sequence b is at t - cu_seqlens[b] + starts[b]:\n  positions ");
    for (size_t b = 0; b + 1 < cu.size(); ++b)
        std::printf("%s%s", b ? " | " : "",
                    tutorial::join({positions.begin() + cu[b], positions.begin() + cu[b + 1]}).c_str());
    std::printf("\n");

    // q [16 tokens, 4 heads, 64] and k with ONE head: the case that shipped NaN.
    const Tensors pack = tutorial::random_tensors(1, 16, 4, 1, 64, true, 801);
    const PositionArrays packed{.cu_seqlens = cu, .starts = starts};
    tutorial::expect_everywhere(checks, backends, "packed thd call, q 4 heads, k 1 head: matches float64",
                                [&](rope::Backend& backend) {
                                    return tutorial::matches_float64(backend, plain, pack, packed);
                                });
    // Packing changes nothing: each sequence alone, at its start, rotates the same.
    tutorial::expect_everywhere(
        checks, backends, "packed call = each sequence rotated alone from its start, bit for bit",
        [&](rope::Backend& backend) { return packed_equals_alone(backend, plain, pack, cu, starts); });

    tutorial::print_section("One key head");
    std::printf("THE BUG, a stand-in for the one-head NaN: key heads rotated two at a time (h < 2*(heads/2)).\n");
    const Tensors eight = tutorial::random_tensors(1, 16, 8, 8, 64, true, 802);
    const Outcome right8 = tutorial::run(*naive, plain, eight, packed), right1 = tutorial::run(*naive, plain, pack, packed);
    const tutorial::Distance with8 = tutorial::distance(two_heads_at_a_time(right8.k, 8, 64),
                                                        tutorial::reference(eight.k, 8, eight, plain, packed));
    const tutorial::Distance with1 = tutorial::distance(two_heads_at_a_time(right1.k, 1, 64),
                                                        tutorial::reference(pack.k, 1, pack, plain, packed));
    std::printf("  test with 8 key heads: %s (%s)\n  test with 1 key head:  %s (%s)\n",
                with8.within() ? "passes" : "FAILS", with8.text().c_str(), with1.within() ? "passes" : "FAILS",
                with1.text().c_str());
    bugs.expect_caught(
        checks, with8.within() && !with1.within(),
        "the bug passes a test with 8 key heads; a test with 1 key head and NaN-poisoned outputs catches it");

    tutorial::print_section("The grid: one block per token");
    const std::vector<int64_t> issue_lengths = issue_batch_lengths();
    const std::vector<int64_t> issue_cu = rope::cu_seqlens_from_lengths(issue_lengths);
    const int64_t total_tokens = issue_cu.back(), sequences = int64_t(issue_lengths.size());
    const int64_t longest = *std::max_element(issue_lengths.begin(), issue_lengths.end());
    const int64_t longest_grid = sequences * longest;
    std::printf(
        "The issue's batch: %ld sequences, every power of two from 8192 down to 1 twice, plus two of 1:\n"
        "%ld tokens.\n",
        long(sequences), long(total_tokens));
    std::printf("  grid sized by batch x longest: %ld x %ld = %ld blocks, %ld useful (%.1f%%), %ld idle\n",
                long(sequences), long(longest), long(longest_grid), long(total_tokens),
                100.0 * double(total_tokens) / double(longest_grid), long(longest_grid - total_tokens));
    std::printf(
        "  grid sized by total tokens:    %ld blocks, all useful; each finds its sequence by binary "
        "search over cu_seqlens\n",
        long(total_tokens));
    // The worst batch of the same size: one 8192-token sequence and 24576 of one token.
    const int64_t worst = (1 + (total_tokens - longest)) * longest;
    std::printf(
        "  at worst (one sequence of 8192, 24576 of 1 token) the longest-sequence grid launches %ld blocks\n"
        "  for the same %ld tokens: %.2f%% idle, the regime of the 157M-block report.\n",
        long(worst), long(total_tokens), 100.0 * (1.0 - double(total_tokens) / double(worst)));
    csv.table("the issue's packed batch: sequence lengths, and the longest (the grid row of a longest-sequence grid)",
              "sequence,length,longest");
    for (int64_t b = 0; b < sequences; ++b) csv.row(b, issue_lengths[size_t(b)], longest);

    // The total-token grid's bookkeeping: the binary search finds every token's sequence.
    bool found = true;
    for (int64_t b = 0; b < sequences; ++b)
        for (int64_t t = issue_cu[size_t(b)]; t < issue_cu[size_t(b) + 1]; ++t)
            found = found && sequence_of(issue_cu, t) == b;
    checks.expect(found, "binary search over cu_seqlens finds the sequence of each of the " +
                             std::to_string(total_tokens) + " tokens (as a walk over the sequences does)");
    // And the library on that batch: packed = every sequence alone (q 2 heads, k 1, head_dim 64).
    const Tensors batch = tutorial::random_tensors(1, total_tokens, 2, 1, 64, true, 803);
    tutorial::expect_everywhere(
        checks, backends, "the issue's batch packed = its 30 sequences rotated alone, bit for bit",
        [&](rope::Backend& backend) { return packed_equals_alone(backend, plain, batch, issue_cu, {}); });
    std::printf(
        "What catches a longest-sequence grid is not a check of values (they are right) but a\n"
        "benchmark: rope-bench's packed batch must run within 3%% of the plain path's %% of copy.\n");
    csv.finish(checks);

    return checks.finish("a longest-sequence grid launches " + std::to_string(longest_grid) + " blocks for " +
                         std::to_string(total_tokens) + " tokens (" +
                         tutorial::fixed(100.0 * double(longest_grid - total_tokens) / double(longest_grid), 1) +
                         "% idle); " + bugs.text() + "; packed matches float64 on " +
                         std::to_string(backends.available.size()) + " backends");
}
