#pragma once
/// @file pointer_check.hpp
/// @brief Refuses, before any launch, a pointer that is not memory of the current CUDA
/// device (internal to the CUDA backends).
///
/// make_plan checks the Device each view *declares*: a host view handed to a
/// CUDA backend is refused there. A view that declares Device::cuda but points
/// at host memory, or at memory of another GPU, passes that check, and the
/// kernel would then fault (an illegal address, reported at some later,
/// unrelated synchronising call) or, with peer access, quietly work on another
/// GPU's memory. So each CUDA backend asks the driver where every pointer its
/// kernels will dereference really lives (cudaPointerGetAttributes) and refuses,
/// naming the parameter, anything but:
/// - device memory of the current device (cudaMalloc, cudaMallocAsync, pools), or
/// - managed memory (cudaMallocManaged), which migrates to whichever device touches it.
/// Pageable host memory (malloc, new, std::vector) and page-locked host memory
/// (cudaMallocHost, cudaHostRegister) are refused even where the GPU could reach
/// them (mapped pinned memory, Grace Hopper's system memory): Device::cuda means
/// memory of the current device (rope/tensor.hpp), and a kernel that quietly
/// read its operands over the host bus would run many times slower.
///
/// The check is a host-side query per pointer: it neither allocates nor
/// synchronises. It runs when rope::apply is called (during capture, for a CUDA
/// graph), not when a captured graph is replayed. tests/cuda_under_load_test.cpp
/// captures rope::apply in the strictest capture mode, where a call that is
/// unsafe during capture would fail the capture.

#include <cuda_runtime_api.h>

#include <string>

#include "check.hpp"
#include "rope/detail/kv_append_plan.hpp"
#include "rope/detail/plan.hpp"
#include "rope/error.hpp"

namespace rope::cuda_detail {

/// @brief Throws rope::Error naming @p name unless @p pointer is memory of CUDA device
/// @p device or managed memory.
/// @param name the parameter as the user spells it, e.g. "q.data"
/// @param pointer the address the kernel will read or write
/// @param device the current CUDA device
inline void check_device_pointer(const char* name, const void* pointer, int device) {
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
    if (status == cudaErrorInvalidValue) {  // An address CUDA does not know at all.
        cudaGetLastError();                 // Reported here; not left behind for the caller's next check.
        fail(name, pointer, "is not memory CUDA knows (cudaPointerGetAttributes: cudaErrorInvalidValue)");
    }
    check_cuda(status, "cudaPointerGetAttributes");  // Any other failure, in CUDA's own words.
    switch (attributes.type) {
        case cudaMemoryTypeDevice:
            if (attributes.device != device)
                fail(name, pointer,
                     "is memory of CUDA device " + std::to_string(attributes.device) + ", but the current device is " +
                         std::to_string(device) + " (call cudaSetDevice(" + std::to_string(attributes.device) +
                         ") before rope::apply, or copy the data)");
            return;
        case cudaMemoryTypeManaged:
            return;
        case cudaMemoryTypeHost:
            fail(name, pointer,
                 "is page-locked host memory (cudaMallocHost/cudaHostRegister), not memory of the CUDA device: "
                 "copy it to the device, or use a Device::host view with a CPU backend");
        case cudaMemoryTypeUnregistered:
            break;
    }
    fail(name, pointer,
         "is host memory (malloc/new), not memory of the CUDA device: copy it to the device (cudaMalloc + "
         "cudaMemcpy), or use a Device::host view with a CPU backend");
}

/// @brief Checks every pointer the kernels of @p plan will dereference: q, k and their
/// outputs (of operands with heads), the position arrays and a caller's cos/sin table.
/// @param plan a validated, non-empty plan for Device::cuda.
/// @throws rope::Error naming the first pointer that is not memory of the current device.
inline void check_device_pointers(const Plan& plan) {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    auto check_operand = [&](const Operand& operand, const char* in_name, const char* out_name) {
        if (operand.in_geometry.heads == 0) return;  // No element of it is touched.
        check_device_pointer(in_name, operand.in, device);
        if (operand.out != operand.in) check_device_pointer(out_name, operand.out, device);
    };
    check_operand(plan.q, "q.data", "q_out.data");
    check_operand(plan.k, "k.data", "k_out.data");
    auto check_array = [&](const void* pointer, const char* name) {
        if (pointer != nullptr) check_device_pointer(name, pointer, device);
    };
    check_array(plan.positions.ids, "positions.ids");
    check_array(plan.positions.cu_seqlens, "positions.cu_seqlens");
    check_array(plan.positions.starts, "positions.starts");
    if (plan.positions.relative) {  // A re-rotation's second form (rope/rerotate.hpp).
        check_array(plan.positions.from.ids, "from.ids");
        check_array(plan.positions.from.cu_seqlens, "from.cu_seqlens");
        check_array(plan.positions.from.starts, "from.starts");
    }
    check_array(plan.angles.table.data, "cos_sin_cache.data");
}

/// @brief Checks every pointer a RoPE + KV append kernel will dereference: the rotation's (above),
/// v, the slots, both caches and their scales.
/// @param plan a validated, non-empty plan for Device::cuda.
/// @throws rope::Error naming the first pointer that is not memory of the current device.
inline void check_device_pointers(const KvAppendPlan& plan) {
    check_device_pointers(plan.rope);
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_device_pointer("v.data", plan.v, device);
    if (plan.slot_count > 0) check_device_pointer("slot_mapping.slots", plan.slots, device);
    check_device_pointer("k_cache.data", plan.k_cache.data, device);
    check_device_pointer("v_cache.data", plan.v_cache.data, device);
    if (plan.k_cache.scale != nullptr) check_device_pointer("k_cache.scale", plan.k_cache.scale, device);
    if (plan.v_cache.scale != nullptr) check_device_pointer("v_cache.scale", plan.v_cache.scale, device);
    if (plan.quantises_q()) {
        check_device_pointer("q_out_fp8.data", plan.q_fp8.data, device);
        check_device_pointer("q_out_fp8.scale", plan.q_fp8.scale, device);
    }
}

}  // namespace rope::cuda_detail
