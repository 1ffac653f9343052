#pragma once
/// @file slot_mapping.hpp
/// @brief Slot mappings from the page metadata of other engines: FlashInfer's
/// two forms and flash-attn's block table.
///
/// A paged KV cache stores a request's tokens in pages of `page_size` slots,
/// pages in any order. rope addresses it the way vLLM does, with a **slot
/// mapping**: int64 `[tokens]`, slot = page * page_size + offset in the page,
/// and a negative slot for a token that is rotated but not written (padding).
/// Other engines describe the same thing with per-request page tables; these
/// converters turn their metadata into a slot mapping, on the host or on the
/// GPU (all arrays on the same device, Device::cuda work enqueued on the
/// caller's stream without waiting).
///
/// Host arrays are checked element by element: any value out of range is a
/// rope::Error naming the array, the index and the value, and nothing is
/// written. Device arrays cannot be read before the launch: the kernel checks
/// every entry where it reads it and writes slot -1 for a token whose metadata
/// is out of range (a page index outside [0, pages), a position past the
/// request's pages, a malformed indptr), never reading outside the arrays.
/// A slot mapping made on the GPU from bad metadata therefore writes nothing
/// for those tokens instead of writing somewhere wrong.
///
/// All arithmetic is 64-bit.

#include <cstdint>

#include "rope/tensor.hpp"

namespace rope {

/// @brief Where a converter writes, and the cache its slots address.
struct SlotMappingOutput {
    int64_t* slot_mapping = nullptr;  ///< The result, int64 `[tokens]`.
    int64_t tokens = 0;               ///< Tokens of the step (entries of slot_mapping), >= 0.
    int64_t page_size = 0;            ///< Slots per page, >= 1.
    int64_t pages = 0;                ///< Pages in the cache: every page index must lie in [0, pages).
    Device device = Device::host;     ///< Where every array of the call lives (inputs and output).
    void* stream = nullptr;           ///< The cudaStream_t of a Device::cuda call (null: the default stream).
};

/// @brief FlashInfer's paged-KV description with `append_indptr` (form 1): the
/// arguments of `get_batch_indices_positions` and `append_paged_kv_cache`.
///
/// Request b owns pages kv_indices[kv_indptr[b] .. kv_indptr[b+1]) in order, the
/// last one filled to kv_last_page_len[b], so its sequence (the step's tokens
/// included) is max(n_b - 1, 0) * page_size + kv_last_page_len[b] tokens long,
/// n_b = kv_indptr[b+1] - kv_indptr[b] (FlashInfer's get_seq_lens). Its appended
/// tokens, append_indptr[b] .. append_indptr[b+1] of the step, are the last ones
/// of that sequence (as get_batch_indices_positions computes). Tokens from
/// append_indptr[batch] up to `tokens` are padding: slot -1. (Followed:
/// FlashInfer's flashinfer/page.py, get_seq_lens and get_batch_indices_positions,
/// and include/flashinfer/page.cuh, AppendPagedKVCacheKernel: page
/// kv_indices[kv_indptr[b] + position / page_size], entry position % page_size.)
struct FlashInferAppend {
    const int64_t* append_indptr = nullptr;     ///< `[batch + 1]`: 0 first, non-decreasing, last <= tokens.
    const int64_t* kv_indptr = nullptr;         ///< `[batch + 1]`: >= 0, non-decreasing, last <= kv_indices_size.
    const int64_t* kv_indices = nullptr;        ///< `[kv_indices_size]`: page indices, each in [0, pages).
    int64_t kv_indices_size = 0;                ///< Entries of kv_indices, >= 0.
    const int64_t* kv_last_page_len = nullptr;  ///< `[batch]`: each in [0, page_size].
    int64_t batch = 0;                          ///< Requests, >= 0.
};

/// @brief FlashInfer's paged-KV description with `batch_indices` and
/// `positions` (form 2), as `append_paged_kv_cache` reads them.
///
/// Token t goes to position positions[t] of request batch_indices[t], whose
/// pages are kv_indices[kv_indptr[b] .. kv_indptr[b+1]); batch index -1 marks a
/// padding token: slot -1 (FlashInfer's get_batch_indices_positions fills
/// batch_indices with -1 where no request's token lies).
struct FlashInferPositions {
    const int64_t* batch_indices = nullptr;  ///< `[tokens]`: each -1 or in [0, batch).
    const int64_t* positions = nullptr;      ///< `[tokens]`: each >= 0 and below the request's pages * page_size.
    const int64_t* kv_indptr = nullptr;      ///< `[batch + 1]`: >= 0, non-decreasing, last <= kv_indices_size.
    const int64_t* kv_indices = nullptr;     ///< `[kv_indices_size]`: page indices, each in [0, pages).
    int64_t kv_indices_size = 0;             ///< Entries of kv_indices, >= 0.
    int64_t batch = 0;                       ///< Requests, >= 0.
};

/// @brief flash-attn's paged KV cache (`flash_attn_with_kvcache`): a block
/// table, the tokens already cached, and the step's tokens per request.
///
/// Token j of request b (cu_seqlens_q[b] + j, j < cu_seqlens_q[b+1] -
/// cu_seqlens_q[b]) goes to position cache_seqlens[b] + j, in page
/// block_table[b][position / page_size]. Tokens from cu_seqlens_q[batch] up to
/// `tokens` are padding: slot -1. (Followed: flash-attn's
/// flash_attn_interface.py, whose flash_attn_with_kvcache writes the new k and v
/// "starting at the indices specified by cache_seqlens", into pages of
/// block_table [batch, max_num_blocks_per_seq]; its FlashAttention-3 form in
/// hopper/ calls the table page_table and takes cu_seqlens_q for a packed q.)
struct BlockTable {
    const int64_t* block_table = nullptr;    ///< `[batch, max_blocks_per_seq]`, rows `row_stride` apart: page indices.
    int64_t max_blocks_per_seq = 0;          ///< Columns of block_table, >= 0.
    int64_t row_stride = 0;                  ///< Elements between rows, >= max_blocks_per_seq (0: max_blocks_per_seq).
    const int64_t* cache_seqlens = nullptr;  ///< `[batch]`: tokens cached before this step, each >= 0.
    const int64_t* cu_seqlens_q = nullptr;   ///< `[batch + 1]`: 0 first, non-decreasing, last <= tokens.
    int64_t batch = 0;                       ///< Requests, >= 0.
};

/// @brief The slot mapping of FlashInfer's form 1 (append_indptr, kv_indptr,
/// kv_indices, kv_last_page_len).
/// @param from the page metadata.
/// @param to the output and the cache it addresses.
/// @throws rope::Error naming the parameter and its value for anything out of
/// range (host arrays: every element; device arrays: the sizes and pointers, see
/// the file's documentation); nothing is written then.
void slot_mapping_from_flashinfer_indptr(const FlashInferAppend& from, const SlotMappingOutput& to);

/// @brief The slot mapping of FlashInfer's form 2 (batch_indices, positions,
/// kv_indptr, kv_indices).
/// @param from the page metadata.
/// @param to the output and the cache it addresses.
/// @throws rope::Error as slot_mapping_from_flashinfer_indptr().
void slot_mapping_from_flashinfer_positions(const FlashInferPositions& from, const SlotMappingOutput& to);

/// @brief The slot mapping of flash-attn's block table (block_table,
/// cache_seqlens, cu_seqlens_q).
/// @param from the page metadata.
/// @param to the output and the cache it addresses.
/// @throws rope::Error as slot_mapping_from_flashinfer_indptr().
void slot_mapping_from_block_table(const BlockTable& from, const SlotMappingOutput& to);

}  // namespace rope
