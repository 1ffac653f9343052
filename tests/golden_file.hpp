#pragma once
// Reading the golden-vector files written by scripts/make_golden_hf.py:
// `key: value` lines, where the tensors (q, k, q_out, k_out), positions and
// per-pair lists are whitespace-separated numbers and everything else is text.
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support.hpp"

namespace golden {

struct File {
    std::string name;                                  // File name, for messages.
    std::map<std::string, std::string> meta;           // Text fields.
    std::map<std::string, std::vector<double>> data;   // Number lists.

    bool has(const std::string& key) const { return meta.count(key) != 0; }
    double number(const std::string& key) const { return std::stod(meta.at(key)); }
};

// Parses one file; a line without `key:` fails the current test.
File load(const std::filesystem::path& path);

// The *.txt files directly in `dir` whose name starts with `prefix`, sorted by name.
std::vector<File> load_all(const std::filesystem::path& dir, const std::string& prefix);

// "2 4 16 64" -> {2, 4, 16, 64}.
std::array<int64_t, 4> shape_of(const std::string& text);

// A dense float32 host tensor holding `values` in the layout's storage order.
testing::HostTensor tensor_from(const std::vector<double>& values, rope::Layout layout, std::array<int64_t, 4> shape);

// Golden outputs are stored in layout order; tests compare in (b, h, s, d) order.
std::vector<double> logical_order(const std::vector<double>& values, rope::Layout layout, std::array<int64_t, 4> shape);

}  // namespace golden
