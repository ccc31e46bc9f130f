#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "common/error.h"

namespace ds4::gguf {
namespace {

// Bounds-checked little-endian reader over the file bytes. Every read states what it reads so
// a truncated file names the field it stopped in.
class Cursor {
  public:
    Cursor(const uint8_t *data, uint64_t size) : data_(data), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const std::string &what) const {
        if (n > remaining())
            throw Error(fmt::format("truncated file: {} needs {} bytes at offset {}, only {} left",
                                    what, n, pos_, remaining()));
    }

    template <typename T>
    T read(const std::string &what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const std::string &what) {
        const uint64_t len = read<uint64_t>(what + " length");
        if (len > remaining())
            throw Error(fmt::format("{} has length {} but only {} bytes remain in the file", what,
                                    len, remaining()));
        std::string s(reinterpret_cast<const char *>(data_ + pos_), len);
        pos_ += len;
        return s;
    }

  private:
    const uint8_t *data_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

// Smallest encoded size of one value of a type: lets us reject a count that cannot fit in the
// bytes left before allocating anything for it.
uint64_t min_encoded_size(ValueType t) {
    switch (t) {
        case ValueType::U8:
        case ValueType::I8:
        case ValueType::BOOL:
            return 1;
        case ValueType::U16:
        case ValueType::I16:
            return 2;
        case ValueType::U32:
        case ValueType::I32:
        case ValueType::F32:
            return 4;
        case ValueType::U64:
        case ValueType::I64:
        case ValueType::F64:
        case ValueType::STRING:
            return 8;
        case ValueType::ARRAY:
            return 12;
    }
    return 1;
}

Value read_value(Cursor &c, ValueType t, const std::string &what, uint32_t depth) {
    switch (t) {
        case ValueType::U8:
            return Value::u8(c.read<uint8_t>(what));
        case ValueType::I8:
            return Value::i8(c.read<int8_t>(what));
        case ValueType::U16:
            return Value::u16(c.read<uint16_t>(what));
        case ValueType::I16:
            return Value::i16(c.read<int16_t>(what));
        case ValueType::U32:
            return Value::u32(c.read<uint32_t>(what));
        case ValueType::I32:
            return Value::i32(c.read<int32_t>(what));
        case ValueType::F32:
            return Value::f32(c.read<float>(what));
        case ValueType::U64:
            return Value::u64(c.read<uint64_t>(what));
        case ValueType::I64:
            return Value::i64(c.read<int64_t>(what));
        case ValueType::F64:
            return Value::f64(c.read<double>(what));
        case ValueType::BOOL: {
            const uint8_t b = c.read<uint8_t>(what);
            if (b > 1) throw Error(fmt::format("{}: bool byte is {}, expected 0 or 1", what, b));
            return Value::boolean(b != 0);
        }
        case ValueType::STRING:
            return Value::string(c.read_string(what));
        case ValueType::ARRAY: {
            if (depth >= kMaxArrayDepth)
                throw Error(fmt::format("{}: arrays nested deeper than {}", what, kMaxArrayDepth));
            const uint32_t item_id = c.read<uint32_t>(what + " item type");
            if (!value_type_known(item_id))
                throw Error(fmt::format("{}: unknown array item type {}", what, item_id));
            const auto item_type = static_cast<ValueType>(item_id);
            const uint64_t count = c.read<uint64_t>(what + " item count");
            if (count > c.remaining() / min_encoded_size(item_type))
                throw Error(
                    fmt::format("{}: array of {} {} items cannot fit in the {} bytes left "
                                "(truncated or corrupt file)",
                                what, count, value_type_name(item_type), c.remaining()));
            std::vector<Value> items;
            items.reserve(count);
            for (uint64_t i = 0; i < count; ++i)
                items.push_back(read_value(c, item_type, what + fmt::format("[{}]", i), depth + 1));
            return Value::array(item_type, std::move(items));
        }
    }
    throw Error(fmt::format("{}: unknown value type {}", what, static_cast<uint32_t>(t)));
}

uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

}  // namespace

std::string TensorInfo::shape_string() const {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

std::unique_ptr<File> File::open(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw Error(fmt::format("{}: cannot stat: {}", path, std::strerror(e)));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(fmt::format("{}: not a regular file", path));
    }
    if (st.st_size == 0) {
        ::close(fd);
        throw Error(fmt::format("{}: empty file, not a GGUF", path));
    }
    void *map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (map == MAP_FAILED)
        throw Error(fmt::format("{}: cannot mmap: {}", path, std::strerror(map_errno)));

    std::unique_ptr<File> f(new File());
    f->path_ = path;
    f->mapping_ = map;
    f->base_ = static_cast<const uint8_t *>(map);
    f->size_ = static_cast<uint64_t>(st.st_size);
    try {
        f->parse();
    } catch (const Error &e) {
        throw Error(fmt::format("{}: {}", path, e.what()));
    }
    return f;
}

std::unique_ptr<File> File::from_memory(const void *data, size_t size, std::string name) {
    std::unique_ptr<File> f(new File());
    f->path_ = std::move(name);
    f->base_ = static_cast<const uint8_t *>(data);
    f->size_ = size;
    try {
        f->parse();
    } catch (const Error &e) {
        throw Error(fmt::format("{}: {}", f->path_, e.what()));
    }
    return f;
}

File::~File() {
    if (mapping_) ::munmap(mapping_, static_cast<size_t>(size_));
}

void File::parse() {
    Cursor c(base_, size_);
    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != kMagic)
        throw Error(fmt::format("bad magic 0x{:08x}, expected 0x{:08x} (\"GGUF\"): not a GGUF file",
                                magic, kMagic));
    version_ = c.read<uint32_t>("version");
    if (version_ != kVersion)
        throw Error(
            fmt::format("GGUF version {} is not supported, expected {}", version_, kVersion));
    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("metadata count");
    // A key/value record takes at least 13 bytes (key length, type, 1-byte value); a tensor info
    // at least 32 (name length, n_dims, one dim, type, offset).
    if (n_kv > c.remaining() / 13)
        throw Error(fmt::format(
            "metadata count {} cannot fit in the {} bytes of the file (truncated or corrupt file)",
            n_kv, size_));
    if (n_tensors > c.remaining() / 32)
        throw Error(fmt::format(
            "tensor count {} cannot fit in the {} bytes of the file (truncated or corrupt file)",
            n_tensors, size_));

