#include "gguf/gguf_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <memory>

#include "common/error.h"
#include "gguf/gguf_file.h"

namespace ds4::gguf {
namespace {

class ByteSink {
  public:
    std::vector<uint8_t> bytes;

    template <typename T>
    void put(T v) {
        append(&v, sizeof(T));
    }
    void put_string(const std::string &s) {
        put<uint64_t>(s.size());
        append(s.data(), s.size());
    }
    // resize + memcpy rather than vector::insert: g++ 12 -O3 reports a false
    // -Wstringop-overflow for small inserts.
    void append(const void *p, size_t n) {
        if (n == 0) return;
        const size_t at = bytes.size();
        bytes.resize(at + n);
        std::memcpy(bytes.data() + at, p, n);
    }
    void pad_to(uint64_t alignment) {
        while (bytes.size() % alignment) bytes.push_back(0);
    }
};

void put_value(ByteSink &out, const Value &v) {
    switch (v.type()) {
        case ValueType::U8:
            out.put<uint8_t>(static_cast<uint8_t>(v.as_unsigned()));
            break;
        case ValueType::I8:
            out.put<int8_t>(static_cast<int8_t>(v.as_signed()));
            break;
        case ValueType::U16:
            out.put<uint16_t>(static_cast<uint16_t>(v.as_unsigned()));
            break;
        case ValueType::I16:
            out.put<int16_t>(static_cast<int16_t>(v.as_signed()));
            break;
        case ValueType::U32:
            out.put<uint32_t>(static_cast<uint32_t>(v.as_unsigned()));
            break;
        case ValueType::I32:
            out.put<int32_t>(static_cast<int32_t>(v.as_signed()));
            break;
        case ValueType::F32:
            out.put<float>(static_cast<float>(v.as_double()));
            break;
        case ValueType::U64:
            out.put<uint64_t>(v.as_unsigned());
            break;
        case ValueType::I64:
            out.put<int64_t>(v.as_signed());
            break;
        case ValueType::F64:
            out.put<double>(v.as_double());
            break;
        case ValueType::BOOL:
            out.put<uint8_t>(v.as_bool() ? 1 : 0);
            break;
        case ValueType::STRING:
            out.put_string(v.as_string());
            break;
        case ValueType::ARRAY: {
            const Array &a = v.as_array();
            out.put<uint32_t>(static_cast<uint32_t>(a.item_type));
            out.put<uint64_t>(a.items.size());
            for (const auto &item : a.items) put_value(out, item);
            break;
        }
    }
}

}  // namespace

uint64_t tensor_n_bytes(GgmlType type, const std::vector<uint64_t> &ne) {
    if (ne.empty() || ne.size() > kMaxDims)
        throw Error(fmt::format("a tensor needs 1..{} dimensions, got {}", kMaxDims, ne.size()));
    const auto &info = ggml_type_info(type);
    uint64_t n = 1;
    for (uint64_t d : ne)
        if (__builtin_mul_overflow(n, d, &n))
            throw Error("tensor shape overflows the element count");
    if (ne[0] % info.block_elems != 0)
        throw Error(fmt::format("row length {} is not a multiple of the {} block size {}", ne[0],
                                info.name, info.block_elems));
    return n / info.block_elems * info.block_bytes;
}

void Writer::set(const std::string &key, Value value) {
    for (const auto &kv : kv_)
        if (kv.first == key)
            throw Error(fmt::format("GGUF writer: duplicate metadata key '{}'", key));
    if (key == "general.alignment") {
        const uint64_t a = value.type() == ValueType::U32 ? value.as_unsigned() : 0;
        if (a == 0 || (a & (a - 1)) != 0)
            throw Error("GGUF writer: general.alignment must be a u32 non-zero power of two");
    }
    kv_.emplace_back(key, std::move(value));
}

void Writer::add_tensor(const std::string &name, GgmlType type, std::vector<uint64_t> ne,
                        const void *data, size_t n_bytes) {
    for (const auto &t : tensors_)
        if (t.name == name) throw Error(fmt::format("GGUF writer: duplicate tensor '{}'", name));
    const uint64_t expected = tensor_n_bytes(type, ne);
    if (expected != n_bytes)
        throw Error(fmt::format("GGUF writer: tensor '{}' of type {} needs {} bytes, got {}", name,
                                ggml_type_name(type), expected, n_bytes));
    const auto *p = static_cast<const uint8_t *>(data);
    tensors_.push_back(
        {name, type, std::move(ne), expected, std::vector<uint8_t>(p, p + n_bytes), {}});
}

void Writer::add_tensor_lazy(const std::string &name, GgmlType type, std::vector<uint64_t> ne,
                             std::function<void(uint8_t *, size_t)> fill) {
    for (const auto &t : tensors_)
        if (t.name == name) throw Error(fmt::format("GGUF writer: duplicate tensor '{}'", name));
    const uint64_t n_bytes = tensor_n_bytes(type, ne);
    tensors_.push_back({name, type, std::move(ne), n_bytes, {}, std::move(fill)});
}

uint32_t Writer::alignment() const {
    for (const auto &kv : kv_)
        if (kv.first == "general.alignment") return static_cast<uint32_t>(kv.second.as_unsigned());
    return kDefaultAlignment;
}

// Header (magic .. tensor infos) padded to the alignment; tensor offsets are assigned in order,
// each tensor padded to the alignment.
std::vector<uint8_t> Writer::header_bytes() const {
    const uint32_t al = alignment();
    ByteSink out;
    out.put<uint32_t>(kMagic);
    out.put<uint32_t>(kVersion);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kv_.size());
    for (const auto &[key, value] : kv_) {
        out.put_string(key);
        out.put<uint32_t>(static_cast<uint32_t>(value.type()));
        put_value(out, value);
    }
    uint64_t offset = 0;
    for (const auto &t : tensors_) {
        out.put_string(t.name);
        out.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (uint64_t d : t.ne) out.put<uint64_t>(d);
        out.put<uint32_t>(static_cast<uint32_t>(t.type));
        out.put<uint64_t>(offset);
        offset += (t.n_bytes + al - 1) / al * al;
    }
    out.pad_to(al);
    return std::move(out.bytes);
}

