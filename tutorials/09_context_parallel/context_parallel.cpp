// Chapter 9: context-parallel shards.
//
// Context parallelism cuts every sequence into 2 * cp_size chunks and gives
// rank r chunks r and 2 * cp_size - 1 - r, which balances causal attention's
// work. RoPE must still turn each token by its global position. The chapter
// simulates every rank on one machine, on every backend available here, and
// checks that the union of the ranks' rotations is the unsharded rotation bit
// for bit, which matches the float64 formula (tutorial.hpp); then it reproduces
// the bug that shipped (ranks rotating at local positions, marked THE BUG) and
// shows the check that catches it.
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

/// Global index of local token j on rank r of a group of n, for a sequence
/// of local length L on this rank (two chunks of L/2): chunk r, then chunk 2n-1-r.
int64_t global_index(int64_t j, int64_t L, int64_t r, int64_t n) {
    const int64_t half = L / 2;
    return j < half ? r * half + j : (2 * n - 1 - r) * half + (j - half);
}

/// For rank r of n: which token of the unsharded pack each of its local tokens is.
/// `lengths` are the global (unsharded) lengths of the sequences, each a multiple of 2n.
std::vector<int64_t> shard_tokens(const std::vector<int64_t>& lengths, int64_t r, int64_t n) {
    std::vector<int64_t> tokens;
    int64_t first = 0;
    for (int64_t length : lengths) {
        const int64_t local = length / n;
        for (int64_t j = 0; j < local; ++j) tokens.push_back(first + global_index(j, local, r, n));
        first += length;
    }
    return tokens;
}

/// The rows of x ([tokens, heads, head_dim]) at `tokens`, in that order.
std::vector<float> gather(const std::vector<float>& x, const std::vector<int64_t>& tokens, int64_t row) {
    std::vector<float> out;
    for (int64_t t : tokens) out.insert(out.end(), x.begin() + t * row, x.begin() + (t + 1) * row);
    return out;
}

/// Writes the rows of `shard` back to their places `tokens` in `full`.
void scatter(const std::vector<float>& shard, const std::vector<int64_t>& tokens, int64_t row,
             std::vector<float>& full) {
    for (size_t j = 0; j < tokens.size(); ++j)
        std::copy(shard.begin() + int64_t(j) * row, shard.begin() + int64_t(j + 1) * row,
                  full.begin() + tokens[j] * row);
}

/// Causal attention work of a rank: each query attends to every key up to
/// its own global index g, so it costs g + 1.
int64_t causal_work(const std::vector<int64_t>& global_indices) {
    int64_t work = 0;
    for (int64_t g : global_indices) work += g + 1;
    return work;
}

/// Rotates every rank's shard of `full` (cut by the two-chunk split) and puts
/// the rotated rows back in place: the union of the ranks, q and k.
/// `shard_positions` gives rank r's PositionArrays (with or without .sharded: see the bug).
template <typename ShardPositions>
Outcome union_of_ranks(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& full,
                       const std::vector<int64_t>& lengths, int64_t n, ShardPositions shard_positions) {
    const int64_t q_row = full.q_heads * full.head_dim, k_row = full.k_heads * full.head_dim;
    Outcome all{std::vector<float>(full.q.size(), tutorial::kPoison),
                std::vector<float>(full.k.size(), tutorial::kPoison), ""};
    for (int64_t r = 0; r < n; ++r) {
        const std::vector<int64_t> tokens = shard_tokens(lengths, r, n);
        Tensors shard = full;
        shard.seq = full.packed ? int64_t(tokens.size()) : full.seq / n;  // Padded: seq / n tokens per sequence.
        shard.q = gather(full.q, tokens, q_row);
        shard.k = gather(full.k, tokens, k_row);
        const Outcome outcome = tutorial::run(backend, config, shard, shard_positions(r));
        scatter(outcome.q, tokens, q_row, all.q);
        scatter(outcome.k, tokens, k_row, all.k);
        all.error += outcome.error;
    }
    return all;
}

