#pragma once
// The float64 oracle: an independent implementation of RoPE used only by tests.
//
// It deliberately shares no code with the backends or with common/'s plan and
// rotation helpers: it reads user-level arguments (RopeConfig, TensorView,
// Positions, CosSinCache) with its own indexing, computes theta_i with exp/log
// instead of pow, rotates pairs as complex numbers in double precision, and
// converts fp16 with the compiler's _Float16 instead of rope's bit tricks. A
// backend that agrees with it therefore agrees with the formula, not with itself.
//
// Every position form is stated here once more, from its definition:
//  - offset o: token s has position o + s;
//  - ids [axes, rows, length]: token s of sequence b reads ids[a][rows == 1 ? 0 : b][s] on axis a;
//  - packed sequences: token t of sequence k (cu_seqlens[k] <= t < cu_seqlens[k+1])
//    has position t - cu_seqlens[k] + start[k] (start = starts[k], or the offset);
//  - context-parallel shards: a sequence of N = cp_size * L tokens is cut into
//    2*cp_size chunks of L/2; rank r holds chunks r and 2*cp_size-1-r, so its
//    j-th local token is the global token listed j-th (then the offset or start is added);
//  - multi-axis pairs (which axis turns pair j): M-RoPE contiguous: runs of
//    sections[a] pairs per axis; M-RoPE interleaved (Qwen3-VL): every pair temporal,
//    then height is dealt pairs 1, 4, 7, ... (sections[1] of them) and width 2, 5, 8, ...
//    (sections[2]); axial: runs as contiguous, with theta restarting on each axis
//    (base^(-j / sections[a]) for the j-th pair of axis a); elsewhere theta_j = base^(-2j / rotary_dim);
//  - a caller's cos/sin table: row p holds cos of every pair, then sin of every
//    pair; a position outside the table gives NaN in the rotated features (what
//    the CUDA backends document for device ids; host ids there are an error).
#include <vector>

#include "rope/args.hpp"
#include "rope/config.hpp"
#include "rope/kv_append.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace oracle {

// The global token indices a context-parallel rank holds, in its local order:
// a sequence of cp_size * local_length tokens is cut into 2 * cp_size chunks of
// local_length / 2, and rank cp_rank holds chunk cp_rank, then chunk 2*cp_size-1-cp_rank.
std::vector<long> held_tokens(long local_length, long cp_size, long cp_rank);

// Reads element (b, h, s, d) of a host view, whatever its layout, strides and dtype.
double read(const rope::TensorView& view, long b, long h, long s, long d);

// Exact RoPE of one host tensor in float64; the result is dense in (batch, heads, seq, dim) order.
// Positions must live on the host; scaling may be none, linear or deepseek_yarn (others throw
// std::invalid_argument). The rotary window [rotary_offset, rotary_offset + rotary_dim) is rotated,
// the rest kept; HF's DeepSeek order (Style::interleaved_to_half) reads pair j at (2j, 2j+1) of the
// window and writes it at (j, j + rotary_dim/2), half_to_interleaved the reverse; their inverse
// rotations read where the forward wrote and write where it read.
std::vector<double> rotate(const rope::RopeConfig& config, const rope::TensorView& x,
                           const rope::Positions& positions, rope::Direction direction);

// The same with a caller's cos/sin table (on the host): cos and sin are read
// from it instead of computed; config.scaling, already in the table, is not applied.
std::vector<double> rotate(const rope::RopeConfig& config, const rope::TensorView& x,
                           const rope::Positions& positions, rope::Direction direction,
                           const rope::CosSinCache& table);

// Fused QK-RMSNorm + RoPE in float64: each group of x (a head row, or with across_heads
// all heads of a token) divided by sqrt(mean(x^2) + eps), times weight (gemma: 1 + weight;
// across_heads: weight[h * head_dim + d]), then rotated as rotate() (with the caller's
// table when table.data is set). Dense result in (batch, heads, seq, dim) order.
std::vector<double> qk_norm(const rope::RopeConfig& config, const rope::TensorView& x, const std::vector<double>& weight,
                            bool gemma, bool across_heads, double eps, const rope::Positions& positions,
                            const rope::CosSinCache& table);
// Re-rotation from scratch: each pair of x turned by angle(to) - angle(from), both
// angles position * theta_j formed in long double and subtracted before any
// rounding, never scaled (rotated keys carry the attention factor already).
// Scaling none or linear; positions on the host.
std::vector<double> rerotate(const rope::RopeConfig& config, const rope::TensorView& x, const rope::Positions& from,
                             const rope::Positions& to);
// RoPE + KV append (rope::append_kv), from its definition: q and k rotated as
// rotate() does; token t (t < slot_count, slots[t] >= 0) writes its rotated k row
// and its v row at page slots[t] / page_size, slot slots[t] % page_size of each
// cache, element page * stride_page + slot * stride_slot + head * stride_head + d
// (a slot past pages * page_size is written nowhere, as the CUDA kernels treat a device slot).
// The exact values are returned; what a cache stores (the model dtype's rounding, an
// FP8 code) is the test's comparison to make.
struct CacheWrite {
    long index;    // Element of the cache (in the cache's own element size).
    long head;     // Its head (for per-head scales).
    long token;    // The token and feature it holds.
    long feature;
    double value;  // The exact value written there.
};
struct Appended {
    std::vector<double> q, k;             // Dense (batch, heads, seq, dim), as rotate().
    std::vector<CacheWrite> k_cache, v_cache;
};
Appended append_kv(const rope::RopeConfig& config, const rope::TensorView& q, const rope::TensorView& k,
                   const rope::TensorView& v, const rope::Positions& positions, const std::vector<long>& slots,
                   const rope::PagedCache& k_cache, const rope::PagedCache& v_cache,
                   const rope::CosSinCache& table);

// All elements of a host view as doubles, dense in (batch, heads, seq, dim) order.
std::vector<double> values(const rope::TensorView& view);

// Relative L2 error ||got - want|| / ||want|| and the largest absolute difference.
struct ErrorStats {
    double rel_l2 = 0;
    double max_abs = 0;
    long non_finite = 0;  // Elements of `got` that are NaN or inf (unwritten outputs are NaN).
};
ErrorStats compare(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace oracle