    kv_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string key = c.read_string(fmt::format("metadata key #{}", i));
        const uint32_t type_id = c.read<uint32_t>(fmt::format("type of metadata key '{}'", key));
        if (!value_type_known(type_id))
            throw Error(fmt::format("metadata key '{}' has unknown value type {}", key, type_id));
        Value v = read_value(c, static_cast<ValueType>(type_id),
                             fmt::format("metadata key '{}'", key), 0);
        if (kv_index_.count(key)) throw Error(fmt::format("duplicate metadata key '{}'", key));
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const Value *a = find("general.alignment")) {
        if (a->type() != ValueType::U32)
            throw Error(fmt::format("general.alignment has type {}, expected u32",
                                    value_type_name(a->type())));
        const uint64_t al = a->as_unsigned();
        if (al == 0 || (al & (al - 1)) != 0)
            throw Error(
                fmt::format("general.alignment is {}, expected a non-zero power of two", al));
        alignment_ = static_cast<uint32_t>(al);
    }

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
        TensorInfo t;
        t.name = c.read_string(fmt::format("name of tensor #{}", i));
        const std::string what = fmt::format("tensor '{}'", t.name);
        const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
        if (n_dims < 1 || n_dims > kMaxDims)
            throw Error(
                fmt::format("{} has {} dimensions, expected 1..{}", what, n_dims, kMaxDims));
        t.ne.resize(n_dims);
        uint64_t n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            t.ne[d] = c.read<uint64_t>(fmt::format("{} ne[{}]", what, d));
            if (t.ne[d] > static_cast<uint64_t>(INT64_MAX))
                throw Error(fmt::format("{} ne[{}] = {} is too large", what, d, t.ne[d]));
            if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements) ||
                n_elements > static_cast<uint64_t>(INT64_MAX))
                throw Error(
                    fmt::format("{} shape {} overflows the element count", what, t.shape_string()));
        }
        const uint32_t type_id = c.read<uint32_t>(what + " type");
        const auto info = ggml_type_info(type_id);
        if (!info) throw Error(fmt::format("{} has unknown ggml type {}", what, type_id));
        t.type = info->type;
        if (t.ne[0] % info->block_elems != 0)
            throw Error(
                fmt::format("{} row length ne[0] = {} is not a multiple of the {} block size {}",
                            what, t.ne[0], info->name, info->block_elems));
        t.n_elements = n_elements;
        // n_elements / block_elems * block_bytes cannot overflow: n_elements < 2^63 and
        // block_bytes / block_elems <= 8.
        t.n_bytes = n_elements / info->block_elems * info->block_bytes;
        t.offset = c.read<uint64_t>(what + " offset");
        if (tensor_index_.count(t.name))
            throw Error(fmt::format("duplicate tensor name '{}'", t.name));
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }

    data_offset_ = align_up(c.pos(), alignment_);
    const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
    for (auto &t : tensors_) {
        if (t.offset % alignment_ != 0)
            throw Error(fmt::format("tensor '{}' offset {} is not a multiple of the alignment {}",
                                    t.name, t.offset, alignment_));
        if (t.offset > data_size || t.n_bytes > data_size - t.offset)
            throw Error(fmt::format(
                "tensor '{}' ({} {}, {} bytes at data offset {}) extends past the end of the file "
                "(data section holds {} bytes): truncated or corrupt file",
                t.name, ggml_type_name(t.type), t.shape_string(), t.n_bytes, t.offset, data_size));
        t.data = base_ + data_offset_ + t.offset;
    }

    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    const TensorInfo *prev = nullptr;
    for (size_t idx : order) {
        const TensorInfo &t = tensors_[idx];
        if (t.n_bytes == 0) continue;
        if (prev && prev->offset + prev->n_bytes > t.offset)
            throw Error(fmt::format("tensors '{}' (bytes {}..{}) and '{}' (bytes {}..{}) overlap",
                                    prev->name, prev->offset, prev->offset + prev->n_bytes, t.name,
                                    t.offset, t.offset + t.n_bytes));
        prev = &t;
    }
}