/// The union check: the ranks' union equals the unsharded call bit for bit, which matches float64.
template <typename ShardPositions>
Verdict union_matches(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& full,
                      const std::vector<int64_t>& lengths, int64_t n, const PositionArrays& whole_positions,
                      ShardPositions shard_positions) {
    const Outcome whole = tutorial::run(backend, config, full, whole_positions);
    const Outcome all = union_of_ranks(backend, config, full, lengths, n, shard_positions);
    const Verdict verdict = tutorial::matches_float64(backend, config, full, whole_positions);
    const bool same = all.error.empty() && tutorial::identical(all.q, whole.q) && tutorial::identical(all.k, whole.k);
    return {verdict.passed && same, (same ? "union identical, " : "union DIFFERS, ") + verdict.detail};
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(9, "Context-parallel shards",
                          "each rank holds chunks r and 2n-1-r of every sequence, which balances causal "
                          "attention; RoPE turns each local token by its global position, and the union of "
                          "the ranks equals the unsharded rotation bit for bit");
    (void)argc, (void)argv;  // No figure data.
    tutorial::Checks checks;
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");  // Where the bug is reproduced.
    rope::RopeConfig config;                        // head_dim 64, base 10000, half-split.
    config.head_dim = 64;
    const int64_t n = 4;

    tutorial::print_section("Two chunks per rank");
    std::printf(
        "cp_size %ld: each sequence is cut into %ld chunks; rank r holds chunks r and %ld-r.\n"
        "A sequence of 16 tokens (chunks of 2), local length L = 4:\n",
        long(n), long(2 * n), long(2 * n - 1));
    for (int64_t r = 0; r < n; ++r) {
        std::vector<int64_t> global;
        for (int64_t j = 0; j < 4; ++j) global.push_back(global_index(j, 4, r, n));
        std::printf("  rank %ld: chunks %ld and %ld, global indices %s\n", long(r), long(r), long(2 * n - 1 - r),
                    tutorial::join(global).c_str());
    }
    // Why two chunks: causal attention's work per query grows with its index.
    const int64_t sequence = 8192, L = sequence / n;
    std::printf("Causal attention work (keys per query, summed) of a %ld-token sequence per rank:\n", long(sequence));
    std::vector<int64_t> balanced, contiguous;
    for (int64_t r = 0; r < n; ++r) {
        std::vector<int64_t> two_chunks, one_block;
        for (int64_t j = 0; j < L; ++j) {
            two_chunks.push_back(global_index(j, L, r, n));
            one_block.push_back(r * L + j);
        }
        balanced.push_back(causal_work(two_chunks));
        contiguous.push_back(causal_work(one_block));
        std::printf("  rank %ld: two chunks %10ld   one contiguous quarter %10ld\n", long(r), long(balanced.back()),
                    long(contiguous.back()));
    }
    const double imbalance = double(contiguous.back()) / double(contiguous.front());
    checks.expect(std::all_of(balanced.begin(), balanced.end(), [&](int64_t w) { return w == balanced[0]; }),
                  "two-chunk split: every rank does exactly the same causal work (chunks r and 2n-1-r "
                  "sum to the same; contiguous quarters: last rank " +
                      tutorial::fixed(imbalance, 1) + "x the first)");

    tutorial::print_section("Padded and packed shards, every rank simulated");
    // Padded: batch 2, 32 tokens per sequence, offset 5 (a cached prefix); 8 local tokens per rank.
    const Tensors full = tutorial::random_tensors(2, 32, 4, 2, 64, false, 804);
    const std::vector<int64_t> padded_lengths{32, 32};
    tutorial::expect_everywhere(
        checks, backends,
        "padded bshd [2, 32], offset 5, cp_size 4: union of the 4 ranks' rotations = the unsharded rotation bit "
        "for bit, which matches float64",
        [&](rope::Backend& backend) {
            return union_matches(backend, config, full, padded_lengths, n, {.offset = 5}, [&](int64_t r) {
                return PositionArrays{.offset = 5, .cp_size = n, .cp_rank = r};
            });
        });

    // Packed: three sequences of 16, 32 and 8 tokens (multiples of 2 * cp_size), starts 0, 100, 7.
    // TransformerEngine passes the global cu_seqlens and divides them by cp_size; rope takes this
    // rank's own, which is the same thing.
    const std::vector<int64_t> lengths{16, 32, 8}, starts{0, 100, 7};
    const std::vector<int64_t> global_cu = rope::cu_seqlens_from_lengths(lengths);
    std::vector<int64_t> local_cu;
    for (int64_t c : global_cu) local_cu.push_back(c / n);
    std::printf("Packed: global cu_seqlens [%s] / cp_size = this rank's [%s], starts [%s]\n",
                tutorial::join(global_cu, ", ").c_str(), tutorial::join(local_cu, ", ").c_str(),
                tutorial::join(starts, ", ").c_str());
    const Tensors pack = tutorial::random_tensors(1, global_cu.back(), 4, 1, 64, true, 805);
    tutorial::expect_everywhere(
        checks, backends,
        "packed thd, 3 sequences, cp_size 4: union of the ranks = the unsharded packed rotation bit for bit, which "
        "matches float64",
        [&](rope::Backend& backend) {
            return union_matches(backend, config, pack, lengths, n, {.cu_seqlens = global_cu, .starts = starts},
                                 [&](int64_t r) {
                                     return PositionArrays{
                                         .cu_seqlens = local_cu, .starts = starts, .cp_size = n, .cp_rank = r};
                                 });
        });
    // Handing rope the global cu_seqlens on a rank is refused: their last entry is not this rank's token count.
    Tensors rank0 = pack;
    rank0.seq = local_cu.back();
    rank0.q.resize(size_t(rank0.seq * 4 * 64));
    rank0.k.resize(size_t(rank0.seq * 64));
    const Outcome global =
        tutorial::run(*naive, config, rank0, {.cu_seqlens = global_cu, .starts = starts, .cp_size = n});
    std::printf("Global cu_seqlens on rank 0 -> %s\n", global.error.c_str());
    checks.expect(!global.error.empty() && tutorial::untouched(global.q),
                  "TransformerEngine's global cu_seqlens passed unconverted: a rope::Error, nothing written");

    tutorial::print_section("The bug: local positions");
    std::vector<int64_t> right, wrong;
    for (int64_t j = 0; j < 8; ++j) {
        right.push_back(5 + global_index(j, 8, 0, n));
        wrong.push_back(5 + j);
    }
    std::printf(
        "THE BUG: ranks rotate at local positions. Rank 0 of the padded batch must use %s,\n"
        "         the bug uses %s.\n",
        tutorial::join(right).c_str(), tutorial::join(wrong).c_str());
    const Outcome whole = tutorial::run(*naive, config, full, {.offset = 5});
    const Outcome local = union_of_ranks(*naive, config, full, padded_lengths, n,
                                         [&](int64_t) { return PositionArrays{.offset = 5}; });
    const tutorial::Distance off =
        tutorial::distance(local.q, tutorial::reference(full.q, 4, full, config, {.offset = 5}));
    std::printf("  union vs unsharded: %s; vs float64: %s\n",
                tutorial::identical(local.q, whole.q) ? "identical" : "DIFFERS", off.text().c_str());
    bugs.expect_caught(checks, !tutorial::identical(local.q, whole.q) && !off.within(),
                       "the union-equals-unsharded check catches ranks rotating at local positions");

    return checks.finish("two-chunk split: " + std::to_string(balanced[0]) + " key-query pairs on every one of " +
                         std::to_string(n) + " ranks (contiguous quarters: " + tutorial::fixed(imbalance, 1) +
                         "x between the last and the first); local positions off by rel L2 " +
                         tutorial::sci(off.rel_l2, 1) + "; " + bugs.text());
}
