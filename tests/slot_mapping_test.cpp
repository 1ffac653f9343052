// The slot-mapping converters (rope/slot_mapping.hpp): FlashInfer's two forms
// and flash-attn's block table on hand-worked batches (expected slots worked
// out in the comments: slot = page * page_size + position % page_size, page =
// the request's page list at position / page_size), permuted page tables,
// padding, an empty request, a strided block table; every bad input refused
// naming the array and value with nothing written; and the CUDA kernels
// against the host on random page tables (skipped without a GPU).
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "rope/buffer.hpp"
#include "rope/cuda_check.hpp"
#include "rope/error.hpp"
#include "rope/slot_mapping.hpp"
#include "support.hpp"

using Vec = std::vector<int64_t>;

namespace {

constexpr int64_t poison = 0x5eed5eed;

// page_size 4, pages 10. Four requests; pages in no particular order:
//  request 0: pages 7, 2 (kv_indices[0..2)), last page holds 3: sequence 1*4 + 3 = 7 tokens
//  request 1: page 5 (kv_indices[2..3)), last page holds 1: sequence 1 token
//  request 2: pages 0, 9, 4 (kv_indices[3..6)), last page full: sequence 2*4 + 4 = 12 tokens
//  request 3: no pages, nothing appended
struct Batch {
    Vec kv_indptr{0, 2, 3, 6, 6};
    Vec kv_indices{7, 2, 5, 0, 9, 4};
    Vec kv_last_page_len{3, 1, 4, 0};
    Vec append_indptr{0, 2, 3, 6, 6};  // 2, 1, 3 and 0 tokens appended; tokens 6 and 7 are padding
    int64_t batch = 4;
};

rope::SlotMappingOutput output_of(Vec& slots, int64_t page_size, int64_t pages) {
    rope::SlotMappingOutput to;
    to.slot_mapping = slots.data();
    to.tokens = int64_t(slots.size());
    to.page_size = page_size;
    to.pages = pages;
    return to;
}

rope::FlashInferAppend append_of(Batch& b) {
    return {b.append_indptr.data(), b.kv_indptr.data(), b.kv_indices.data(), int64_t(b.kv_indices.size()),
            b.kv_last_page_len.data(), b.batch};
}

// Runs `convert`, which must throw a rope::Error containing every needle, and
// checks that no slot was written.
template <typename Convert>
void expect_refused(Convert convert, Vec& slots, std::initializer_list<const char*> needles) {
    std::fill(slots.begin(), slots.end(), poison);
    std::string message;
    try {
        convert();
    } catch (const rope::Error& error) {
        message = error.what();
    }
    INFO("message: " << message);
    REQUIRE_FALSE(message.empty());
    for (const char* needle : needles) CHECK_MESSAGE(message.find(needle) != std::string::npos, "lacks: " << needle);
    CHECK(std::all_of(slots.begin(), slots.end(), [](int64_t s) { return s == poison; }));
}

}  // namespace

TEST_CASE("slot mapping: FlashInfer append_indptr + kv_indptr/kv_indices/kv_last_page_len") {
    Batch b;
    Vec slots(8, poison);
    rope::slot_mapping_from_flashinfer_indptr(append_of(b), output_of(slots, 4, 10));
    // Request 0 appends its last 2 tokens: positions 5, 6 -> page list entry 1 = page 2, offsets 1, 2: 9, 10.
    // Request 1 appends its only token: position 0 -> page 5, offset 0: 20.
    // Request 2 appends its last 3: positions 9, 10, 11 -> entry 2 = page 4, offsets 1, 2, 3: 17, 18, 19.
    // Tokens 6 and 7 lie past append_indptr[4] = 6: padding, -1.
    CHECK(slots == Vec{9, 10, 20, 17, 18, 19, -1, -1});
}

