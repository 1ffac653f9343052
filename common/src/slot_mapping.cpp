// Slot mappings from other engines' page metadata (rope/slot_mapping.hpp).
//
// The host checks the scalars of every call, then, for host arrays, each array
// as a whole (clearer messages: "kv_indptr[2] = 5: must be >= kv_indptr[1] = 7")
// and each token by the rule the kernels share (detail/slot_mapping_rules.hpp),
// computing the whole mapping before writing any of it. Device arrays go to the
// CUDA implementation (cuda/slot_mapping.cu) after the scalar checks.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "rope/detail/slot_mapping_rules.hpp"
#include "rope/error.hpp"
#include "rope/slot_mapping.hpp"

namespace rope {
namespace {

constexpr int64_t int64_max = std::numeric_limits<int64_t>::max();

void require_pointer(const char* name, const void* pointer, bool needed) {
    if (needed && pointer == nullptr) fail(name, "null", "must point at the array");
}

// The scalars every form shares: sizes, page_size, the output pointer, and the
// products the rules compute staying within int64.
void check_output(const SlotMappingOutput& to, int64_t entries_times_page) {
    if (to.tokens < 0) fail("tokens", to.tokens, "must be >= 0");
    if (to.page_size < 1) fail("page_size", to.page_size, "must be >= 1");
    if (to.pages < 0) fail("pages", to.pages, "must be >= 0");
    if (to.pages > int64_max / to.page_size)
        fail("pages", to.pages, "times page_size = " + std::to_string(to.page_size) + " exceeds int64");
    if (entries_times_page > int64_max / to.page_size)
        fail("page_size", to.page_size, "times the page table's entries exceeds int64");
    require_pointer("slot_mapping", to.slot_mapping, to.tokens > 0);
}

void check_batch(int64_t batch) {
    if (batch < 0) fail("batch", batch, "must be >= 0");
}

// indptr [batch + 1]: first == 0 (when required), non-decreasing, last <= limit.
void check_indptr(const char* name, const int64_t* indptr, int64_t batch, bool zero_first, int64_t limit,
                  const char* limit_name) {
    const std::string at = std::string(name) + "[";
    if (zero_first && indptr[0] != 0) fail(at + "0]", indptr[0], "must be 0");
    if (indptr[0] < 0) fail(at + "0]", indptr[0], "must be >= 0");
    for (int64_t b = 1; b <= batch; ++b)
        if (indptr[b] < indptr[b - 1])
            fail(at + std::to_string(b) + "]", indptr[b],
                 "must be >= " + at + std::to_string(b - 1) + "] = " + std::to_string(indptr[b - 1]));
    if (indptr[batch] > limit)
        fail(at + std::to_string(batch) + "]", indptr[batch],
             "must be <= " + std::string(limit_name) + " = " + std::to_string(limit));
}

// A token's fault as a rope::Error naming the array and the value.
[[noreturn]] void fail_token(const SlotOutcome& outcome, int64_t t, const SlotMappingOutput& to, const char* pages_name,
                             const char* position_name) {
    const std::string token = "token " + std::to_string(t) + " of request " + std::to_string(outcome.request);
    switch (outcome.fault) {
        case SlotFault::past_pages:
            fail(position_name, outcome.position,
                 "lies past the pages of " + token + " (page_size " + std::to_string(to.page_size) + ")");
        case SlotFault::page:
            fail(std::string(pages_name) + "[" + std::to_string(outcome.entry) + "]", outcome.page,
                 "must be a page index in [0, pages = " + std::to_string(to.pages) + ") (" + token + ")");
        case SlotFault::position:
            fail(position_name, outcome.position, "must be >= 0 (" + token + ")");
        default:
            break;
    }
    fail("token", t, "its page metadata is out of range");  // The array checks come first: not reached.
}

// Writes the mapping the rule gives every token, once every token has one.
template <typename Rule>
void convert_on_host(const SlotMappingOutput& to, Rule rule) {
    std::vector<int64_t> slots(size_t(to.tokens));
    for (int64_t t = 0; t < to.tokens; ++t) slots[size_t(t)] = rule(t);
    if (to.tokens > 0) std::memcpy(to.slot_mapping, slots.data(), slots.size() * sizeof(int64_t));
}

#if !ROPE_HAVE_CUDA
[[noreturn]] void no_cuda() { fail("device", "cuda", "this build of rope has no CUDA"); }
#endif

}  // namespace

void slot_mapping_from_flashinfer_indptr(const FlashInferAppend& from, const SlotMappingOutput& to) {
    check_batch(from.batch);
    if (from.kv_indices_size < 0) fail("kv_indices_size", from.kv_indices_size, "must be >= 0");
    check_output(to, from.kv_indices_size);
    require_pointer("append_indptr", from.append_indptr, true);
    require_pointer("kv_indptr", from.kv_indptr, true);
    require_pointer("kv_indices", from.kv_indices, from.kv_indices_size > 0);
    require_pointer("kv_last_page_len", from.kv_last_page_len, from.batch > 0);
    if (to.device == Device::cuda) {
#if ROPE_HAVE_CUDA
        return cuda_slot_mapping_from_flashinfer_indptr(from, to);
#else
        no_cuda();
#endif
    }
    check_indptr("append_indptr", from.append_indptr, from.batch, true, to.tokens, "tokens");
    check_indptr("kv_indptr", from.kv_indptr, from.batch, false, from.kv_indices_size, "kv_indices_size");
    for (int64_t b = 0; b < from.batch; ++b) {
        const int64_t last = from.kv_last_page_len[b];
        if (last < 0 || last > to.page_size)
            fail("kv_last_page_len[" + std::to_string(b) + "]", last,
                 "must be in [0, page_size = " + std::to_string(to.page_size) + "]");
        const int64_t count = from.kv_indptr[b + 1] - from.kv_indptr[b];
        if (count == 0 && last != 0)
            fail("kv_last_page_len[" + std::to_string(b) + "]", last, "must be 0 for a request without pages");
        const int64_t sequence = (count > 0 ? count - 1 : 0) * to.page_size + last;
        const int64_t appended = from.append_indptr[b + 1] - from.append_indptr[b];
        if (appended > sequence)
            fail("append_indptr[" + std::to_string(b + 1) + "] - append_indptr[" + std::to_string(b) + "]", appended,
                 "appended tokens of request " + std::to_string(b) + " exceed its sequence length " +
                     std::to_string(sequence) + " (from kv_indptr and kv_last_page_len)");
    }
    convert_on_host(to, [&](int64_t t) {
        const SlotOutcome outcome = flashinfer_indptr_slot(from, to, t);
        if (outcome.fault != SlotFault::none) fail_token(outcome, t, to, "kv_indices", "position");
        return outcome.slot;
    });
}

void slot_mapping_from_flashinfer_positions(const FlashInferPositions& from, const SlotMappingOutput& to) {
    check_batch(from.batch);
    if (from.kv_indices_size < 0) fail("kv_indices_size", from.kv_indices_size, "must be >= 0");
    check_output(to, from.kv_indices_size);
    require_pointer("batch_indices", from.batch_indices, to.tokens > 0);
    require_pointer("positions", from.positions, to.tokens > 0);
    require_pointer("kv_indptr", from.kv_indptr, true);
    require_pointer("kv_indices", from.kv_indices, from.kv_indices_size > 0);
    if (to.device == Device::cuda) {
#if ROPE_HAVE_CUDA
        return cuda_slot_mapping_from_flashinfer_positions(from, to);
#else
        no_cuda();
#endif
    }
    check_indptr("kv_indptr", from.kv_indptr, from.batch, false, from.kv_indices_size, "kv_indices_size");
    for (int64_t t = 0; t < to.tokens; ++t) {
        const int64_t b = from.batch_indices[t];
        if (b != -1 && (b < 0 || b >= from.batch))
            fail("batch_indices[" + std::to_string(t) + "]", b,
                 "must be -1 (padding) or in [0, batch = " + std::to_string(from.batch) + ")");
    }
    convert_on_host(to, [&](int64_t t) {
        const SlotOutcome outcome = flashinfer_positions_slot(from, to, t);
        const std::string position = "positions[" + std::to_string(t) + "]";
        if (outcome.fault != SlotFault::none) fail_token(outcome, t, to, "kv_indices", position.c_str());
        return outcome.slot;
    });
}

void slot_mapping_from_block_table(const BlockTable& given, const SlotMappingOutput& to) {
    BlockTable from = given;
    check_batch(from.batch);
    if (from.max_blocks_per_seq < 0) fail("max_blocks_per_seq", from.max_blocks_per_seq, "must be >= 0");
    if (from.row_stride == 0) from.row_stride = from.max_blocks_per_seq;
    if (from.row_stride < from.max_blocks_per_seq)
        fail("row_stride", from.row_stride,
             "must be >= max_blocks_per_seq = " + std::to_string(from.max_blocks_per_seq) + " (rows may not overlap)");
    if (from.batch > 0 && from.row_stride > int64_max / from.batch)
        fail("row_stride", from.row_stride, "times batch exceeds int64");
    check_output(to, from.max_blocks_per_seq);
    require_pointer("block_table", from.block_table, from.batch > 0 && from.max_blocks_per_seq > 0);
    require_pointer("cache_seqlens", from.cache_seqlens, from.batch > 0);
    require_pointer("cu_seqlens_q", from.cu_seqlens_q, true);
    if (to.device == Device::cuda) {
#if ROPE_HAVE_CUDA
        return cuda_slot_mapping_from_block_table(from, to);
#else
        no_cuda();
#endif
    }
    check_indptr("cu_seqlens_q", from.cu_seqlens_q, from.batch, true, to.tokens, "tokens");
    for (int64_t b = 0; b < from.batch; ++b)
        if (from.cache_seqlens[b] < 0)
            fail("cache_seqlens[" + std::to_string(b) + "]", from.cache_seqlens[b], "must be >= 0");
    convert_on_host(to, [&](int64_t t) {
        const SlotOutcome outcome = block_table_slot(from, to, t);
        if (outcome.fault == SlotFault::none) return outcome.slot;
        if (outcome.fault == SlotFault::page)
            fail("block_table[" + std::to_string(outcome.request) + "][" + std::to_string(outcome.entry) + "]",
                 outcome.page,
                 "must be a page index in [0, pages = " + std::to_string(to.pages) + ") (token " +
                     std::to_string(t) + ")");
        fail("cache_seqlens[" + std::to_string(outcome.request) + "]", from.cache_seqlens[outcome.request],
             "plus the step's tokens of request " + std::to_string(outcome.request) + " (position " +
                 std::to_string(outcome.position) + " of token " + std::to_string(t) + ") lies past its " +
                 std::to_string(from.max_blocks_per_seq) + " blocks of page_size " + std::to_string(to.page_size));
    });
}

}  // namespace rope
