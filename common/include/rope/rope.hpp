#pragma once
/// @file rope.hpp
/// @brief Umbrella header: include this to use rope.
///
/// @code
/// #include <rope/rope.hpp>
/// auto backend = rope::make_backend("cpu-naive");
/// rope::RopeConfig config{.head_dim = 64};
/// auto q = rope::TensorView::contiguous(q_data, rope::DType::f32, rope::Device::host,
///                                       rope::Layout::bhsd, {4, 8, 256, 64});
/// auto k = rope::TensorView::contiguous(k_data, rope::DType::f32, rope::Device::host,
///                                       rope::Layout::bhsd, {4, 8, 256, 64});
/// rope::apply(*backend, config, rope::RopeArgs::in_place(q, k));
/// @endcode

#include "rope/args.hpp"
#include "rope/backend.hpp"
#include "rope/buffer.hpp"
#include "rope/config.hpp"
#include "rope/device.hpp"
#include "rope/dtype.hpp"
#include "rope/error.hpp"
#include "rope/fp8.hpp"
#include "rope/frequency_table.hpp"
#include "rope/kv_append.hpp"
#include "rope/position_ids.hpp"
#include "rope/positions.hpp"
#include "rope/qk_norm.hpp"
#include "rope/rerotate.hpp"
#include "rope/rotation.hpp"
#include "rope/slot_mapping.hpp"
#include "rope/tensor.hpp"

// What only a backend author needs (the Plan, the shared pair step, the
// backend factories) lives in rope/detail/ and is not included here.

/// @brief Rotary Position Embedding: the interface shared by every backend.
///
/// Describe the model with RopeConfig, the tensors with TensorView and the
/// positions with Positions; create a backend by name with make_backend() and
/// call apply(). Every invalid argument raises rope::Error.
namespace rope {}