TEST_CASE("slot mapping: FlashInfer batch_indices + positions, -1 is padding") {
    Batch b;
    Vec batch_indices{2, -1, 0, 0, 1};
    Vec positions{0, 99, 4, 7, 0};
    Vec slots(5, poison);
    rope::FlashInferPositions from{batch_indices.data(), positions.data(), b.kv_indptr.data(), b.kv_indices.data(),
                                   int64_t(b.kv_indices.size()), b.batch};
    rope::slot_mapping_from_flashinfer_positions(from, output_of(slots, 4, 10));
    // (2, 0): request 2's entry 0 = page 0, offset 0: 0. (-1, 99): padding, -1 (its position is not read).
    // (0, 4): request 0's entry 1 = page 2, offset 0: 8. (0, 7): page 2, offset 3: 11. (1, 0): page 5: 20.
    CHECK(slots == Vec{0, -1, 8, 11, 20});
}

TEST_CASE("slot mapping: flash-attn block_table (strided rows) + cache_seqlens + cu_seqlens_q") {
    // page_size 4, pages 8, 3 blocks per sequence in rows 5 apart (columns 3 and 4 hold 99, never read).
    Vec block_table{6, 5, 3, 99, 99,  //
                    2, 7, 0, 99, 99};
    Vec cache_seqlens{6, 0};
    Vec cu_seqlens_q{0, 3, 5};
    Vec slots(6, poison);
    rope::BlockTable from{block_table.data(), 3, 5, cache_seqlens.data(), cu_seqlens_q.data(), 2};
    rope::slot_mapping_from_block_table(from, output_of(slots, 4, 8));
    // Request 0: positions 6, 7 -> block 1 = page 5, offsets 2, 3: 22, 23; position 8 -> block 2 = page 3: 12.
    // Request 1: positions 0, 1 -> block 0 = page 2: 8, 9. Token 5 lies past cu_seqlens_q[2] = 5: -1.
    CHECK(slots == Vec{22, 23, 12, 8, 9, -1});
    // Row stride 0 means max_blocks_per_seq: the same table, packed.
    Vec packed{6, 5, 3, 2, 7, 0};
    from.block_table = packed.data();
    from.row_stride = 0;
    std::fill(slots.begin(), slots.end(), poison);
    rope::slot_mapping_from_block_table(from, output_of(slots, 4, 8));
    CHECK(slots == Vec{22, 23, 12, 8, 9, -1});
}

TEST_CASE("slot mapping: slots beyond 2^31 (64-bit arithmetic)") {
    // page 3,000,000,000 of page_size 16: slot 48,000,000,000 + offset.
    Vec kv_indptr{0, 1}, kv_indices{3000000000}, last{16}, append_indptr{0, 2};
    Vec slots(2, poison);
    rope::FlashInferAppend from{append_indptr.data(), kv_indptr.data(), kv_indices.data(), 1, last.data(), 1};
    rope::slot_mapping_from_flashinfer_indptr(from, output_of(slots, 16, 3000000001));
    CHECK(slots == Vec{48000000014, 48000000015});  // positions 14, 15 of a 16-token sequence
}

