#pragma once
// Read-only view of a GGUF v3 file: metadata, tensor infos, and tensor bytes in place.
//
// The file is parsed with every count, length and offset checked against the bytes that are
// really there, so a malformed or hostile file produces a ds4::Error that names the problem and
// never a crash, a hang or a huge allocation. Tensor data is not copied: `data()` points into the
// mapping (or into the caller's buffer for `from_memory`).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/ggml_type.h"
#include "gguf/gguf_value.h"

namespace ds4::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 8;
constexpr uint32_t kMaxArrayDepth = 8;

struct TensorInfo {
    std::string name;
    std::vector<uint64_t> ne;  // ne[0] is the contiguous axis
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;  // relative to the data section
    uint64_t n_elements = 0;
    uint64_t n_bytes = 0;
    const uint8_t *data = nullptr;  // into the mapping

    uint64_t dim(size_t i) const { return i < ne.size() ? ne[i] : 1; }
    // The matrices of ne[0] x ne[1] it holds (the experts of a 3-D tensor; 1 for a matrix).
    uint64_t planes() const {
        uint64_t p = 1;
        for (size_t i = 2; i < ne.size(); ++i) p *= ne[i];
        return p;
    }
    uint64_t row_bytes() const { return ggml_row_bytes(type, ne.empty() ? 1 : ne[0]); }
    std::string shape_string() const;  // "[4096, 1024]"
};

class File {
  public:
    // Map and parse a file; throws ds4::Error("<path>: <problem>") on any defect.
    static std::unique_ptr<File> open(const std::string &path);
    // Parse a buffer the caller keeps alive (tests, the fuzzer).
    static std::unique_ptr<File> from_memory(const void *data, size_t size,
                                             std::string name = "<memory>");
    ~File();
    File(const File &) = delete;
    File &operator=(const File &) = delete;

    const std::string &path() const { return path_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    uint64_t file_size() const { return size_; }
    const uint8_t *base() const { return base_; }

    // Metadata, in file order.
    const std::vector<std::pair<std::string, Value>> &metadata() const { return kv_; }
    const Value *find(std::string_view key) const;
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters. Each throws ds4::Error naming the key when it is missing or has a type
    // that cannot represent the request exactly (e.g. a negative i32 read as u32, an f32 read as
    // an integer). The *_or variants return the default when the key is absent.
    uint32_t get_u32(std::string_view key) const;
    uint64_t get_u64(std::string_view key) const;
    int64_t get_i64(std::string_view key) const;
    double get_f64(std::string_view key) const;  // f32, f64 or any integer type
    float get_f32(std::string_view key) const { return static_cast<float>(get_f64(key)); }
    bool get_bool(std::string_view key) const;
    const std::string &get_string(std::string_view key) const;
    const Array &get_array(std::string_view key) const;
    std::vector<std::string> get_string_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;
    std::vector<double> get_float_array(std::string_view key) const;  // float or integer items
    uint32_t get_u32_or(std::string_view key, uint32_t dflt) const;
    std::string get_string_or(std::string_view key, std::string dflt) const;

    // Tensors, in file order.
    const std::vector<TensorInfo> &tensors() const { return tensors_; }
    const TensorInfo *find_tensor(std::string_view name) const;
    const TensorInfo &tensor(std::string_view name) const;  // throws when missing

  private:
    File() = default;
    void parse();

    std::string path_;
    const uint8_t *base_ = nullptr;
    uint64_t size_ = 0;
    void *mapping_ = nullptr;  // non-null when we own an mmap
    uint32_t version_ = 0;
    uint32_t alignment_ = kDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, Value>> kv_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace ds4::gguf
