#pragma once
// From arrays as DLPack describes them to one rope::apply call.
//
// Shared by the nanobind module (python/src/module.cpp: NumPy, PyTorch and
// CuPy arrays imported through DLPack) and the PyTorch operator
// (python/torch_ops/: at::Tensor from PyTorch's dispatcher). Both describe an
// array the same way (Array: DLPack's pointer, dtype, device, shape and strides
// in elements), so one piece of code checks the arrays, names the bad one and
// assembles rope::RopeArgs; each caller adds only what is its own (keeping the
// producer alive, the GIL, the CUDA device guard and stream). Nothing here
// includes Python or PyTorch headers.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <rope/rope.hpp>

namespace rope_python {

/// DLPack's codes (dlpack.h), which nanobind and PyTorch use alike.
namespace dlpack {
enum class Code : uint8_t { Int = 0, UInt = 1, Float = 2, Bfloat = 4, Complex = 5, Bool = 6 };
enum DeviceType : int { cpu = 1, cuda = 2, cuda_host = 3, cuda_managed = 13 };
}  // namespace dlpack

/// A DLPack element type: code, bits, lanes.
struct ElementType {
    uint8_t code = 0;
    uint8_t bits = 0;
    uint16_t lanes = 1;
};

/// One array as DLPack describes it. It does not own the memory: the caller
/// keeps the producer alive for the whole call.
struct Array {
    void* data = nullptr;
    ElementType dtype;
    int device_type = dlpack::cpu;
    int device_id = 0;
    size_t ndim = 0;
    const int64_t* shape = nullptr;
    const int64_t* strides = nullptr;  ///< In elements, one per axis (never null when ndim > 0).

    /// Elements in the array (1 for a 0-d array).
    int64_t size() const {
        int64_t n = 1;
        for (size_t i = 0; i < ndim; ++i) n *= shape[i];
        return n;
    }
};

/// Where an array lives, for rope (host or cuda) and for the CUDA device guard.
struct Placement {
    rope::Device device = rope::Device::host;
    int cuda_device = -1;  ///< CUDA device ordinal, -1 on the host.
};

/// The rope device of a DLPack device type: CPU memory and CUDA pinned host
/// memory are the host; CUDA and CUDA managed memory are cuda. Anything else
/// (ROCm, Metal, ...) throws rope::Error naming @p name.
Placement placement_of(std::string_view name, int device_type, int device_id);

/// The rope storage type of a DLPack dtype: float32, float16, bfloat16; a
/// uint16 array counts as bfloat16 when @p bfloat16_bits is set (NumPy's
/// ml_dtypes.bfloat16, which DLPack cannot describe, is passed as its bits).
rope::DType storage_type(std::string_view name, ElementType dtype, bool bfloat16_bits);

/// A q/k view of @p array in @p layout: 4-D for bhsd and bshd, 3-D for thd.
/// Shape and strides are taken as they are (strides in elements, as DLPack
/// gives them); rope::apply checks them (negative strides, overlapping outputs).
rope::TensorView tensor_view(std::string_view name, const Array& array, rope::Layout layout, bool bfloat16_bits);

/// A contiguous int64 array (position ids, cu_seqlens, starts): its pointer and shape.
struct IndexArray {
    const int64_t* data = nullptr;
    std::array<int64_t, 3> shape{};
    int ndim = 0;
    Placement placement;
};

/// An int64, row-major array of 1 to @p max_ndim dimensions, or throws rope::Error.
IndexArray index_array(std::string_view name, const Array& array, int max_ndim);

/// A [rows, rotary_dim] table in vLLM's cos_sin_cache layout; rows may be padded.
rope::CosSinCache cos_sin_cache(const Array& array, Placement& placement);

/// The arrays of one call; null stands for None. In place when q_out is null.
struct CallArrays {
    const Array* q = nullptr;
    const Array* k = nullptr;  ///< Null: rotate q only.
    const Array* q_out = nullptr;
    const Array* k_out = nullptr;
    const Array* ids = nullptr;
    const Array* cu_seqlens = nullptr;
    const Array* starts = nullptr;
    const Array* cos_sin_cache = nullptr;
};

/// What rope::apply needs, checked: the backend, its arguments (stream unset),
/// and the CUDA device every CUDA array of the call is on (-1 if none).
struct Call {
    rope::Backend* backend = nullptr;
    rope::RopeArgs args;
    int cuda_device = -1;
};

/// The scalar arguments of a call, as Python passes them.
struct CallOptions {
    std::string_view backend;  ///< Empty: the default for q's device (default_backend).
    std::string_view layout;   ///< "bhsd", "bshd" or "thd".
    int64_t offset = 0;
    int64_t cp_size = 1;
    int64_t cp_rank = 0;
    int64_t max_position = 0;
    bool inverse = false;
    int bfloat16_bits = 0;  ///< Bit 0 q, 1 k, 2 q_out, 3 k_out hold bfloat16 as uint16.
    /// Names of q, its output and the positions in messages (rope.rerotate passes its keys as q:
    /// "k", "out", "from_positions" or "to_positions").
    std::string_view q_name = "q", q_out_name = "out[0]", positions_name = "positions";
};

/// Checks the arrays of one call and assembles it; throws rope::Error naming
/// the first bad argument (rope::apply checks the rest).
Call prepare_call(const rope::RopeConfig& config, const CallArrays& arrays, const CallOptions& options);

/// The backend called @p name, one object per name shared by every caller and
/// thread (rope's backends may be called from several threads at once:
/// rope/backend.hpp); creating one per call would cost an allocation (and, for
/// CUDA, more) on every call. Throws rope::Error for unknown or unavailable names.
rope::Backend& backend_named(std::string_view name);

}  // namespace rope_python
