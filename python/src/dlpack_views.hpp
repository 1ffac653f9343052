#pragma once
// From Python objects to rope's arrays: how a NumPy array, a PyTorch tensor or
// a CuPy array becomes an Array (call_args.hpp) without copying a byte.
//
// DLPack is the exchange format every array library speaks: a C struct
// (DLTensor) with the data pointer, the dtype, the device, the shape and the
// strides in elements, handed over in a Python capsule by the producer's
// __dlpack__() method. nanobind's nb::ndarray reads it (or the buffer
// protocol, for objects without __dlpack__) and holds a reference to the
// producer for as long as the nb::ndarray lives, so the memory stays valid for
// the whole rope call. Nothing here copies or converts: an object rope cannot
// use as it is is refused with a rope::Error that names it. What an array must
// be for rope (dtype, shape, strides, device) is checked in call_args.cpp,
// which the PyTorch operator shares.
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "call_args.hpp"

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

/// The Array that @p array describes; valid while @p array lives.
template <typename NbArray>
Array array_of(const NbArray& array) {
    const nb::dlpack::dtype dtype = array.dtype();
    return {const_cast<void*>(static_cast<const void*>(array.data())),
            {dtype.code, dtype.bits, dtype.lanes},
            array.device_type(),
            array.device_id(),
            array.ndim(),
            array.shape_ptr(),
            array.stride_ptr()};
}

}  // namespace rope_python
