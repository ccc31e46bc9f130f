#pragma once
// Writes GGUF v3 files: any metadata, any tensors, data aligned to general.alignment (default 32).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/ggml_type.h"
#include "gguf/gguf_value.h"

namespace ds4::gguf {

class Writer {
  public:
    // Metadata in insertion order; a duplicate key throws.
    void set(const std::string &key, Value value);
    // A tensor whose bytes the writer copies. `ne[0]` is the contiguous axis; the byte count must
    // equal the size the type and shape imply.
    void add_tensor(const std::string &name, GgmlType type, std::vector<uint64_t> ne,
                    const void *data, size_t n_bytes);
    // A tensor whose bytes are produced later by `fill(dst)` while writing (large tensors).
    void add_tensor_lazy(const std::string &name, GgmlType type, std::vector<uint64_t> ne,
                         std::function<void(uint8_t *dst, size_t n_bytes)> fill);

    // Write to `path` through a temporary file renamed into place, so a failure leaves no
    // half-written file under the final name. With parallel_fills > 1, up to that many lazy
    // tensors are filled at once on worker threads, ahead of the write (their fills must not
    // share mutable state); the bytes are the same.
    void write(const std::string &path, unsigned parallel_fills = 1) const;
    std::vector<uint8_t> to_bytes() const;

    uint32_t alignment() const;

  private:
    std::vector<uint8_t> header_bytes() const;
    struct PendingTensor {
        std::string name;
        GgmlType type;
        std::vector<uint64_t> ne;
        uint64_t n_bytes;
        std::vector<uint8_t> bytes;  // empty when lazy
        std::function<void(uint8_t *, size_t)> fill;
    };
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<PendingTensor> tensors_;
};

// Bytes a tensor of this type and shape occupies (throws on a shape the type cannot hold).
uint64_t tensor_n_bytes(GgmlType type, const std::vector<uint64_t> &ne);

}  // namespace ds4::gguf