std::vector<uint8_t> Writer::to_bytes() const {
    const uint32_t al = alignment();
    ByteSink out;
    out.bytes = header_bytes();
    for (const auto &t : tensors_) {
        const size_t at = out.bytes.size();
        out.bytes.resize(at + t.n_bytes);
        if (t.fill)
            t.fill(out.bytes.data() + at, t.n_bytes);
        else if (t.n_bytes)
            std::memcpy(out.bytes.data() + at, t.bytes.data(), t.n_bytes);
        out.pad_to(al);
    }
    return out.bytes;
}

void Writer::write(const std::string &path, unsigned parallel_fills) const {
    const uint32_t al = alignment();
    const std::vector<uint8_t> header = header_bytes();

    // Unique per process, so two writers of the same path never share a temporary file.
    const std::string tmp = path + ".partial." + std::to_string(::getpid());
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (!f) throw Error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
    auto put = [&](const void *p, size_t n) {
        if (n && std::fwrite(p, 1, n, f.get()) != n) {
            const int e = errno;
            f.reset();
            std::remove(tmp.c_str());
            throw Error(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
        }
    };
    put(header.data(), header.size());
    const std::vector<uint8_t> zeros(al, 0);
    // Lazy tensors are filled ahead (each into its own buffer, so the bytes do not depend on the
    // thread count) and written in order: a window of at most `workers` fills and kAheadBytes of
    // filled buffers. An exception of a fill reaches the write of its tensor. One worker fills
    // on this thread.
    const size_t workers = std::max(1u, parallel_fills);
    constexpr uint64_t kAheadBytes = uint64_t(4) << 30;
    std::deque<std::future<std::vector<uint8_t>>> ahead;
    size_t next = 0;
    uint64_t ahead_bytes = 0;
    auto launch_fills = [&](size_t upto) {
        for (; next < tensors_.size(); ++next) {
            const PendingTensor &t = tensors_[next];
            if (!t.fill) {
                ahead.emplace_back();  // written from t.bytes
                continue;
            }
            if (next > upto && (ahead.size() >= workers || ahead_bytes + t.n_bytes > kAheadBytes))
                break;
            ahead_bytes += t.n_bytes;
            ahead.push_back(
                std::async(workers > 1 ? std::launch::async : std::launch::deferred, [&t] {
                    std::vector<uint8_t> b(t.n_bytes, 0);
                    t.fill(b.data(), t.n_bytes);
                    return b;
                }));
        }
    };
    try {
        for (size_t i = 0; i < tensors_.size(); ++i) {
            launch_fills(i);
            const PendingTensor &t = tensors_[i];
            std::future<std::vector<uint8_t>> filled = std::move(ahead.front());
            ahead.pop_front();
            if (t.fill) {
                const std::vector<uint8_t> b = filled.get();
                ahead_bytes -= t.n_bytes;
                put(b.data(), t.n_bytes);
            } else {
                put(t.bytes.data(), t.n_bytes);
            }
            put(zeros.data(), (al - t.n_bytes % al) % al);
        }
    } catch (...) {
        for (auto &a : ahead)
            if (a.valid()) a.wait();  // the fills reference this writer's tensors
        f.reset();
        std::remove(tmp.c_str());
        throw;
    }
    if (std::fflush(f.get()) != 0 || ::fsync(fileno(f.get())) != 0) {
        const int e = errno;
        f.reset();
        std::remove(tmp.c_str());
        throw Error(fmt::format("{}: flush failed: {}", tmp, std::strerror(e)));
    }
    f.reset();
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        std::remove(tmp.c_str());
        throw Error(fmt::format("{}: cannot rename into place: {}", path, std::strerror(e)));
    }
}

}  // namespace ds4::gguf
