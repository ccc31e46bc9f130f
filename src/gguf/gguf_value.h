#pragma once
// A GGUF metadata value: a scalar, a string, or a (possibly nested) typed array.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
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
// (Plain members rather than std::variant: g++ 12 reports false -Wmaybe-uninitialized for a
// variant holding a std::string at -O3.)
class Value {
  public:
    Value() = default;
    static Value u8(uint8_t v) { return unsigned_value(ValueType::U8, v); }
    static Value i8(int8_t v) { return signed_value(ValueType::I8, v); }
    static Value u16(uint16_t v) { return unsigned_value(ValueType::U16, v); }
    static Value i16(int16_t v) { return signed_value(ValueType::I16, v); }
    static Value u32(uint32_t v) { return unsigned_value(ValueType::U32, v); }
    static Value i32(int32_t v) { return signed_value(ValueType::I32, v); }
    static Value u64(uint64_t v) { return unsigned_value(ValueType::U64, v); }
    static Value i64(int64_t v) { return signed_value(ValueType::I64, v); }
    static Value f32(float v) { return float_value(ValueType::F32, v); }
    static Value f64(double v) { return float_value(ValueType::F64, v); }
    static Value boolean(bool v);
    static Value string(std::string v);
    static Value array(ValueType item_type, std::vector<Value> items);
    // Convenience builders for the common homogeneous arrays.
    static Value array_of_strings(const std::vector<std::string> &v);
    static Value array_of_u32(const std::vector<uint32_t> &v);
    static Value array_of_i32(const std::vector<int32_t> &v);
    static Value array_of_f32(const std::vector<float> &v);

    ValueType type() const { return type_; }
    bool is_integer() const { return kind_ == Kind::Unsigned || kind_ == Kind::Signed; }
    bool is_float() const { return kind_ == Kind::Float; }

    // Raw accessors; they throw ds4::Error when the stored kind does not match.
    uint64_t as_unsigned() const;
    int64_t as_signed() const;
    double as_double() const;
    bool as_bool() const;
    const std::string &as_string() const;
    const Array &as_array() const;

  private:
    enum class Kind : uint8_t { None, Unsigned, Signed, Float, Bool, String, Array };
    static Value unsigned_value(ValueType t, uint64_t v);
    static Value signed_value(ValueType t, int64_t v);
    static Value float_value(ValueType t, double v);

    ValueType type_ = ValueType::U8;
    Kind kind_ = Kind::None;
    uint64_t u_ = 0;
    int64_t i_ = 0;
    double d_ = 0.0;
    std::string s_;
    std::shared_ptr<const Array> a_;
};

}  // namespace ds4::gguf
