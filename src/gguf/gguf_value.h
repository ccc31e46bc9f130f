#pragma once
// A GGUF metadata value: a scalar, a string, or a (possibly nested) typed array.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ds4::gguf {

enum class ValueType : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
};

std::string_view value_type_name(ValueType t);
bool value_type_known(uint32_t id);

class Value;

struct Array {
    ValueType item_type = ValueType::U8;
    std::vector<Value> items;
};

// Scalars are stored widened (unsigned -> uint64_t, signed -> int64_t, floats -> double) next to
// their declared type, so a writer can reproduce the exact file and a reader can type-check.
class Value {
  public:
    Value() = default;
    static Value u8(uint8_t v) { return Value(ValueType::U8, uint64_t{v}); }
    static Value i8(int8_t v) { return Value(ValueType::I8, int64_t{v}); }
    static Value u16(uint16_t v) { return Value(ValueType::U16, uint64_t{v}); }
    static Value i16(int16_t v) { return Value(ValueType::I16, int64_t{v}); }
    static Value u32(uint32_t v) { return Value(ValueType::U32, uint64_t{v}); }
    static Value i32(int32_t v) { return Value(ValueType::I32, int64_t{v}); }
    static Value u64(uint64_t v) { return Value(ValueType::U64, v); }
    static Value i64(int64_t v) { return Value(ValueType::I64, v); }
    static Value f32(float v) { return Value(ValueType::F32, double{v}); }
    static Value f64(double v) { return Value(ValueType::F64, v); }
    static Value boolean(bool v) { return Value(ValueType::BOOL, v); }
    static Value string(std::string v) { return Value(ValueType::STRING, std::move(v)); }
    static Value array(ValueType item_type, std::vector<Value> items);
    // Convenience builders for the common homogeneous arrays.
    static Value array_of_strings(const std::vector<std::string> &v);
    static Value array_of_u32(const std::vector<uint32_t> &v);
    static Value array_of_i32(const std::vector<int32_t> &v);
    static Value array_of_f32(const std::vector<float> &v);

    ValueType type() const { return type_; }
    bool is_integer() const;
    bool is_float() const { return type_ == ValueType::F32 || type_ == ValueType::F64; }

    // Raw accessors; they throw ds4::Error when the stored kind does not match.
    uint64_t as_unsigned() const;
    int64_t as_signed() const;
    double as_double() const;
    bool as_bool() const;
    const std::string &as_string() const;
    const Array &as_array() const;

  private:
    using Storage = std::variant<std::monostate, uint64_t, int64_t, double, bool, std::string,
                                 std::shared_ptr<const Array>>;
    Value(ValueType t, Storage s) : type_(t), v_(std::move(s)) {}
    ValueType type_ = ValueType::U8;
    Storage v_;
};

}  // namespace ds4::gguf