const Value *File::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {

const Value &require(const File &f, std::string_view key) {
    const Value *v = f.find(key);
    if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", f.path(), key));
    return *v;
}

// Runs an accessor and prefixes its error with the file and key.
template <typename Fn>
auto with_key(const File &f, std::string_view key, Fn &&fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (const Error &e) {
        throw Error(fmt::format("{}: metadata key '{}': {}", f.path(), key, e.what()));
    }
}

}  // namespace

uint32_t File::get_u32(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&] {
        const uint64_t u = v.as_unsigned();
        if (u > UINT32_MAX) throw Error(fmt::format("value {} does not fit in u32", u));
        return static_cast<uint32_t>(u);
    });
}

uint64_t File::get_u64(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&] { return v.as_unsigned(); });
}

int64_t File::get_i64(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&] { return v.as_signed(); });
}

double File::get_f64(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&] { return v.as_double(); });
}

bool File::get_bool(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&] { return v.as_bool(); });
}

const std::string &File::get_string(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&]() -> const std::string & { return v.as_string(); });
}

const Array &File::get_array(std::string_view key) const {
    const Value &v = require(*this, key);
    return with_key(*this, key, [&]() -> const Array & { return v.as_array(); });
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
    const Array &a = get_array(key);
    return with_key(*this, key, [&] {
        if (a.item_type != ValueType::STRING)
            throw Error(
                fmt::format("array of {}, expected array of string", value_type_name(a.item_type)));
        std::vector<std::string> out;
        out.reserve(a.items.size());
        for (const auto &v : a.items) out.push_back(v.as_string());
        return out;
    });
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
    const Array &a = get_array(key);
    return with_key(*this, key, [&] {
        std::vector<int64_t> out;
        out.reserve(a.items.size());
        for (const auto &v : a.items) {
            if (!v.is_integer())
                throw Error(fmt::format("array of {}, expected an integer array",
                                        value_type_name(a.item_type)));
            out.push_back(v.as_signed());
        }
        return out;
    });
}

std::vector<double> File::get_float_array(std::string_view key) const {
    const Array &a = get_array(key);
    return with_key(*this, key, [&] {
        std::vector<double> out;
        out.reserve(a.items.size());
        for (const auto &v : a.items) out.push_back(v.as_double());
        return out;
    });
}

uint32_t File::get_u32_or(std::string_view key, uint32_t dflt) const {
    return has(key) ? get_u32(key) : dflt;
}

std::string File::get_string_or(std::string_view key, std::string dflt) const {
    return has(key) ? get_string(key) : dflt;
}

const TensorInfo *File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo &File::tensor(std::string_view name) const {
    const TensorInfo *t = find_tensor(name);
    if (!t) throw Error(fmt::format("{}: missing tensor '{}'", path_, name));
    return *t;
}

}  // namespace ds4::gguf
