#include "gguf/gguf_value.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ds4::gguf {

std::string_view value_type_name(ValueType t) {
    switch (t) {
        case ValueType::U8:
            return "u8";
        case ValueType::I8:
            return "i8";
        case ValueType::U16:
            return "u16";
        case ValueType::I16:
            return "i16";
        case ValueType::U32:
            return "u32";
        case ValueType::I32:
            return "i32";
        case ValueType::F32:
            return "f32";
        case ValueType::BOOL:
            return "bool";
        case ValueType::STRING:
            return "string";
        case ValueType::ARRAY:
            return "array";
        case ValueType::U64:
            return "u64";
        case ValueType::I64:
            return "i64";
        case ValueType::F64:
            return "f64";
    }
    return "unknown";
}

bool value_type_known(uint32_t id) {
    return id <= static_cast<uint32_t>(ValueType::F64);
}

Value Value::unsigned_value(ValueType t, uint64_t v) {
    Value out;
    out.type_ = t;
    out.kind_ = Kind::Unsigned;
    out.u_ = v;
    return out;
}

Value Value::signed_value(ValueType t, int64_t v) {
    Value out;
    out.type_ = t;
    out.kind_ = Kind::Signed;
    out.i_ = v;
    return out;
}

Value Value::float_value(ValueType t, double v) {
    Value out;
    out.type_ = t;
    out.kind_ = Kind::Float;
    out.d_ = v;
    return out;
}

Value Value::boolean(bool v) {
    Value out;
    out.type_ = ValueType::BOOL;
    out.kind_ = Kind::Bool;
    out.u_ = v ? 1 : 0;
    return out;
}

Value Value::string(std::string v) {
    Value out;
    out.type_ = ValueType::STRING;
    out.kind_ = Kind::String;
    out.s_ = std::move(v);
    return out;
}

Value Value::array(ValueType item_type, std::vector<Value> items) {
    for (size_t i = 0; i < items.size(); ++i)
        if (items[i].type() != item_type)
            throw Error(fmt::format("array item {} has type {}, the array declares {}", i,
                                    value_type_name(items[i].type()), value_type_name(item_type)));
    auto a = std::make_shared<Array>();
    a->item_type = item_type;
    a->items = std::move(items);
    Value out;
    out.type_ = ValueType::ARRAY;
    out.kind_ = Kind::Array;
    out.a_ = std::move(a);
    return out;
}

Value Value::array_of_strings(const std::vector<std::string> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (const auto &s : v) items.push_back(string(s));
    return array(ValueType::STRING, std::move(items));
}

Value Value::array_of_u32(const std::vector<uint32_t> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (auto x : v) items.push_back(u32(x));
    return array(ValueType::U32, std::move(items));
}

Value Value::array_of_i32(const std::vector<int32_t> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (auto x : v) items.push_back(i32(x));
    return array(ValueType::I32, std::move(items));
}

Value Value::array_of_f32(const std::vector<float> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (auto x : v) items.push_back(f32(x));
    return array(ValueType::F32, std::move(items));
}

uint64_t Value::as_unsigned() const {
    if (kind_ == Kind::Unsigned) return u_;
    if (kind_ == Kind::Signed) {
        if (i_ >= 0) return static_cast<uint64_t>(i_);
        throw Error(fmt::format("negative {} value {} where an unsigned value is needed",
                                value_type_name(type_), i_));
    }
    throw Error(fmt::format("{} value where an integer is needed", value_type_name(type_)));
}

int64_t Value::as_signed() const {
    if (kind_ == Kind::Signed) return i_;
    if (kind_ == Kind::Unsigned) {
        if (u_ <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u_);
        throw Error(fmt::format("{} value {} does not fit a signed 64-bit integer",
                                value_type_name(type_), u_));
    }
    throw Error(fmt::format("{} value where an integer is needed", value_type_name(type_)));
}

double Value::as_double() const {
    if (kind_ == Kind::Float) return d_;
    if (kind_ == Kind::Unsigned) return static_cast<double>(u_);
    if (kind_ == Kind::Signed) return static_cast<double>(i_);
    throw Error(fmt::format("{} value where a number is needed", value_type_name(type_)));
}

bool Value::as_bool() const {
    if (kind_ == Kind::Bool) return u_ != 0;
    throw Error(fmt::format("{} value where a bool is needed", value_type_name(type_)));
}

const std::string &Value::as_string() const {
    if (kind_ == Kind::String) return s_;
    throw Error(fmt::format("{} value where a string is needed", value_type_name(type_)));
}

const Array &Value::as_array() const {
    if (kind_ == Kind::Array) return *a_;
    throw Error(fmt::format("{} value where an array is needed", value_type_name(type_)));
}

}  // namespace ds4::gguf
