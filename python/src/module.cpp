// rope._rope: the C++ library, reached from Python.
//
// The module is thin on purpose: the C++ structs appear under their own names
// (RopeConfig, Scaling, BackendInfo), arrays cross through DLPack without a
// copy (dlpack_views.hpp), and one function, apply(), imports them, has
// call_args.hpp check them and assemble rope::RopeArgs (the code the PyTorch
// operator in python/torch_ops/ shares) and calls rope::apply; append_kv() does the same for
// rope::append_kv through kv_append_args.hpp. What is Python's business (HuggingFace dicts, keyword
// defaults, streams of PyTorch and CuPy, bfloat16 NumPy arrays) lives in the
// pure-Python package rope/ on top of it.
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#if ROPE_PYTHON_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <rope/rope.hpp>

#include "config_key.hpp"
#include "dlpack_views.hpp"
#include "kv_append_args.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace rope_python {
namespace {

// --- The CUDA device of a call ------------------------------------------------------
// rope's CUDA backends run on the current CUDA device. A PyTorch tensor on
// cuda:1 carries its device with it; the call makes that device current for
// its duration (as PyTorch's own device guard does) and puts it back after.
class CudaDeviceGuard {
public:
    explicit CudaDeviceGuard(int device) {
#if ROPE_PYTHON_HAVE_CUDA
        if (device < 0) return;
        if (cudaGetDevice(&previous_) != cudaSuccess) rope::fail("cuda device", device, "cudaGetDevice failed");
        if (previous_ != device && cudaSetDevice(device) != cudaSuccess)
            rope::fail("cuda device", device, "cudaSetDevice failed");
        if (previous_ == device) previous_ = -1;
#else
        (void)device;
#endif
    }
    ~CudaDeviceGuard() {
#if ROPE_PYTHON_HAVE_CUDA
        if (previous_ >= 0) cudaSetDevice(previous_);
#endif
    }
    CudaDeviceGuard(const CudaDeviceGuard&) = delete;
    CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

private:
    int previous_ = -1;
};

// --- apply -------------------------------------------------------------------------------
// One rope::apply call. q_out/k_out None: in place. k None: rotate q only.
// bfloat16_bits: bit 0 q, 1 k, 2 q_out, 3 k_out hold bfloat16 as uint16.
void apply(const std::string& backend_name, const rope::RopeConfig& config, nb::handle q, nb::handle k,
           nb::handle q_out, nb::handle k_out, const std::string& layout_name, int64_t offset, nb::handle ids,
           nb::handle cu_seqlens, nb::handle starts, int64_t cp_size, int64_t cp_rank, int64_t max_position,
           nb::handle cos_sin_cache, bool inverse, uintptr_t stream, int bfloat16_bits) {
    // Every array stays imported (and its producer referenced) until the call returns.
    const bool in_place = q_out.is_none();
    std::optional<InputArray> read[8];
    std::optional<OutputArray> written[4];
    Array arrays[8];
    // Imports argument number @p role: for writing when rope writes into it, else for reading.
    auto take = [&](int role, const char* name, nb::handle object, bool writes) -> const Array* {
        if (object.is_none() && role != 0) return nullptr;  // q is required: importing None names it.
        if (writes) arrays[role] = array_of(*(written[role] = import_output(name, object)));
        else arrays[role] = array_of(*(read[role] = import_input(name, object)));
        return &arrays[role];
    };
    CallArrays call_arrays;
    call_arrays.q = take(0, "q", q, in_place);
    call_arrays.k = take(1, "k", k, in_place);
    call_arrays.q_out = take(2, "out[0]", q_out, true);
    call_arrays.k_out = take(3, "out[1]", k_out, true);
    call_arrays.ids = take(4, "positions", ids, false);
    call_arrays.cu_seqlens = take(5, "cu_seqlens", cu_seqlens, false);
    call_arrays.starts = take(6, "starts", starts, false);
    call_arrays.cos_sin_cache = take(7, "cos_sin_cache", cos_sin_cache, false);

    CallOptions options{backend_name, layout_name, offset, cp_size, cp_rank, max_position, inverse, bfloat16_bits};
    Call call = prepare_call(config, call_arrays, options);
    call.args.stream = reinterpret_cast<void*>(stream);
    CudaDeviceGuard device_guard(call.cuda_device);
    // Long CPU calls must not stall other Python threads: the arrays are held above.
    nb::gil_scoped_release no_gil;
    rope::apply(*call.backend, config, call.args);
}

// --- append_kv ---------------------------------------------------------------------------
// One rope::append_kv call: q and k rotated (in place, or into q_out and k_out), the rotated k and v
// written into their caches at the slots of slot_mapping. bfloat16_bits: bit 0 q, 1 k, 2 q_out,
// 3 k_out, 4 v, 5 k_cache, 6 v_cache hold bfloat16 as uint16. A uint8 q_out, or any q_out with
// q_out_dtype named, is the FP8 output of q (rope::Fp8Output, scales q_scale): q is then only read.
void append_kv(const std::string& backend_name, const rope::RopeConfig& config, nb::handle q, nb::handle k,
               nb::handle v, nb::handle q_out, nb::handle k_out, int64_t offset, nb::handle ids,
               nb::handle slot_mapping, nb::handle k_cache, nb::handle v_cache, nb::handle k_scale,
               nb::handle v_scale, const std::string& kv_layout, int64_t page_size, const std::string& k_cache_dtype,
               const std::string& v_cache_dtype, nb::handle cos_sin_cache, int64_t max_position, uintptr_t stream,
               int bfloat16_bits, nb::handle q_scale, const std::string& q_out_dtype) {
    const bool in_place = q_out.is_none();
    std::optional<InputArray> read[13];
    std::optional<OutputArray> written[13];
    Array arrays[13];
    auto take = [&](int role, const char* name, nb::handle object, bool writes) -> const Array* {
        if (object.is_none() && role > 4) return nullptr;  // q, k, v, and the caches are required.
        if (writes) arrays[role] = array_of(*(written[role] = import_output(name, object)));
        else arrays[role] = array_of(*(read[role] = import_input(name, object)));
        return &arrays[role];
    };
    KvAppendArrays call_arrays;
    call_arrays.rope.q = take(0, "q", q, in_place);
    call_arrays.rope.k = take(1, "k", k, in_place);
    call_arrays.v = take(2, "v", v, false);
    call_arrays.k_cache = take(3, "k_cache", k_cache, true);
    call_arrays.v_cache = take(4, "v_cache", v_cache, true);
    call_arrays.rope.q_out = take(5, "out[0]", q_out, true);
    call_arrays.rope.k_out = take(6, "out[1]", k_out, true);
    call_arrays.rope.ids = take(7, "positions", ids, false);
    call_arrays.slot_mapping = take(8, "slot_mapping", slot_mapping, false);
    call_arrays.k_scale = take(9, "k_scale", k_scale, false);
    call_arrays.v_scale = take(10, "v_scale", v_scale, false);
    call_arrays.rope.cos_sin_cache = take(11, "cos_sin_cache", cos_sin_cache, false);
    call_arrays.q_scale = take(12, "q_scale", q_scale, false);
    if (call_arrays.slot_mapping == nullptr) rope::fail("slot_mapping", "None", "append_kv needs it");

    KvAppendOptions options;
    options.rope = CallOptions{backend_name, "thd", offset, 1, 0, max_position, false, bfloat16_bits & 15};
    options.kv_layout = kv_layout;
    options.page_size = page_size;
    options.k_cache_dtype = k_cache_dtype;
    options.v_cache_dtype = v_cache_dtype;
    options.bfloat16_bits = bfloat16_bits >> 4;
    options.q_out_dtype = q_out_dtype;
    KvAppendCall call = prepare_kv_append(config, call_arrays, options);
    call.args.stream = reinterpret_cast<void*>(stream);
    CudaDeviceGuard device_guard(call.cuda_device);
    nb::gil_scoped_release no_gil;
    rope::append_kv(*call.backend, config, call.args);
}

// --- Slot mappings -----------------------------------------------------------------------
// The converters of rope/slot_mapping.hpp on imported int64 arrays. The Python
// wrappers (rope/_slot_mapping.py) convert other integer types, allocate `out`
// and pick the stream; here each array's shape is checked against the others,
// and all must live on one device.
class SlotMappingArrays {
public:
    // Imports @p object (int64, contiguous, @p ndim dimensions) for reading.
    const IndexArray& input(const char* name, nb::handle object, int ndim = 1) {
        return add(name, array_of(*(read_[count_] = import_input(name, object))), ndim);
    }
    // Imports the output, [tokens] int64.
    const IndexArray& output(nb::handle object) {
        return add("out", array_of(*(written_ = import_output("out", object))), 1);
    }
    // Where every array lives (checked alike), and the CUDA device to make current.
    const Placement& placement() const { return placement_; }

private:
    const IndexArray& add(const char* name, const Array& array, int ndim) {
        IndexArray& index = arrays_[count_++] = index_array(name, array, ndim);
        if (index.ndim != ndim) rope::fail(std::string(name) + ".ndim", index.ndim, "must be " + std::to_string(ndim));
        if (count_ == 1) {
            placement_ = index.placement;
            first_ = name;
        } else if (index.placement.device != placement_.device ||
                   index.placement.cuda_device != placement_.cuda_device) {
            rope::fail(std::string(name) + ".device", std::string(rope::device_name(index.placement.device)),
                       "must be where " + first_ + " is (" + std::string(rope::device_name(placement_.device)) +
                           (placement_.cuda_device >= 0 ? ":" + std::to_string(placement_.cuda_device) : "") + ")");
        }
        return index;
    }
    std::optional<InputArray> read_[5];
    std::optional<OutputArray> written_;
    IndexArray arrays_[6];
    int count_ = 0;
    Placement placement_;
    std::string first_;
};

void require_length(const char* name, const IndexArray& array, int64_t length, const char* what) {
    if (array.shape[0] != length)
        rope::fail(std::string(name) + ".shape[0]", array.shape[0],
                   "must be " + std::string(what) + " = " + std::to_string(length));
}

// Calls @p convert with the output filled in, on the arrays' device and @p stream, without the GIL.
template <typename Convert>
void run_slot_mapping(SlotMappingArrays& arrays, const IndexArray& out, int64_t page_size, int64_t pages,
                      uintptr_t stream, Convert convert) {
    rope::SlotMappingOutput to;
    to.slot_mapping = const_cast<int64_t*>(out.data);
    to.tokens = out.shape[0];
    to.page_size = page_size;
    to.pages = pages;
    to.device = arrays.placement().device;
    to.stream = reinterpret_cast<void*>(stream);
    CudaDeviceGuard device_guard(arrays.placement().cuda_device);
    nb::gil_scoped_release no_gil;
    convert(to);
}

void slot_mapping_from_flashinfer_indptr(nb::handle append_indptr, nb::handle kv_indptr, nb::handle kv_indices,
                                         nb::handle kv_last_page_len, nb::handle out, int64_t page_size,
                                         int64_t pages, uintptr_t stream) {
    SlotMappingArrays arrays;
    const IndexArray& indptr = arrays.input("kv_indptr", kv_indptr);
    const int64_t batch = indptr.shape[0] - 1;
    if (batch < 0) rope::fail("kv_indptr.shape[0]", indptr.shape[0], "must be batch + 1 >= 1");
    const IndexArray& append = arrays.input("append_indptr", append_indptr);
    require_length("append_indptr", append, batch + 1, "kv_indptr.shape[0]");
    const IndexArray& indices = arrays.input("kv_indices", kv_indices);
    const IndexArray& last = arrays.input("kv_last_page_len", kv_last_page_len);
    require_length("kv_last_page_len", last, batch, "batch (kv_indptr.shape[0] - 1)");
    const IndexArray& result = arrays.output(out);
    rope::FlashInferAppend from{append.data, indptr.data, indices.data, indices.shape[0], last.data, batch};
    run_slot_mapping(arrays, result, page_size, pages, stream,
                     [&](const rope::SlotMappingOutput& to) { rope::slot_mapping_from_flashinfer_indptr(from, to); });
}

void slot_mapping_from_flashinfer_positions(nb::handle batch_indices, nb::handle positions, nb::handle kv_indptr,
                                            nb::handle kv_indices, nb::handle out, int64_t page_size, int64_t pages,
                                            uintptr_t stream) {
    SlotMappingArrays arrays;
    const IndexArray& indptr = arrays.input("kv_indptr", kv_indptr);
    const int64_t batch = indptr.shape[0] - 1;
    if (batch < 0) rope::fail("kv_indptr.shape[0]", indptr.shape[0], "must be batch + 1 >= 1");
    const IndexArray& indices = arrays.input("kv_indices", kv_indices);
    const IndexArray& requests = arrays.input("batch_indices", batch_indices);
    const IndexArray& where = arrays.input("positions", positions);
    const IndexArray& result = arrays.output(out);
    require_length("batch_indices", requests, result.shape[0], "tokens (out.shape[0])");
    require_length("positions", where, result.shape[0], "tokens (out.shape[0])");
    rope::FlashInferPositions from{requests.data, where.data, indptr.data, indices.data, indices.shape[0], batch};
    run_slot_mapping(arrays, result, page_size, pages, stream, [&](const rope::SlotMappingOutput& to) {
        rope::slot_mapping_from_flashinfer_positions(from, to);
    });
}

void slot_mapping_from_block_table(nb::handle block_table, nb::handle cache_seqlens, nb::handle cu_seqlens_q,
                                   nb::handle out, int64_t page_size, int64_t pages, uintptr_t stream) {
    SlotMappingArrays arrays;
    const IndexArray& table = arrays.input("block_table", block_table, 2);
    const int64_t batch = table.shape[0];
    const IndexArray& cached = arrays.input("cache_seqlens", cache_seqlens);
    require_length("cache_seqlens", cached, batch, "batch (block_table.shape[0])");
    const IndexArray& cu = arrays.input("cu_seqlens_q", cu_seqlens_q);
    require_length("cu_seqlens_q", cu, batch + 1, "batch + 1");
    const IndexArray& result = arrays.output(out);
    rope::BlockTable from{table.data, table.shape[1], table.shape[1], cached.data, cu.data, batch};
    run_slot_mapping(arrays, result, page_size, pages, stream,
                     [&](const rope::SlotMappingOutput& to) { rope::slot_mapping_from_block_table(from, to); });
}

// --- apply_qk_norm -------------------------------------------------------------------------
// One rope::apply_qk_norm call: q and k as views (q_out None: in place), or a packed 2-D qkv
// buffer (q and k None). bfloat16_bits: bit 0 q, 1 k, 2 q_out, 3 k_out, 4 q_weight,
// 5 k_weight, 6 qkv, 7 v_out hold bfloat16 as uint16.
void apply_qk_norm(const std::string& backend_name, const rope::RopeConfig& config, nb::handle q, nb::handle k,
                   nb::handle q_out, nb::handle k_out, nb::handle qkv, int64_t q_heads, int64_t kv_heads,
                   nb::handle v_out, nb::handle q_weight, nb::handle k_weight, const std::string& kind,
                   const std::string& rounding, double eps, const std::string& layout_name, int64_t offset,
                   nb::handle ids, nb::handle cos_sin_cache, uintptr_t stream, int bfloat16_bits) {
    const bool packed = !qkv.is_none();
    auto bit = [&](int i) { return (bfloat16_bits >> i & 1) != 0; };
    // Slots: inputs 0 ids, 1 table, 2 q, 3 k, 4 q_weight, 5 k_weight; outputs 0 qkv, 1 q, 2 k,
    // 3 q_out, 4 k_out, 5 v_out. Every array stays imported until the call returns.
    std::optional<InputArray> read[6];
    std::optional<OutputArray> written[6];
    Array arrays[12];
    auto input = [&](int slot, const char* name, nb::handle object) -> const Array* {
        if (object.is_none()) return nullptr;
        return &(arrays[slot] = array_of(*(read[slot] = import_input(name, object))));
    };
    auto output = [&](int slot, const char* name, nb::handle object) -> const Array* {
        if (object.is_none()) return nullptr;
        return &(arrays[6 + slot] = array_of(*(written[slot] = import_output(name, object))));
    };
    CallArrays call_arrays;
    call_arrays.ids = input(0, "positions", ids);
    call_arrays.cos_sin_cache = input(1, "cos_sin_cache", cos_sin_cache);
    rope::QkvBuffer buffer;
    int64_t slice_shape[2][3], slice_strides[2][3];
    Array slices[2];
    if (packed) {
        if (!q.is_none() || !k.is_none()) rope::fail("q", "set", "must be None with a qkv buffer");
        const Array& all = *output(0, "qkv", qkv);
        if (all.ndim != 2 || all.strides[1] != 1)
            rope::fail("qkv", std::to_string(all.ndim) + "-D", "must be a 2-D [tokens, width] array, rows contiguous");
        buffer = rope::QkvBuffer{all.data, storage_type("qkv", all.dtype, bit(6)),
                                 placement_of("qkv", all.device_type, all.device_id).device,
                                 all.shape[0], all.shape[1], q_heads, kv_heads, all.strides[0]};
        // q's and k's slices as thd arrays: what prepare_call reads (positions, table, backend).
        const int64_t heads[2] = {q_heads, kv_heads}, first[2] = {0, q_heads * config.head_dim};
        for (int i = 0; i < 2; ++i) {
            slices[i] = all;
            slices[i].data = static_cast<char*>(all.data) + first[i] * all.dtype.bits / 8;
            slices[i].ndim = 3;
            slice_shape[i][0] = all.shape[0], slice_shape[i][1] = heads[i], slice_shape[i][2] = config.head_dim;
            slice_strides[i][0] = all.strides[0], slice_strides[i][1] = config.head_dim, slice_strides[i][2] = 1;
            slices[i].shape = slice_shape[i];
            slices[i].strides = slice_strides[i];
        }
        call_arrays.q = &slices[0];
        call_arrays.k = &slices[1];
    } else {
        const bool in_place = q_out.is_none();
        call_arrays.q = in_place ? output(1, "q", q) : input(2, "q", q);
        call_arrays.k = in_place ? output(2, "k", k) : input(3, "k", k);
        call_arrays.q_out = output(3, "out[0]", q_out);
        call_arrays.k_out = output(4, "out[1]", k_out);
    }
    CallOptions options{backend_name, packed ? std::string_view("thd") : std::string_view(layout_name), offset, 1, 0, 0, false, bfloat16_bits & 15};
    if (packed) options.bfloat16_bits = bit(6) ? 3 : 0;
    Call call = prepare_call(config, call_arrays, options);

    rope::QkNormArgs args;
    if (packed) {
        args = rope::QkNormArgs::packed(buffer);
        if (const Array* v = output(5, "v_out", v_out)) args.v_out = tensor_view("v_out", *v, rope::Layout::thd, bit(7));
    } else {
        if (!v_out.is_none()) rope::fail("v_out", "set", "is only written with a qkv buffer");
        args.q = call.args.q, args.k = call.args.k, args.q_out = call.args.q_out, args.k_out = call.args.k_out;
    }
    auto weight = [&](int slot, const char* name, nb::handle object, int weight_bit) {
        if (object.is_none()) return rope::NormWeight{};
        const Array& w = *input(slot, name, object);
        if (w.ndim != 1 || (w.shape[0] > 1 && w.strides[0] != 1))
            rope::fail(name, std::to_string(w.ndim) + "-D", "must be a contiguous 1-D array");
        return rope::NormWeight{w.data, storage_type(name, w.dtype, bit(weight_bit)),
                                placement_of(name, w.device_type, w.device_id).device, w.shape[0]};
    };
    args.q_weight = weight(4, "q_weight", q_weight, 4);
    args.k_weight = weight(5, "k_weight", k_weight, 5);
    args.kind = rope::parse_qk_norm_kind(kind);
    args.rounding = rope::parse_qk_norm_rounding(rounding);
    args.eps = eps;
    args.positions = call.args.positions;
    args.cos_sin_cache = call.args.cos_sin_cache;
    args.stream = reinterpret_cast<void*>(stream);
    CudaDeviceGuard device_guard(call.cuda_device);
    nb::gil_scoped_release no_gil;
    rope::apply_qk_norm(*call.backend, config, args);
}

// --- rerotate ----------------------------------------------------------------------------
// One rope::rerotate call: keys k (k_out None: in place) from positions `from` to `to`, each
// an offset or ids. The keys travel through prepare_call as its q, once per position argument.
// bfloat16_bits: bit 0 k, bit 2 k_out.
void rerotate(const std::string& backend_name, const rope::RopeConfig& config, nb::handle k, nb::handle k_out,
              const std::string& layout_name, int64_t from_offset, nb::handle from_ids, int64_t from_max_position,
              int64_t to_offset, nb::handle to_ids, int64_t to_max_position, uintptr_t stream, int bfloat16_bits) {
    const bool in_place = k_out.is_none();
    std::optional<InputArray> read[3];
    std::optional<OutputArray> written[2];
    Array keys[2], ids[2];
    if (in_place) keys[0] = array_of(*(written[0] = import_output("k", k)));
    else keys[0] = array_of(*(read[0] = import_input("k", k)));
    if (!in_place) keys[1] = array_of(*(written[1] = import_output("out", k_out)));
    auto positions = [&](int side, const char* name, nb::handle object, int64_t offset, int64_t max_position) {
        CallArrays arrays;
        arrays.q = &keys[0];
        arrays.q_out = in_place ? nullptr : &keys[1];
        if (!object.is_none()) arrays.ids = &(ids[side] = array_of(*(read[1 + side] = import_input(name, object))));
        CallOptions options{backend_name, layout_name, offset, 1, 0, max_position, false, bfloat16_bits};
        options.q_name = "k";
        options.q_out_name = "out";
        options.positions_name = name;
        return prepare_call(config, arrays, options);
    };
    const Call from = positions(0, "from_positions", from_ids, from_offset, from_max_position);
    const Call to = positions(1, "to_positions", to_ids, to_offset, to_max_position);
    rope::RerotateArgs args{to.args.q, to.args.q_out, from.args.positions, to.args.positions,
                            reinterpret_cast<void*>(stream)};
    CudaDeviceGuard device_guard(to.cuda_device);
    nb::gil_scoped_release no_gil;
    rope::rerotate(*to.backend, config, args);
}

// --- rerotate_cache ----------------------------------------------------------------------
// One rope::rerotate_cache call: the rows of k_cache (NHD or HND in kv_layout's order, or 3-D
// single-head) at slot_mapping's slots, turned in place from `from` to `to`, each an offset or
// ids. prepare_call checks each position argument against a stand-in [T, heads, head_dim]
// array at the cache's address (never read), as rope::rerotate_cache plans the call.
// bfloat16_bits: bit 0 k_cache.
void rerotate_cache(const std::string& backend_name, const rope::RopeConfig& config, nb::handle k_cache,
                    nb::handle slot_mapping, const std::string& kv_layout, int64_t from_offset, nb::handle from_ids,
                    int64_t from_max_position, int64_t to_offset, nb::handle to_ids, int64_t to_max_position,
                    uintptr_t stream, int bfloat16_bits) {
    const OutputArray cache_array = import_output("k_cache", k_cache);
    const InputArray slots_array = import_input("slot_mapping", slot_mapping);
    const Array cache = array_of(cache_array);
    const IndexArray slots = index_array("slot_mapping", array_of(slots_array), 1);
    if (cache.dtype.code == uint8_t(dlpack::Code::UInt) && cache.dtype.bits == 8)
        rope::fail("k_cache.dtype", "uint8",
                   "FP8 caches are refused: turning one would dequantise and quantise again, rounding twice "
                   "(re-rotate keys while they are in the model dtype)");
    KvAppendOptions options;
    options.kv_layout = kv_layout;
    const bool bfloat16 = (bfloat16_bits & 1) != 0;
    const rope::DType dtype = storage_type("k_cache.dtype", cache.dtype, bfloat16);
    const rope::PagedCache paged = paged_cache("k_cache", cache, options, "", bfloat16, dtype);
    const int64_t shape[3] = {slots.shape[0], paged.heads, paged.head_dim};
    const int64_t strides[3] = {paged.heads * paged.head_dim, paged.head_dim, 1};
    Array stand_in = cache;
    stand_in.ndim = 3;
    stand_in.shape = shape;
    stand_in.strides = strides;
    std::optional<InputArray> read[2];
    Array ids[2];
    auto positions = [&](int side, const char* name, nb::handle object, int64_t offset, int64_t max_position) {
        CallArrays arrays;
        arrays.q = &stand_in;
        if (!object.is_none()) arrays.ids = &(ids[side] = array_of(*(read[side] = import_input(name, object))));
        CallOptions call_options{backend_name, "thd", offset, 1, 0, max_position, false, bfloat16_bits & 1};
        call_options.q_name = "k_cache";
        call_options.positions_name = name;
        return prepare_call(config, arrays, call_options);
    };
    const Call from = positions(0, "from_positions", from_ids, from_offset, from_max_position);
    const Call to = positions(1, "to_positions", to_ids, to_offset, to_max_position);
    const rope::RerotateCacheArgs args{paged, dtype,
                                       rope::SlotMapping{slots.data, slots.shape[0], slots.placement.device},
                                       from.args.positions, to.args.positions, reinterpret_cast<void*>(stream)};
    CudaDeviceGuard device_guard(to.cuda_device);
    nb::gil_scoped_release no_gil;
    rope::rerotate_cache(*to.backend, config, args);
}

}  // namespace
}  // namespace rope_python

