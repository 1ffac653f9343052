#pragma once
/// @file detail/slot_mapping_rules.hpp
/// @brief The slot of one token, for each page-metadata form: the rule the host
/// converters and the CUDA kernels share (internal; users call the functions of
/// rope/slot_mapping.hpp).
///
/// Each rule reads only the entries it needs, checks each against its bounds
/// before using it (and before using it as an index), and reports the first
/// fault instead of a slot. The host turns a fault into a rope::Error naming
/// the array (after checking the arrays as a whole, for clearer messages); a
/// kernel, which cannot report, writes -1. The callers have checked the
/// scalars (sizes >= 0, page_size >= 1, pages * page_size and
/// kv_indices_size * page_size within int64).

#include <cstdint>

#include "rope/host_device.hpp"
#include "rope/slot_mapping.hpp"

namespace rope {

/// @brief What went wrong with a token's metadata, if anything.
enum class SlotFault {
    none,              ///< A slot, or -1 for a padding token.
    indptr,            ///< append_indptr / cu_seqlens_q does not bracket the token (not non-decreasing).
    kv_indptr,         ///< kv_indptr[b], kv_indptr[b+1] not in order within [0, kv_indices_size].
    kv_last_page_len,  ///< kv_last_page_len[b] outside [0, page_size].
    appended,          ///< More tokens appended than the request's sequence holds.
    batch_index,       ///< batch_indices[t] neither -1 nor in [0, batch).
    position,          ///< A negative position, or cache_seqlens[b] < 0.
    past_pages,        ///< The position lies past the request's pages.
    page,              ///< The page index read lies outside [0, pages).
};

/// @brief One token's slot, or why there is none.
struct SlotOutcome {
    int64_t slot = -1;                   ///< The slot; -1 for padding or a fault.
    SlotFault fault = SlotFault::none;   ///< Why there is no slot (none: slot, or padding).
    int64_t request = -1;                ///< The token's request, once known.
    int64_t position = -1;               ///< Its position in the request's sequence, once known.
    int64_t entry = -1;                  ///< The page table entry read (kv_indices index, or block_table column).
    int64_t page = -1;                   ///< The page index read there.
};

/// @brief The request whose range [indptr[b], indptr[b+1]) holds token @p t, by
/// binary search over indptr[0 .. batch] (never reading outside it).
/// @param indptr `[batch + 1]` offsets.
/// @param batch requests.
/// @param t the token.
/// @param[out] outcome fault set to SlotFault::indptr when no range holds @p t
/// (indptr not in order); untouched for a padding token.
/// @return the request, or -1 (padding: t >= indptr[batch], or a fault).
ROPE_HOST_DEVICE inline int64_t request_of_token(const int64_t* indptr, int64_t batch, int64_t t,
                                                 SlotOutcome& outcome) {
    if (batch == 0 || t >= indptr[batch]) return -1;
    int64_t low = 0, high = batch;  // the request, if any, is in [low, high)
    while (high - low > 1) {
        const int64_t middle = low + (high - low) / 2;
        if (indptr[middle] <= t) low = middle;
        else high = middle;
    }
    if (!(indptr[low] <= t && t < indptr[low + 1])) {
        outcome.fault = SlotFault::indptr;
        return -1;
    }
    return low;
}

/// @brief Slot of @p position in the request whose page list is
/// kv_indices[first .. first + count), or the fault (FlashInfer's page.cuh:
/// page kv_indices[kv_indptr[b] + position / page_size], entry position % page_size).
/// @param kv_indices page indices.
/// @param first the request's first entry.
/// @param count its pages.
/// @param position the token's position, >= 0.
/// @param to the cache.
/// @param outcome filled in.
ROPE_HOST_DEVICE inline void slot_in_page_list(const int64_t* kv_indices, int64_t first, int64_t count,
                                               int64_t position, const SlotMappingOutput& to, SlotOutcome& outcome) {
    outcome.position = position;
    if (position / to.page_size >= count) {
        outcome.fault = SlotFault::past_pages;
        return;
    }
    outcome.entry = first + position / to.page_size;
    outcome.page = kv_indices[outcome.entry];
    if (outcome.page < 0 || outcome.page >= to.pages) {
        outcome.fault = SlotFault::page;
        return;
    }
    outcome.slot = outcome.page * to.page_size + position % to.page_size;
}

/// @brief kv_indptr[b] and kv_indptr[b+1], checked: in order within [0, kv_indices_size].
/// @param kv_indptr `[batch + 1]` offsets into kv_indices.
/// @param kv_indices_size entries of kv_indices.
/// @param b the request.
/// @param[out] first its first kv_indices entry.
/// @param[out] count its pages.
/// @param[out] outcome fault set to SlotFault::kv_indptr when the offsets are out of order or range.
/// @return false (fault set) when they are not.
ROPE_HOST_DEVICE inline bool request_pages(const int64_t* kv_indptr, int64_t kv_indices_size, int64_t b,
                                           int64_t& first, int64_t& count, SlotOutcome& outcome) {
    first = kv_indptr[b];
    const int64_t end = kv_indptr[b + 1];
    if (!(0 <= first && first <= end && end <= kv_indices_size)) {
        outcome.fault = SlotFault::kv_indptr;
        return false;
    }
    count = end - first;
    return true;
}

/// @brief FlashInfer form 1: the slot of token @p t (see rope::FlashInferAppend).
/// @param from the metadata. @param to the cache. @param t the token, in [0, to.tokens).
/// @return the outcome.
ROPE_HOST_DEVICE inline SlotOutcome flashinfer_indptr_slot(const FlashInferAppend& from, const SlotMappingOutput& to,
                                                           int64_t t) {
    SlotOutcome outcome;
    const int64_t b = request_of_token(from.append_indptr, from.batch, t, outcome);
    if (b < 0) return outcome;
    outcome.request = b;
    int64_t first = 0, count = 0;
    if (!request_pages(from.kv_indptr, from.kv_indices_size, b, first, count, outcome)) return outcome;
    const int64_t last_page_len = from.kv_last_page_len[b];
    if (last_page_len < 0 || last_page_len > to.page_size) {
        outcome.fault = SlotFault::kv_last_page_len;
        return outcome;
    }
    // FlashInfer's get_seq_lens: clamp(n_b - 1, min 0) * page_size + last_page_len.
    const int64_t sequence = (count > 0 ? count - 1 : 0) * to.page_size + last_page_len;
    const int64_t appended = from.append_indptr[b + 1] - from.append_indptr[b];
    if (appended > sequence) {
        outcome.fault = SlotFault::appended;
        return outcome;
    }
    // get_batch_indices_positions: the appended tokens are the sequence's last ones.
    slot_in_page_list(from.kv_indices, first, count, sequence - appended + (t - from.append_indptr[b]), to, outcome);
    return outcome;
}

/// @brief FlashInfer form 2: the slot of token @p t (see rope::FlashInferPositions).
/// @param from the metadata. @param to the cache. @param t the token, in [0, to.tokens).
/// @return the outcome.
ROPE_HOST_DEVICE inline SlotOutcome flashinfer_positions_slot(const FlashInferPositions& from,
                                                              const SlotMappingOutput& to, int64_t t) {
    SlotOutcome outcome;
    const int64_t b = from.batch_indices[t];
    if (b == -1) return outcome;  // padding (FlashInfer's batch index -1)
    if (b < 0 || b >= from.batch) {
        outcome.fault = SlotFault::batch_index;
        return outcome;
    }
    outcome.request = b;
    int64_t first = 0, count = 0;
    if (!request_pages(from.kv_indptr, from.kv_indices_size, b, first, count, outcome)) return outcome;
    outcome.position = from.positions[t];
    if (outcome.position < 0) {
        outcome.fault = SlotFault::position;
        return outcome;
    }
    slot_in_page_list(from.kv_indices, first, count, outcome.position, to, outcome);
    return outcome;
}

/// @brief flash-attn's block table: the slot of token @p t (see rope::BlockTable).
/// @param from the metadata (row_stride already resolved, >= max_blocks_per_seq).
/// @param to the cache. @param t the token, in [0, to.tokens).
/// @return the outcome.
ROPE_HOST_DEVICE inline SlotOutcome block_table_slot(const BlockTable& from, const SlotMappingOutput& to, int64_t t) {
    SlotOutcome outcome;
    const int64_t b = request_of_token(from.cu_seqlens_q, from.batch, t, outcome);
    if (b < 0) return outcome;
    outcome.request = b;
    const int64_t cached = from.cache_seqlens[b];
    // Bounded before the addition, so that a wild value cannot overflow it.
    const int64_t capacity = from.max_blocks_per_seq * to.page_size;
    if (cached < 0 || cached > capacity) {
        outcome.fault = cached < 0 ? SlotFault::position : SlotFault::past_pages;
        outcome.position = cached;
        return outcome;
    }
    const int64_t position = cached + (t - from.cu_seqlens_q[b]);
    outcome.position = position;
    if (position >= capacity) {
        outcome.fault = SlotFault::past_pages;
        return outcome;
    }
    outcome.entry = position / to.page_size;
    outcome.page = from.block_table[b * from.row_stride + outcome.entry];
    if (outcome.page < 0 || outcome.page >= to.pages) {
        outcome.fault = SlotFault::page;
        return outcome;
    }
    outcome.slot = outcome.page * to.page_size + position % to.page_size;
    return outcome;
}

#if ROPE_HAVE_CUDA
/// @brief The CUDA form of slot_mapping_from_flashinfer_indptr (cuda/slot_mapping.cu):
/// scalars already checked; checks the pointers and enqueues the kernel on to.stream.
void cuda_slot_mapping_from_flashinfer_indptr(const FlashInferAppend& from, const SlotMappingOutput& to);
/// @brief The CUDA form of slot_mapping_from_flashinfer_positions (cuda/slot_mapping.cu).
void cuda_slot_mapping_from_flashinfer_positions(const FlashInferPositions& from, const SlotMappingOutput& to);
/// @brief The CUDA form of slot_mapping_from_block_table (cuda/slot_mapping.cu).
void cuda_slot_mapping_from_block_table(const BlockTable& from, const SlotMappingOutput& to);
#endif

}  // namespace rope
