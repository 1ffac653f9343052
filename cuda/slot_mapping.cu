// The slot-mapping converters on the GPU (rope/slot_mapping.hpp): one thread
// per token, each applying the rule the host shares
// (rope/detail/slot_mapping_rules.hpp) and writing -1 where the host would
// refuse the metadata, since a kernel cannot report which entry was bad and the
// arrays cannot be read before the launch without a copy and a wait. The rules
// read every entry inside its array, whatever the arrays hold.
#include <initializer_list>

#include "check.hpp"
#include "pointer_check.hpp"
#include "rope/detail/slot_mapping_rules.hpp"

namespace rope {
namespace {

template <typename From, typename Rule>
__global__ void slot_mapping_kernel(From from, SlotMappingOutput to, Rule rule) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < to.tokens; t += stride) {
        const SlotOutcome outcome = rule(from, to, t);
        to.slot_mapping[t] = outcome.fault == SlotFault::none ? outcome.slot : -1;
    }
}

struct IndptrRule {
    __device__ SlotOutcome operator()(const FlashInferAppend& f, const SlotMappingOutput& to, int64_t t) const {
        return flashinfer_indptr_slot(f, to, t);
    }
};
struct PositionsRule {
    __device__ SlotOutcome operator()(const FlashInferPositions& f, const SlotMappingOutput& to, int64_t t) const {
        return flashinfer_positions_slot(f, to, t);
    }
};
struct BlockTableRule {
    __device__ SlotOutcome operator()(const BlockTable& f, const SlotMappingOutput& to, int64_t t) const {
        return block_table_slot(f, to, t);
    }
};

// Refuses, naming it, an array the kernel will read or write that is not memory
// of the current device (cuda/pointer_check.hpp); an array with no element to
// read (`used` false) is not asked about.
struct Used {
    const char* name;
    const void* pointer;
    bool used;
};
void check_arrays(std::initializer_list<Used> arrays) {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    for (const Used& array : arrays)
        if (array.used) cuda_detail::check_device_pointer(array.name, array.pointer, device);
}

template <typename From, typename Rule>
void launch(const char* name, const From& from, const SlotMappingOutput& to, Rule rule) {
    cuda_detail::launch_kernel(name,
                               cuda_detail::grid_stride_config(to.tokens, 256, static_cast<cudaStream_t>(to.stream)),
                               slot_mapping_kernel<From, Rule>, from, to, rule);
}

}  // namespace

void cuda_slot_mapping_from_flashinfer_indptr(const FlashInferAppend& from, const SlotMappingOutput& to) {
    if (to.tokens == 0) return;
    check_arrays({{"slot_mapping", to.slot_mapping, true},
                  {"append_indptr", from.append_indptr, true},
                  {"kv_indptr", from.kv_indptr, true},
                  {"kv_indices", from.kv_indices, from.kv_indices_size > 0},
                  {"kv_last_page_len", from.kv_last_page_len, from.batch > 0}});
    launch("slot_mapping_from_flashinfer_indptr", from, to, IndptrRule{});
}

void cuda_slot_mapping_from_flashinfer_positions(const FlashInferPositions& from, const SlotMappingOutput& to) {
    if (to.tokens == 0) return;
    check_arrays({{"slot_mapping", to.slot_mapping, true},
                  {"batch_indices", from.batch_indices, true},
                  {"positions", from.positions, true},
                  {"kv_indptr", from.kv_indptr, true},
                  {"kv_indices", from.kv_indices, from.kv_indices_size > 0}});
    launch("slot_mapping_from_flashinfer_positions", from, to, PositionsRule{});
}

void cuda_slot_mapping_from_block_table(const BlockTable& from, const SlotMappingOutput& to) {
    if (to.tokens == 0) return;
    check_arrays({{"slot_mapping", to.slot_mapping, true},
                  {"block_table", from.block_table, from.batch > 0 && from.max_blocks_per_seq > 0},
                  {"cache_seqlens", from.cache_seqlens, from.batch > 0},
                  {"cu_seqlens_q", from.cu_seqlens_q, true}});
    launch("slot_mapping_from_block_table", from, to, BlockTableRule{});
}

}  // namespace rope
