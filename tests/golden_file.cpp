#include "golden_file.hpp"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <doctest/doctest.h>

namespace golden {

namespace {
// Keys whose value is a list of numbers; every other key is text.
const std::set<std::string> number_keys = {"q", "k", "q_out", "k_out", "positions", "inv_freq", "short_factor", "long_factor"};
}  // namespace

File load(const std::filesystem::path& path) {
    File file;
    file.name = path.filename().string();
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "cannot open " << path);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        const auto colon = line.find(':');
        REQUIRE_MESSAGE(colon != std::string::npos, file.name << ": no `key: value` in line " << line.substr(0, 60));
        const std::string key = line.substr(0, colon), value = line.substr(colon + 1);
        if (number_keys.count(key)) {
            std::istringstream numbers(value);
            double x;
            while (numbers >> x) file.data[key].push_back(x);
        } else {
            file.meta[key] = value.substr(value.find_first_not_of(' '));
        }
    }
    return file;
}

std::vector<File> load_all(const std::filesystem::path& dir, const std::string& prefix) {
    std::vector<std::filesystem::path> paths;
    if (std::filesystem::is_directory(dir))
        for (const auto& entry : std::filesystem::directory_iterator(dir)) {
            const std::string name = entry.path().filename().string();
            if (name.rfind(prefix, 0) == 0 && entry.path().extension() == ".txt") paths.push_back(entry.path());
        }
    std::sort(paths.begin(), paths.end());
    std::vector<File> files;
    for (const auto& path : paths) files.push_back(load(path));
    return files;
}

std::array<int64_t, 4> shape_of(const std::string& text) {
    std::istringstream in(text);
    std::array<int64_t, 4> shape{};
    for (auto& n : shape) in >> n;
    return shape;
}

testing::HostTensor tensor_from(const std::vector<double>& values, rope::Layout layout, std::array<int64_t, 4> shape) {
    testing::HostTensor t = testing::HostTensor::make(rope::DType::f32, layout, shape);
    REQUIRE(values.size() == size_t(t.view.numel()));
    for (size_t i = 0; i < values.size(); ++i) reinterpret_cast<float*>(t.storage.data())[i] = float(values[i]);
    return t;
}

std::vector<double> logical_order(const std::vector<double>& values, rope::Layout layout, std::array<int64_t, 4> shape) {
    return tensor_from(values, layout, shape).values();
}

}  // namespace golden
