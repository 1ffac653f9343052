#pragma once
// Chapter 2's ladder: the problem every step solves, and the steps.
//
// q [1, q_heads, seq, head_dim] and k [1, k_heads, seq, head_dim] (layout
// bhsd: a head's tokens are adjacent in memory), float32, half-split pairs,
// token t at position t, rotated in place. Each step computes what cpu-naive
// computes, with one more idea than the step before it:
//
//   step1_eigen_row.cpp        a head row as Eigen fixed-size arrays: eight pairs per step
//   step2_table.cpp            cos/sin once per position, shared by every head
//   step3_openmp.cpp           OpenMP threads, each a contiguous share of the rows
//   step4_heads_side_by_side.cpp  four heads walked together, token by token
//   step5_visits.cpp           each head visited for two tokens before the next
//   step6_prefetch.cpp         each head's row four tokens ahead asked for before a row is rotated
//
// The library's cpu-eigen (cpu/eigen/) is step 6 grown to every dtype, layout,
// stride, pairing and position form.
#include <cstdint>

namespace ladder {

/// What a step gets: the tensors (rotated in place) and theta_i.
struct Problem {
    float* q = nullptr;
    float* k = nullptr;
    const float* inv_freq = nullptr;  ///< theta_i for the head_dim / 2 pairs (rope::make_frequency_table's).
    int64_t q_heads = 0, k_heads = 0, seq = 0, head_dim = 0;

    int64_t pairs() const { return head_dim / 2; }
    int64_t heads() const { return q_heads + k_heads; }
    /// The row of head @p head (q's heads first, then k's) at token @p token.
    float* row(int64_t head, int64_t token) const {
        if (head < q_heads) return q + (head * seq + token) * head_dim;
        return k + ((head - q_heads) * seq + token) * head_dim;
    }
};

/// Step 1's rotation of one row by per-pair cos and sin; steps 2 to 6 reuse it.
/// Needs pairs % 8 == 0.
void rotate_row(float* row, const float* cos, const float* sin, int64_t pairs);

/// Step 2's row @p t of the cos/sin table (pairs floats each); steps 3 to 6 reuse it.
void fill_table_row(const Problem& p, int64_t t, float* cos, float* sin);

void step1_eigen_row(const Problem& p);
void step2_table(const Problem& p);
void step3_openmp(const Problem& p);
void step4_heads_side_by_side(const Problem& p);
void step5_visits(const Problem& p);
void step6_prefetch(const Problem& p);

/// Names, one-line ideas and whether the step runs on every core, for the table.
struct Step {
    const char* name;
    const char* idea;
    void (*run)(const Problem&);
    bool threaded;
};
inline constexpr Step kSteps[] = {
    {"1 Eigen row", "a row as Eigen::Array<float, 8, 1>: 8 pairs per step; cos/sin per head, as cpu-naive",
     step1_eigen_row, false},
    {"2 table", "cos/sin once per (position, pair) with Eigen's SIMD cos/sin, shared by all heads",
     step2_table, false},
    {"3 OpenMP", "step 2 with the table and the rows split among threads (omp parallel for)", step3_openmp, true},
    {"4 heads side by side", "each thread walks 4 heads token by token: a table row read once per 4 rows",
     step4_heads_side_by_side, true},
    {"5 visits", "step 4, each head visited for 2 tokens before the next: 1 KiB of a stream at a time",
     step5_visits, true},
    {"6 prefetch", "step 5, each head's row 4 tokens ahead prefetched before a row is rotated",
     step6_prefetch, true},
};

}  // namespace ladder
