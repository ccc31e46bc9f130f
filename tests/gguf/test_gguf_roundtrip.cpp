// Writer -> reader round trips in memory, and the typed getters' checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

using namespace ds4;
using namespace ds4::gguf;

namespace {

Writer sample_writer(uint32_t alignment) {
    Writer w;
    if (alignment) w.set("general.alignment", Value::u32(alignment));
    w.set("u8", Value::u8(255));
    w.set("i8", Value::i8(-128));
    w.set("u16", Value::u16(65535));
    w.set("i16", Value::i16(-32768));
    w.set("u32", Value::u32(4294967295u));
    w.set("i32", Value::i32(-7));
    w.set("f32", Value::f32(0.1f));
    w.set("u64", Value::u64(UINT64_MAX));
    w.set("i64", Value::i64(INT64_MIN));
    w.set("f64", Value::f64(0.1));
    w.set("bool", Value::boolean(true));
    w.set("str", Value::string(std::string("a\0b", 3)));
    w.set("strings", Value::array_of_strings({"x", "", "<｜User｜>"}));
    w.set("floats", Value::array_of_f32({1.0f, -2.5f}));
    w.set("nested",
          Value::array(ValueType::ARRAY, {Value::array_of_u32({1, 2}), Value::array_of_u32({})}));
    return w;
}

TEST(GgufRoundTrip, AllValueTypesAndTensors) {
    for (uint32_t alignment : {0u, 64u, 4096u}) {
        SCOPED_TRACE(alignment);
        Writer w = sample_writer(alignment);
        std::vector<float> a(3 * 5);
        for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
        std::vector<uint8_t> q(34 * 2, 7);
        w.add_tensor("a", GgmlType::F32, {5, 3}, a.data(), a.size() * 4);
        w.add_tensor("q", GgmlType::Q8_0, {64}, q.data(), q.size());
        w.add_tensor_lazy("lazy", GgmlType::I32, {3}, [](uint8_t *dst, size_t n) {
            for (size_t i = 0; i < n; ++i) dst[i] = uint8_t(i);
        });
        const auto bytes = w.to_bytes();
        auto f = File::from_memory(bytes.data(), bytes.size());
        const uint32_t al = alignment ? alignment : kDefaultAlignment;
        EXPECT_EQ(f->alignment(), al);
        EXPECT_EQ(f->data_offset() % al, 0u);
        EXPECT_EQ(f->get_u32("u8"), 255u);
        EXPECT_EQ(f->get_i64("i8"), -128);
        EXPECT_EQ(f->get_u32("u16"), 65535u);
        EXPECT_EQ(f->get_i64("i16"), -32768);
        EXPECT_EQ(f->get_u32("u32"), 4294967295u);
        EXPECT_EQ(f->get_i64("i32"), -7);
        EXPECT_EQ(f->get_f32("f32"), 0.1f);
        EXPECT_EQ(f->find("f32")->type(), ValueType::F32);
        EXPECT_EQ(f->get_u64("u64"), UINT64_MAX);
        EXPECT_EQ(f->get_i64("i64"), INT64_MIN);
        EXPECT_EQ(f->get_f64("f64"), 0.1);
        EXPECT_TRUE(f->get_bool("bool"));
        EXPECT_EQ(f->get_string("str"), std::string("a\0b", 3));
        EXPECT_EQ(f->get_string_array("strings"),
                  (std::vector<std::string>{"x", "", "<｜User｜>"}));
        EXPECT_EQ(f->get_float_array("floats"), (std::vector<double>{1.0, -2.5}));
        const Array &nested = f->get_array("nested");
        ASSERT_EQ(nested.items.size(), 2u);
        EXPECT_EQ(nested.items[0].as_array().items[1].as_unsigned(), 2u);
        EXPECT_TRUE(nested.items[1].as_array().items.empty());

        ASSERT_EQ(f->tensors().size(), 3u);
        const TensorInfo &ta = f->tensor("a");
        EXPECT_EQ(ta.ne, (std::vector<uint64_t>{5, 3}));
        EXPECT_EQ(ta.n_bytes, 60u);
        EXPECT_EQ(ta.row_bytes(), 20u);
        EXPECT_EQ(std::memcmp(ta.data, a.data(), 60), 0);
        const TensorInfo &tq = f->tensor("q");
        EXPECT_EQ(tq.type, GgmlType::Q8_0);
        EXPECT_EQ(tq.n_bytes, 68u);
        EXPECT_EQ(tq.offset % al, 0u);
        EXPECT_EQ(std::memcmp(tq.data, q.data(), q.size()), 0);
        const TensorInfo &tl = f->tensor("lazy");
        for (size_t i = 0; i < 12; ++i) EXPECT_EQ(tl.data[i], uint8_t(i));
    }
}

TEST(GgufRoundTrip, WriteToDiskMatchesToBytes) {
    Writer w = sample_writer(0);
    std::vector<float> a(8, 1.0f);
    w.add_tensor("a", GgmlType::F32, {8}, a.data(), 32);
    const std::string path = ::testing::TempDir() + "/roundtrip.gguf";
    w.write(path);
    auto f = File::open(path);
    const auto bytes = w.to_bytes();
    ASSERT_EQ(f->file_size(), bytes.size());
    EXPECT_EQ(std::memcmp(f->base(), bytes.data(), bytes.size()), 0);
    std::remove(path.c_str());
}

TEST(GgufGetters, WrongTypesNameTheKey) {
    Writer w = sample_writer(0);
    const auto bytes = w.to_bytes();
    auto f = File::from_memory(bytes.data(), bytes.size(), "sample.gguf");
    auto expect_error = [](auto fn, const std::string &needle) {
        try {
            fn();
            ADD_FAILURE() << "no error, expected one containing: " << needle;
        } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error([&] { f->get_u32("missing"); }, "sample.gguf: missing metadata key 'missing'");
    expect_error([&] { f->get_u32("i32"); }, "metadata key 'i32': negative i32 value -7");
    expect_error([&] { f->get_u32("u64"); },
                 "metadata key 'u64': value 18446744073709551615 does not fit in u32");
    expect_error([&] { f->get_u32("f32"); },
                 "metadata key 'f32': f32 value where an integer is needed");
    expect_error([&] { f->get_string("u8"); }, "u8 value where a string is needed");
    expect_error([&] { f->get_bool("str"); }, "string value where a bool is needed");
    expect_error([&] { f->get_string_array("floats"); }, "array of f32, expected array of string");
    expect_error([&] { f->get_int_array("strings"); }, "expected an integer array");
    expect_error([&] { f->get_i64("u64"); }, "does not fit a signed 64-bit integer");
    expect_error([&] { f->tensor("nope"); }, "missing tensor 'nope'");
    EXPECT_EQ(f->get_u32_or("missing", 42u), 42u);
    EXPECT_EQ(f->get_string_or("missing", "d"), "d");
}

TEST(GgufWriter, RejectsInconsistentInput) {
    Writer w;
    w.set("k", Value::u8(1));
    EXPECT_THROW(w.set("k", Value::u8(2)), Error);
    EXPECT_THROW(w.set("general.alignment", Value::u32(48)), Error);
    EXPECT_THROW(w.set("general.alignment", Value::u64(32)), Error);
    std::vector<uint8_t> q(34);
    EXPECT_THROW(w.add_tensor("q", GgmlType::Q8_0, {33}, q.data(), q.size()), Error);
    EXPECT_THROW(w.add_tensor("q", GgmlType::Q8_0, {64}, q.data(), q.size()), Error);
    w.add_tensor("q", GgmlType::Q8_0, {32}, q.data(), q.size());
    EXPECT_THROW(w.add_tensor("q", GgmlType::Q8_0, {32}, q.data(), q.size()), Error);
    EXPECT_THROW(Value::array(ValueType::U32, {Value::u8(1)}), Error);
}

TEST(GgmlTypes, RowBytes) {
    EXPECT_EQ(ggml_row_bytes(GgmlType::IQ2_XXS, 4096), 1056u);
    EXPECT_EQ(ggml_row_bytes(GgmlType::Q2_K, 2048), 672u);
    EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 4096), 2304u);
    EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_0, 4096), 4352u);
    EXPECT_THROW(ggml_row_bytes(GgmlType::Q4_K, 100), Error);
    EXPECT_FALSE(ggml_type_info(4).has_value());
    EXPECT_FALSE(ggml_type_info(1000).has_value());
}

}  // namespace