NB_MODULE(_rope, m) {
    m.doc() = "rope's C++ library, reached through DLPack. Use the package rope, not this module.";

    // At interpreter exit PyTorch's operator registry still holds rope.ops (and
    // through its cache, RopeConfig objects): nanobind would report them as
    // leaks, which they are not.
    nb::set_leak_warnings(false);

    // rope::Error becomes rope.Error, a ValueError carrying the C++ message.
    nb::exception<rope::Error>(m, "Error", PyExc_ValueError);

    nb::enum_<rope::Style>(m, "Style", "Which two features of a head form one rotated pair.")
        .value("half_split", rope::Style::half_split, "feature i with i + rotary_dim/2 (NeoX, HF rotate_half)")
        .value("interleaved", rope::Style::interleaved, "feature 2i with 2i+1 (GPT-J)")
        .value("interleaved_to_half", rope::Style::interleaved_to_half,
               "pairs (2i, 2i+1) read, written to (i, i + rotary_dim/2) (HF's DeepSeek apply_rotary_pos_emb_interleave)")
        .value("half_to_interleaved", rope::Style::half_to_interleaved,
               "pairs (i, i + rotary_dim/2) read, written to (2i, 2i+1): the reverse of interleaved_to_half");
    nb::enum_<rope::ScalingType>(m, "ScalingType", "HuggingFace rope_type of the frequency scaling.")
        .value("none", rope::ScalingType::none)
        .value("linear", rope::ScalingType::linear)
        .value("dynamic", rope::ScalingType::dynamic)
        .value("yarn", rope::ScalingType::yarn)
        .value("llama3", rope::ScalingType::llama3)
        .value("longrope", rope::ScalingType::longrope)
        .value("deepseek_yarn", rope::ScalingType::deepseek_yarn);
    nb::enum_<rope::AxisAssignment>(m, "AxisAssignment", "How rotated pairs are shared among position axes.")
        .value("single", rope::AxisAssignment::single)
        .value("mrope_contiguous", rope::AxisAssignment::mrope_contiguous)
        .value("mrope_interleaved", rope::AxisAssignment::mrope_interleaved)
        .value("axial", rope::AxisAssignment::axial);

    m.def("parse_style", [](const std::string& name) { return rope::parse_style(name); }, "name"_a,
          "Style of a name: neox / half_split / half-split, gptj / interleaved, interleaved_to_half, half_to_interleaved.");
    m.def("style_name", [](rope::Style style) { return std::string(rope::style_name(style)); }, "style"_a,
          "The name of a Style: neox, gptj, interleaved_to_half or half_to_interleaved.");
    m.def("softmax_scale_multiplier", [](const rope::Scaling& scaling) { return rope::softmax_scale_multiplier(scaling); },
          "scaling"_a,
          "rope::softmax_scale_multiplier: yarn_get_mscale(factor, mscale_all_dim)**2 for deepseek_yarn and yarn, else 1.");
    m.def("parse_scaling_type", [](const std::string& name) { return rope::parse_scaling_type(name); }, "rope_type"_a,
          "ScalingType of a HuggingFace rope_type.");
    m.def("scaling_type_name", [](rope::ScalingType type) { return std::string(rope::scaling_type_name(type)); },
          "type"_a, "HuggingFace's rope_type string of a ScalingType.");

    nb::class_<rope::Scaling>(m, "Scaling", "rope::Scaling: frequency scaling, HuggingFace's field names.")
        .def(nb::init<>())
        .def_rw("type", &rope::Scaling::type)
        .def_rw("factor", &rope::Scaling::factor)
        .def_rw("original_max_position_embeddings", &rope::Scaling::original_max_position_embeddings)
        .def_rw("attention_factor", &rope::Scaling::attention_factor)
        .def_rw("beta_fast", &rope::Scaling::beta_fast)
        .def_rw("beta_slow", &rope::Scaling::beta_slow)
        .def_rw("truncate", &rope::Scaling::truncate)
        .def_rw("mscale", &rope::Scaling::mscale)
        .def_rw("mscale_all_dim", &rope::Scaling::mscale_all_dim)
        .def_rw("low_freq_factor", &rope::Scaling::low_freq_factor)
        .def_rw("high_freq_factor", &rope::Scaling::high_freq_factor)
        .def_rw("short_factor", &rope::Scaling::short_factor)
        .def_rw("long_factor", &rope::Scaling::long_factor);

    nb::class_<rope::RopeConfig>(m, "RopeConfig", "rope::RopeConfig: what a model's RoPE is.")
        .def(nb::init<>())
        .def_rw("head_dim", &rope::RopeConfig::head_dim)
        .def_rw("rotary_dim", &rope::RopeConfig::rotary_dim)
        .def_rw("rotary_offset", &rope::RopeConfig::rotary_offset)
        .def_rw("base", &rope::RopeConfig::base)
        .def_rw("style", &rope::RopeConfig::style)
        .def_rw("scaling", &rope::RopeConfig::scaling)
        .def_rw("precise_angles", &rope::RopeConfig::precise_angles)
        .def_prop_rw(
            "assignment", [](const rope::RopeConfig& c) { return c.multi_axis.assignment; },
            [](rope::RopeConfig& c, rope::AxisAssignment a) { c.multi_axis.assignment = a; })
        .def_prop_rw(
            "sections", [](const rope::RopeConfig& c) { return c.multi_axis.sections; },
            [](rope::RopeConfig& c, std::vector<int64_t> s) { c.multi_axis.sections = std::move(s); })
        .def("effective_rotary_dim", &rope::RopeConfig::effective_rotary_dim)
        .def("validate", [](const rope::RopeConfig& c) { rope::validate(c); },
             "Raises rope.Error naming the first field out of range.");

    m.def(
        "config_from_key", [](const std::string& key) { return rope_python::config_from_key(key); }, "key"_a,
        "The validated RopeConfig a rope.Config.key describes (the reader the PyTorch operator's C++ kernel uses).");

    m.def(
        "frequency_table",
        [](const rope::RopeConfig& config, int64_t max_position) {
            const rope::FrequencyTable table = rope::make_frequency_table(config, max_position);
            return nb::make_tuple(std::vector<float>(table.inv_freq.begin(), table.inv_freq.end()),
                                  table.attention_factor);
        },
        "config"_a, "max_position"_a,
        "(inv_freq, attention_factor): theta_i in float32 and the factor on cos and sin, as every backend uses them.");

    m.def(
        "cos_sin_cache",
        [](const rope::RopeConfig& config, int64_t rows, int64_t max_position) {
            // The array owns the vector: NumPy frees it with the last reference.
            auto* table = new std::vector<float>(rope::make_cos_sin_cache(config, rows, max_position));
            nb::capsule owner(table, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            const size_t shape[2] = {size_t(rows), size_t(config.effective_rotary_dim())};
            return nb::ndarray<nb::numpy, float, nb::ndim<2>>(table->data(), 2, shape, owner);
        },
        "config"_a, "rows"_a, "max_position"_a,
        "rope::make_cos_sin_cache: the float32 [rows, rotary_dim] cos/sin table of a configuration (vLLM's layout).");

    nb::class_<rope::BackendInfo>(m, "BackendInfo", "What the registry knows about one backend.")
        .def_ro("name", &rope::BackendInfo::name)
        .def_ro("description", &rope::BackendInfo::description)
        .def_prop_ro("device", [](const rope::BackendInfo& info) { return std::string(rope::device_name(info.device)); })
        .def_ro("available", &rope::BackendInfo::available)
        .def_ro("reason", &rope::BackendInfo::reason)
        .def("__repr__", [](const rope::BackendInfo& info) {
            return "BackendInfo(name='" + info.name + "', device='" + std::string(rope::device_name(info.device)) +
                   "', available=" + (info.available ? "True" : "False") +
                   (info.available ? "" : ", reason='" + info.reason + "'") + ")";
        });
    m.def("list_backends", &rope::list_backends, "Every backend rope knows, available here or not.");

    m.def("apply", &rope_python::apply, "backend"_a, "config"_a, "q"_a.none(), "k"_a.none(), "q_out"_a.none(),
          "k_out"_a.none(), "layout"_a, "offset"_a, "ids"_a.none(), "cu_seqlens"_a.none(), "starts"_a.none(),
          "cp_size"_a, "cp_rank"_a, "max_position"_a, "cos_sin_cache"_a.none(), "inverse"_a, "stream"_a,
          "bfloat16_bits"_a,
          "One rope::apply call on DLPack arrays (all positional; rope.apply is the documented entry point).");

    m.def("append_kv", &rope_python::append_kv, "backend"_a, "config"_a, "q"_a.none(), "k"_a.none(), "v"_a.none(),
          "q_out"_a.none(), "k_out"_a.none(), "offset"_a, "ids"_a.none(), "slot_mapping"_a.none(),
          "k_cache"_a.none(), "v_cache"_a.none(), "k_scale"_a.none(), "v_scale"_a.none(), "kv_layout"_a,
          "page_size"_a, "k_cache_dtype"_a, "v_cache_dtype"_a, "cos_sin_cache"_a.none(), "max_position"_a,
          "stream"_a, "bfloat16_bits"_a, "q_scale"_a.none() = nb::none(), "q_out_dtype"_a = "",
          "One rope::append_kv call on DLPack arrays (all positional; rope.append_kv is the documented entry point).");
    m.def("slot_mapping_from_flashinfer_indptr", &rope_python::slot_mapping_from_flashinfer_indptr,
          "append_indptr"_a, "kv_indptr"_a, "kv_indices"_a, "kv_last_page_len"_a, "out"_a, "page_size"_a, "pages"_a,
          "stream"_a,
          "rope::slot_mapping_from_flashinfer_indptr on int64 DLPack arrays (rope.slot_mapping_from_flashinfer_indptr "
          "is the documented entry point).");
    m.def("slot_mapping_from_flashinfer_positions", &rope_python::slot_mapping_from_flashinfer_positions,
          "batch_indices"_a, "positions"_a, "kv_indptr"_a, "kv_indices"_a, "out"_a, "page_size"_a, "pages"_a,
          "stream"_a,
          "rope::slot_mapping_from_flashinfer_positions on int64 DLPack arrays "
          "(rope.slot_mapping_from_flashinfer_positions is the documented entry point).");
    m.def("slot_mapping_from_block_table", &rope_python::slot_mapping_from_block_table, "block_table"_a,
          "cache_seqlens"_a, "cu_seqlens_q"_a, "out"_a, "page_size"_a, "pages"_a, "stream"_a,
          "rope::slot_mapping_from_block_table on int64 DLPack arrays (rope.slot_mapping_from_block_table is the "
          "documented entry point).");
    m.def("apply_qk_norm", &rope_python::apply_qk_norm, "backend"_a, "config"_a, "q"_a.none(), "k"_a.none(),
          "q_out"_a.none(), "k_out"_a.none(), "qkv"_a.none(), "q_heads"_a, "kv_heads"_a, "v_out"_a.none(),
          "q_weight"_a.none(), "k_weight"_a.none(), "kind"_a, "rounding"_a, "eps"_a, "layout"_a, "offset"_a,
          "ids"_a.none(), "cos_sin_cache"_a.none(), "stream"_a, "bfloat16_bits"_a,
          "One rope::apply_qk_norm call on DLPack arrays (rope.apply_qk_norm is the documented entry point).");
    m.def("rerotate", &rope_python::rerotate, "backend"_a, "config"_a, "k"_a.none(), "k_out"_a.none(), "layout"_a,
          "from_offset"_a, "from_ids"_a.none(), "from_max_position"_a, "to_offset"_a, "to_ids"_a.none(),
          "to_max_position"_a, "stream"_a, "bfloat16_bits"_a,
          "One rope::rerotate call on DLPack arrays (all positional; rope.rerotate is the documented entry point).");
    m.def("rerotate_cache", &rope_python::rerotate_cache, "backend"_a, "config"_a, "k_cache"_a.none(),
          "slot_mapping"_a.none(), "kv_layout"_a, "from_offset"_a, "from_ids"_a.none(), "from_max_position"_a,
          "to_offset"_a, "to_ids"_a.none(), "to_max_position"_a, "stream"_a, "bfloat16_bits"_a,
          "One rope::rerotate_cache call on DLPack arrays (all positional; rope.rerotate_cache is the documented "
          "entry point).");
}
