#pragma once
// From DLPack arrays to rope's views: how a NumPy array, a PyTorch tensor or a
// CuPy array becomes a rope::TensorView without copying a byte.
//
// DLPack is the exchange format every array library speaks: a C struct
// (DLTensor) with the data pointer, the dtype, the device, the shape and the
// strides in elements, handed over in a Python capsule by the producer's
// __dlpack__() method. nanobind's nb::ndarray reads it (or the buffer
// protocol, for objects without __dlpack__) and holds a reference to the
// producer for as long as the nb::ndarray lives, so the memory stays valid for
// the whole rope call. Nothing here copies or converts: an array rope cannot
// use as it is is refused with a rope::Error that names it.
#include <array>
#include <cstdint>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <rope/rope.hpp>

namespace rope_python {

namespace nb = nanobind;

/// An array imported for reading (read-only arrays are fine).
using InputArray = nb::ndarray<nb::ro>;
/// An array imported for writing (a read-only one is refused).
using OutputArray = nb::ndarray<>;

/// Imports @p object for reading, or throws rope::Error saying why it cannot be
/// (no DLPack or buffer interface, or the producer's own export error).
InputArray import_input(const std::string& name, nb::handle object);

/// Imports @p object for writing, or throws rope::Error (read-only, no DLPack, ...).
OutputArray import_output(const std::string& name, nb::handle object);

/// Where a DLPack array lives, for rope (host or cuda) and for the CUDA device guard.
struct Placement {
    rope::Device device = rope::Device::host;
    int cuda_device = -1;  ///< CUDA device ordinal, -1 on the host.
};

/// The rope device of a DLPack device type: CPU memory and CUDA pinned host
/// memory are the host; CUDA and CUDA managed memory are cuda. Anything else
/// (ROCm, Metal, ...) throws rope::Error naming @p name.
Placement placement_of(const std::string& name, int device_type, int device_id);

/// The rope storage type of a DLPack dtype: float32, float16, bfloat16; a
/// uint16 array counts as bfloat16 when @p bfloat16_bits is set (NumPy's
/// ml_dtypes.bfloat16, which DLPack cannot describe, is passed as its bits).
rope::DType storage_type(const std::string& name, nb::dlpack::dtype dtype, bool bfloat16_bits);

/// A q/k view of @p array in @p layout: 4-D for bhsd and bshd, 3-D for thd.
/// Shape and strides are taken as they are (strides in elements, as DLPack
/// gives them); rope::apply checks them (negative strides, overlapping outputs).
template <typename Array>
rope::TensorView tensor_view(const std::string& name, const Array& array, rope::Layout layout, bool bfloat16_bits);

/// A contiguous int64 array (position ids, cu_seqlens, starts): its pointer and shape.
struct IndexArray {
    const int64_t* data = nullptr;
    std::array<int64_t, 3> shape{};
    int ndim = 0;
    Placement placement;
};

/// Imports an int64, row-major array of 1 to @p max_ndim dimensions, or throws rope::Error.
IndexArray index_array(const std::string& name, const InputArray& array, int max_ndim);

/// A [rows, rotary_dim] float32 table in vLLM's cos_sin_cache layout; rows may be padded.
rope::CosSinCache cos_sin_cache(const InputArray& array, Placement& placement);

}  // namespace rope_python