TEST_CASE("slot mapping: bad FlashInfer append metadata is refused, naming it, nothing written") {
    Vec slots(8);
    auto run = [&](Batch b, int64_t page_size = 4, int64_t pages = 10) {
        return [b, &slots, page_size, pages]() mutable {
            rope::slot_mapping_from_flashinfer_indptr(append_of(b), output_of(slots, page_size, pages));
        };
    };
    Batch b;
    b.kv_indices[5] = 10;  // request 2's third page: one past the cache
    expect_refused(run(b), slots, {"kv_indices[5] = 10", "pages = 10"});
    b = Batch{};
    b.kv_indices[1] = -1;
    expect_refused(run(b), slots, {"kv_indices[1] = -1"});
    b = Batch{};
    b.append_indptr = {0, 2, 4, 6, 6};  // request 1 appends 2 tokens to a 1-token sequence
    expect_refused(run(b), slots, {"append_indptr[2] - append_indptr[1] = 2", "sequence length 1"});
    b = Batch{};
    b.append_indptr = {1, 2, 3, 6, 6};
    expect_refused(run(b), slots, {"append_indptr[0] = 1"});
    b = Batch{};
    b.append_indptr = {0, 3, 2, 6, 6};
    expect_refused(run(b), slots, {"append_indptr[2] = 2", "append_indptr[1] = 3"});
    b = Batch{};
    b.append_indptr = {0, 2, 3, 6, 9};
    expect_refused(run(b), slots, {"append_indptr[4] = 9", "tokens = 8"});
    b = Batch{};
    b.kv_last_page_len[2] = 5;
    expect_refused(run(b), slots, {"kv_last_page_len[2] = 5", "page_size = 4"});
    b = Batch{};
    b.kv_last_page_len[3] = 1;  // a request without pages
    expect_refused(run(b), slots, {"kv_last_page_len[3] = 1"});
    b = Batch{};
    b.kv_indptr = {0, 2, 3, 6, 7};
    expect_refused(run(b), slots, {"kv_indptr[4] = 7", "kv_indices_size = 6"});
    b = Batch{};
    b.kv_indptr = {0, 3, 2, 6, 6};
    expect_refused(run(b), slots, {"kv_indptr[2] = 2"});
    expect_refused(run(Batch{}, 0), slots, {"page_size = 0"});
    expect_refused(run(Batch{}, 4, -1), slots, {"pages = -1"});
    expect_refused(run(Batch{}, 1 << 20, int64_t(1) << 50), slots, {"pages = ", "exceeds int64"});
    Batch nulls;
    expect_refused(
        [&] {
            rope::FlashInferAppend from = append_of(nulls);
            from.kv_last_page_len = nullptr;
            rope::slot_mapping_from_flashinfer_indptr(from, output_of(slots, 4, 10));
        },
        slots, {"kv_last_page_len = null"});
    expect_refused(
        [&] {
            rope::FlashInferAppend from = append_of(nulls);
            from.batch = -1;
            rope::slot_mapping_from_flashinfer_indptr(from, output_of(slots, 4, 10));
        },
        slots, {"batch = -1"});
#if !ROPE_HAVE_CUDA
    expect_refused(
        [&] {
            rope::SlotMappingOutput to = output_of(slots, 4, 10);
            to.device = rope::Device::cuda;
            rope::slot_mapping_from_flashinfer_indptr(append_of(nulls), to);
        },
        slots, {"device = cuda"});
#endif
}

TEST_CASE("slot mapping: bad FlashInfer batch_indices/positions are refused, naming them, nothing written") {
    Vec slots(3);
    auto run = [&](Vec batch_indices, Vec positions, Batch b = Batch{}) {
        return [=, &slots]() mutable {
            rope::FlashInferPositions from{batch_indices.data(), positions.data(), b.kv_indptr.data(),
                                           b.kv_indices.data(), int64_t(b.kv_indices.size()), b.batch};
            rope::slot_mapping_from_flashinfer_positions(from, output_of(slots, 4, 10));
        };
    };
    expect_refused(run({0, 4, 1}, {0, 0, 0}), slots, {"batch_indices[1] = 4", "batch = 4"});
    expect_refused(run({0, -2, 1}, {0, 0, 0}), slots, {"batch_indices[1] = -2"});
    expect_refused(run({0, 1, 1}, {0, 0, -1}), slots, {"positions[2] = -1"});
    // Request 1 has one page: position 4 is past it; request 3 has none.
    expect_refused(run({0, 1, 1}, {0, 0, 4}), slots, {"positions[2] = 4", "past the pages"});
    expect_refused(run({3, 1, 1}, {0, 0, 0}), slots, {"positions[0] = 0", "request 3"});
    Batch b;
    b.kv_indices[2] = 12;
    expect_refused(run({0, 1, 1}, {0, 0, 3}, b), slots, {"kv_indices[2] = 12"});
}

