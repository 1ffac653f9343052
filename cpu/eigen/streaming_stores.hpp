#pragma once
// cpu-eigen's streaming stores: rows written to memory by whole cache lines,
// without reading the lines first, for outputs too large for the cache.
//
// An ordinary store to a line that is not in the cache first reads the line
// from memory (a "read for ownership"), so writing to a separate output moves
// three bytes for every two rotated: read the input, read the output's old
// line, write it back. A streaming (non-temporal) store sends a whole line
// straight to memory without reading it, and without keeping it in the cache.
// The backend rotates such a row into a buffer in L1 and hands it to
// LineStreamer::write.
#include <unistd.h>  // sysconf: the last-level cache size (streaming_output_bytes).

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>  // Streaming stores, sfence.
#endif
#include <algorithm>
#include <bit>  // std::countr_zero, std::countr_one (LineStreamer::write_part).
#include <cstdint>
#include <cstring>

namespace rope::cpu_eigen {
// Internal linkage, as if written in backend.cpp, its one includer: the compiler
// then inlines the per-row calls below as it does the rest of that file.
namespace {

// Bytes per cache line (x86-64 and most ARM cores): the unit memory moves in.
constexpr int64_t kCacheLine = 64;

// Outputs (q_out + k_out bytes) from which an out-of-place call writes its
// rows with streaming stores: more than the last-level cache holds, so the
// next operation would not have found them in the cache anyway. Smaller
// outputs are written normally and stay in the cache for it. The size is the
// processor's own (glibc reads it from CPUID), 32 MiB where the system does
// not say. (bench/results/notes/cpu-eigen.md: why not a lower threshold.)
inline int64_t streaming_output_bytes() {
    static const int64_t bytes = [] {
        long reported = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
        reported = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
        return reported > 0 ? int64_t(reported) : int64_t(32) * 1024 * 1024;
    }();
    return bytes;
}

// Writes a thread's finished rows to memory with streaming stores.
//
// Only whole lines may be streamed: a streaming store that covers part of a
// line leaves the memory controller to merge it with the line's old bytes, a
// read and a write for every part. Rows need not start on a line: malloc's
// large blocks start 16 bytes past a page, so each 512-byte fp32 row of such a
// tensor covers parts of 9 lines, the first and last shared with its
// neighbours in memory. So the part of a line a row leaves open is kept in a
// slot until the neighbouring row brings the rest (the next token of the same
// head, a few rows later in the walk), and then the whole line is streamed;
// parts still open when the thread leaves its tile are written with ordinary
// stores (then another thread may own the rest of that line).
class LineStreamer {
public:
    // Copies @p bytes from @p from (a finished row in L1) to @p to.
    void write(const void* from, void* to, int64_t bytes) {
        const auto* source = static_cast<const unsigned char*>(from);
        const uintptr_t at = reinterpret_cast<uintptr_t>(to), end = at + uintptr_t(bytes);
        const uintptr_t first_whole = (at + kCacheLine - 1) / kCacheLine * kCacheLine;  // First line inside.
        const uintptr_t past_whole = end / kCacheLine * kCacheLine;                    // Past the last one.
        if (first_whole >= past_whole) {  // No whole line: the row is open at both ends of one or two lines.
            keep_parts(at, end, source);
            return;
        }
        keep_parts(at, first_whole, source);
        stream_lines(first_whole, source + (first_whole - at), int64_t(past_whole - first_whole) / kCacheLine);
        keep_parts(past_whole, end, source + (past_whole - at));
    }

    // Writes the parts still open with ordinary stores, and orders this
    // thread's streaming stores before whatever it does next (they are not
    // ordered like ordinary stores): called before a thread leaves its tile.
    void finish() {
        for (Part& part : parts_)
            if (part.line != 0) write_part(part);
#if defined(__GNUC__) && defined(__x86_64__)
        _mm_sfence();
#endif
    }

private:
    // An open line: its address, which of its bytes are here, and those bytes.
    struct Part {
        uintptr_t line = 0;  // 0: the slot is free.
        uint64_t filled = 0;  // Bit b: byte b is here.
        alignas(16) unsigned char bytes[kCacheLine];
    };
    // Open lines a thread may have at once: one per head it walks side by side
    // (kHeadsSideBySide, work_split.hpp); more only costs ordinary stores for the oldest.
    static constexpr int kParts = 8;

    // Streams @p lines whole lines from @p source to the aligned address @p line.
    static void stream_lines(uintptr_t line, const unsigned char* source, int64_t lines) {
#if defined(__GNUC__) && defined(__x86_64__)
        static const bool wide = __builtin_cpu_supports("avx512f");
        if (wide) return stream_lines_avx512(line, source, lines);
        // Four 16-byte streaming stores (SSE2, any x86-64) issued back to back
        // fill one write-combining buffer, which goes to memory as one line.
        for (int64_t b = 0; b < lines * kCacheLine; b += 16)
            _mm_stream_si128(reinterpret_cast<__m128i*>(line + b),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + b)));
#else
        std::memcpy(reinterpret_cast<void*>(line), source, size_t(lines * kCacheLine));
#endif
    }
#if defined(__GNUC__) && defined(__x86_64__)
    // With AVX-512 a line is one store: nothing can flush the write-combining
    // buffer half full.
    __attribute__((target("avx512f"))) static void stream_lines_avx512(uintptr_t line, const unsigned char* source,
                                                                       int64_t lines) {
        for (int64_t b = 0; b < lines * kCacheLine; b += kCacheLine)
            _mm512_stream_si512(reinterpret_cast<__m512i*>(line + b), _mm512_loadu_si512(source + b));
    }
#endif

    // Keeps the bytes [at, end) (within one or two lines) until their lines are whole.
    void keep_parts(uintptr_t at, uintptr_t end, const unsigned char* source) {
        while (at < end) {
            const uintptr_t line = at - at % kCacheLine;
            const int64_t begin = int64_t(at - line);
            const int64_t count = std::min<int64_t>(kCacheLine - begin, int64_t(end - at));
            keep_part(line, begin, count, source);
            at += uintptr_t(count);
            source += count;
        }
    }

    void keep_part(uintptr_t line, int64_t begin, int64_t count, const unsigned char* source) {
        Part* part = nullptr;
        for (Part& candidate : parts_)
            if (candidate.line == line) part = &candidate;
        if (part == nullptr) {
            for (Part& candidate : parts_)
                if (candidate.line == 0 && part == nullptr) part = &candidate;
            if (part == nullptr) {  // All slots open: the oldest goes out with ordinary stores.
                part = &parts_[oldest_];
                write_part(*part);
                oldest_ = (oldest_ + 1) % kParts;
            }
            part->line = line;
        }
        std::memcpy(part->bytes + begin, source, size_t(count));
        part->filled |= ((uint64_t(1) << count) - 1) << begin;  // count < 64 here.
        if (part->filled == ~uint64_t(0)) {
            stream_lines(line, part->bytes, 1);
            *part = Part{};
        }
    }

    // Writes an open line's bytes with ordinary stores, run by run, and frees its slot.
    static void write_part(Part& part) {
        uint64_t filled = part.filled;
        while (filled != 0) {
            const int begin = std::countr_zero(filled);
            const int count = std::countr_one(filled >> begin);
            std::memcpy(reinterpret_cast<void*>(part.line + uintptr_t(begin)), part.bytes + begin, size_t(count));
            filled &= count + begin == 64 ? 0 : ~uint64_t(0) << (begin + count);
        }
        part = Part{};
    }

    Part parts_[kParts];
    int oldest_ = 0;
};

}  // namespace
}  // namespace rope::cpu_eigen