TEST_CASE("slot mapping: bad flash-attn block tables are refused, naming them, nothing written") {
    Vec slots(6);
    auto run = [&](Vec table, Vec cache_seqlens, Vec cu, int64_t row_stride = 3) {
        return [=, &slots]() mutable {
            rope::BlockTable from{table.data(), 3, row_stride, cache_seqlens.data(), cu.data(), 2};
            rope::slot_mapping_from_block_table(from, output_of(slots, 4, 8));
        };
    };
    const Vec table{6, 5, 3, 2, 7, 0};
    expect_refused(run({6, 5, 8, 2, 7, 0}, {6, 0}, {0, 3, 5}), slots, {"block_table[0][2] = 8", "pages = 8"});
    expect_refused(run({6, -5, 3, 2, 7, 0}, {6, 0}, {0, 3, 5}), slots, {"block_table[0][1] = -5"});
    expect_refused(run(table, {-1, 0}, {0, 3, 5}), slots, {"cache_seqlens[0] = -1"});
    // Request 1: 11 cached + 2 new reach position 12, past its 3 blocks of 4.
    expect_refused(run(table, {6, 11}, {0, 3, 5}), slots, {"cache_seqlens[1] = 11", "3 blocks"});
    expect_refused(run(table, {6, 0}, {0, 3, 7}), slots, {"cu_seqlens_q[2] = 7", "tokens = 6"});
    expect_refused(run(table, {6, 0}, {0, 3, 2}), slots, {"cu_seqlens_q[2] = 2"});
    expect_refused(run(table, {6, 0}, {0, 3, 5}, 2), slots, {"row_stride = 2"});
}

TEST_CASE("slot mapping: random permuted page tables, the three forms agree") {
    // The same batch described three ways must give the same slots: FlashInfer's
    // form 1, its form 2 (batch_indices and positions built here by the
    // definition), and a block table (each request's page list as its row).
    CAPTURE(testing::seed());
    std::mt19937_64 rng(testing::seed());
    for (int trial = 0; trial < 50; ++trial) {
        const int64_t page_size = int64_t(1) << (rng() % 5);
        const int64_t batch = 1 + int64_t(rng() % 6), pages = 64;
        Vec order(static_cast<size_t>(pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        Vec kv_indptr{0}, kv_indices, last, append_indptr{0}, cached, batch_indices, positions;
        int64_t max_blocks = 0;
        for (int64_t b = 0; b < batch; ++b) {
            const int64_t n = 1 + int64_t(rng() % 4);
            for (int64_t i = 0; i < n; ++i) kv_indices.push_back(order[kv_indices.size()]);
            kv_indptr.push_back(int64_t(kv_indices.size()));
            last.push_back(1 + int64_t(rng() % uint64_t(page_size)));
            const int64_t sequence = (n - 1) * page_size + last.back();
            const int64_t appended = int64_t(rng() % uint64_t(sequence + 1));
            append_indptr.push_back(append_indptr.back() + appended);
            cached.push_back(sequence - appended);
            for (int64_t j = 0; j < appended; ++j) {
                batch_indices.push_back(b);
                positions.push_back(sequence - appended + j);
            }
            max_blocks = std::max(max_blocks, n);
        }
        Vec table(size_t(batch * max_blocks), -7);  // -7: never read (past each sequence)
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t i = kv_indptr[b]; i < kv_indptr[b + 1]; ++i)
                table[size_t(b * max_blocks + i - kv_indptr[b])] = kv_indices[i];
        const int64_t tokens = append_indptr.back() + 2;  // two padding tokens
        batch_indices.insert(batch_indices.end(), {-1, -1});
        positions.insert(positions.end(), {0, 0});
        Vec one(size_t(tokens), poison), two(size_t(tokens), poison), three(size_t(tokens), poison);
        const int64_t size = int64_t(kv_indices.size());
        rope::slot_mapping_from_flashinfer_indptr(
            {append_indptr.data(), kv_indptr.data(), kv_indices.data(), size, last.data(), batch},
            output_of(one, page_size, pages));
        rope::slot_mapping_from_flashinfer_positions(
            {batch_indices.data(), positions.data(), kv_indptr.data(), kv_indices.data(), size, batch},
            output_of(two, page_size, pages));
        rope::slot_mapping_from_block_table({table.data(), max_blocks, 0, cached.data(), append_indptr.data(), batch},
                                            output_of(three, page_size, pages));
        CHECK(one == two);
        CHECK(one == three);
        // Every written slot distinct, in range; the padding -1.
        Vec written(one.begin(), one.end() - 2);
        std::sort(written.begin(), written.end());
        CHECK(std::adjacent_find(written.begin(), written.end()) == written.end());
        CHECK(std::all_of(written.begin(), written.end(), [&](int64_t s) { return s >= 0 && s < pages * page_size; }));
        CHECK(one[size_t(tokens - 1)] == -1);
        CHECK(one[size_t(tokens - 2)] == -1);
    }
}

namespace {

// A host vector copied into device memory (at least one byte, so the pointer is real).
rope::Buffer on_device(const Vec& values) {
    rope::Buffer buffer(rope::Device::cuda, std::max<size_t>(values.size() * sizeof(int64_t), 1));
    if (!values.empty()) buffer.copy_from_host(values.data());
    return buffer;
}

const int64_t* pointer(const rope::Buffer& buffer) { return static_cast<const int64_t*>(buffer.data()); }

// Runs a converter on device copies of the arrays and returns the slots.
Vec device_slots(int64_t tokens, int64_t page_size, int64_t pages,
                 const std::function<void(const rope::SlotMappingOutput&)>& convert) {
    rope::Buffer out = on_device(Vec(size_t(tokens), poison));
    rope::SlotMappingOutput to;
    to.slot_mapping = static_cast<int64_t*>(out.data());
    to.tokens = tokens;
    to.page_size = page_size;
    to.pages = pages;
    to.device = rope::Device::cuda;
    rope::CudaStream stream;
    to.stream = stream.get();
    convert(to);
    stream.synchronize();
    Vec slots(static_cast<size_t>(tokens));
    out.copy_to_host(slots.data());
    return slots;
}

}  // namespace

TEST_CASE("CUDA: slot mappings on the GPU equal the host's, and bad metadata gives -1") {
    const rope::BackendInfo info = rope::backend_info("cuda-naive");
    if (!info.available) {
        testing::report_skip("slot mappings on the GPU", info.reason);
        return;
    }
    CAPTURE(testing::seed());
    std::mt19937_64 rng(testing::seed());
    for (int trial = 0; trial < 20; ++trial) {
        const int64_t page_size = int64_t(1) << (rng() % 6), batch = 1 + int64_t(rng() % 40), pages = 4096;
        Vec order(static_cast<size_t>(pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        Vec kv_indptr{0}, kv_indices, last, append_indptr{0}, cached, batch_indices, positions;
        const int64_t max_blocks = 8;
        Vec table(size_t(batch * (max_blocks + 1)), -7);  // row stride max_blocks + 1
        for (int64_t b = 0; b < batch; ++b) {
            const int64_t n = 1 + int64_t(rng() % max_blocks);
            for (int64_t i = 0; i < n; ++i) {
                table[size_t(b * (max_blocks + 1) + i)] = order[kv_indices.size()];
                kv_indices.push_back(order[kv_indices.size()]);
            }
            kv_indptr.push_back(int64_t(kv_indices.size()));
            last.push_back(1 + int64_t(rng() % uint64_t(page_size)));
            const int64_t sequence = (n - 1) * page_size + last.back();
            const int64_t appended = int64_t(rng() % uint64_t(std::min<int64_t>(sequence, 8) + 1));
            append_indptr.push_back(append_indptr.back() + appended);
            cached.push_back(sequence - appended);
            for (int64_t j = 0; j < appended; ++j) {
                batch_indices.push_back(b);
                positions.push_back(sequence - appended + j);
            }
        }
        const int64_t tokens = append_indptr.back() + 3;  // three padding tokens
        for (int i = 0; i < 3; ++i) {
            batch_indices.push_back(-1);
            positions.push_back(0);
        }
        const int64_t size = int64_t(kv_indices.size());
        rope::FlashInferAppend one{append_indptr.data(), kv_indptr.data(), kv_indices.data(), size, last.data(), batch};
        rope::FlashInferPositions two{batch_indices.data(), positions.data(), kv_indptr.data(), kv_indices.data(),
                                      size, batch};
        rope::BlockTable three{table.data(), max_blocks, max_blocks + 1, cached.data(), append_indptr.data(), batch};
        const size_t count = static_cast<size_t>(tokens);
        Vec host_one(count), host_two(count), host_three(count);
        rope::slot_mapping_from_flashinfer_indptr(one, output_of(host_one, page_size, pages));
        rope::slot_mapping_from_flashinfer_positions(two, output_of(host_two, page_size, pages));
        rope::slot_mapping_from_block_table(three, output_of(host_three, page_size, pages));

        // A page index out of range in the last request's first page: the host
        // refuses it; the GPU writes -1 for exactly the tokens that read it.
        const bool corrupt = trial % 2 == 1;
        Vec device_indices = kv_indices, device_table = table;
        if (corrupt) {
            device_indices[size_t(kv_indptr[size_t(batch - 1)])] = pages;
            device_table[size_t((batch - 1) * (max_blocks + 1))] = -3;
            const int64_t b = batch - 1;
            for (int64_t t = append_indptr[size_t(b)]; t < append_indptr[size_t(b + 1)]; ++t)
                if (positions[size_t(t)] / page_size == 0)
                    host_one[size_t(t)] = host_two[size_t(t)] = host_three[size_t(t)] = -1;
        }
        const rope::Buffer d_append = on_device(append_indptr), d_kv_indptr = on_device(kv_indptr),
                           d_indices = on_device(device_indices), d_last = on_device(last),
                           d_batch = on_device(batch_indices), d_positions = on_device(positions),
                           d_table = on_device(device_table), d_cached = on_device(cached);
        CHECK(device_slots(tokens, page_size, pages, [&](const rope::SlotMappingOutput& to) {
                  rope::slot_mapping_from_flashinfer_indptr(
                      {pointer(d_append), pointer(d_kv_indptr), pointer(d_indices), size, pointer(d_last), batch}, to);
              }) == host_one);
        CHECK(device_slots(tokens, page_size, pages, [&](const rope::SlotMappingOutput& to) {
                  rope::slot_mapping_from_flashinfer_positions({pointer(d_batch), pointer(d_positions),
                                                                pointer(d_kv_indptr), pointer(d_indices), size, batch},
                                                               to);
              }) == host_two);
        CHECK(device_slots(tokens, page_size, pages, [&](const rope::SlotMappingOutput& to) {
                  rope::slot_mapping_from_block_table({pointer(d_table), max_blocks, max_blocks + 1, pointer(d_cached),
                                                       pointer(d_append), batch},
                                                      to);
              }) == host_three);
    }
    // A host array labelled Device::cuda is refused, naming it.
    Vec kv_indptr{0, 1}, kv_indices{0}, last{1}, append_indptr{0, 1};
    const rope::Buffer d_kv_indptr = on_device(kv_indptr), d_indices = on_device(kv_indices), d_last = on_device(last);
    CHECK_THROWS_WITH_AS(device_slots(1, 4, 1,
                                      [&](const rope::SlotMappingOutput& to) {
                                          rope::slot_mapping_from_flashinfer_indptr(
                                              {append_indptr.data(), pointer(d_kv_indptr), pointer(d_indices), 1,
                                               pointer(d_last), 1},
                                              to);
                                      }),
                         doctest::Contains("append_indptr"), rope::Error);
}
