// Test helper: writes a GGUF with our writer covering every value type, nested arrays and
// several tensor types, then prints (JSON) what it wrote, so that gguf-py's GGUFReader can be
// checked against it (tests/gguf/test_gguf_interop.py).
//   ds4-test-gguf-write-sample OUT.gguf [alignment]
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/error.h"
#include "gguf/gguf_writer.h"

using namespace ds4;
using namespace ds4::gguf;
using nlohmann::json;

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s OUT.gguf [alignment]\n", argv[0]);
        return 2;
    }
    const uint32_t alignment = argc > 2 ? static_cast<uint32_t>(std::stoul(argv[2])) : 0;
    try {
        Writer w;
        json meta = json::array();
        auto put = [&](const std::string &key, Value v, json expect) {
            meta.push_back({{"key", key}, {"type", value_type_name(v.type())}, {"value", expect}});
            w.set(key, std::move(v));
        };
        if (alignment) put("general.alignment", Value::u32(alignment), alignment);
        put("general.architecture", Value::string("deepseek4"), "deepseek4");
        put("v.u8", Value::u8(250), 250);
        put("v.i8", Value::i8(-5), -5);
        put("v.u16", Value::u16(65000), 65000);
        put("v.i16", Value::i16(-32000), -32000);
        put("v.u32", Value::u32(3000000000u), 3000000000u);
        put("v.i32", Value::i32(-123456), -123456);
        put("v.f32", Value::f32(3.25f), 3.25);
        put("v.u64", Value::u64(1ull << 50), 1ull << 50);
        put("v.i64", Value::i64(-(1ll << 50)), -(1ll << 50));
        put("v.f64", Value::f64(-1e-300), -1e-300);
        put("v.bool", Value::boolean(false), false);
        put("v.str", Value::string("日本語 <｜User｜>"), "日本語 <｜User｜>");
        put("v.strings", Value::array_of_strings({"a", "", "Ġthe"}),
            json::array({"a", "", "Ġthe"}));
        put("v.i32s", Value::array_of_i32({-1, 0, 1}), json::array({-1, 0, 1}));
        put("v.f32s", Value::array_of_f32({0.5f, 10.0f}), json::array({0.5, 10.0}));
        put("v.nested",
            Value::array(ValueType::ARRAY, {Value::array_of_u32({1, 2}), Value::array_of_u32({3})}),
            json::array({json::array({1, 2}), json::array({3})}));

        json tensors = json::array();
        std::mt19937_64 rng(1234);
        auto tensor = [&](const std::string &name, GgmlType type, std::vector<uint64_t> ne) {
            const uint64_t n = tensor_n_bytes(type, ne);
            std::vector<uint8_t> bytes(n);
            for (auto &b : bytes) b = static_cast<uint8_t>(rng());
            std::string hex;
            for (uint8_t b : bytes) hex += fmt::format("{:02x}", b);
            tensors.push_back({{"name", name},
                               {"type_id", static_cast<uint32_t>(type)},
                               {"ne", ne},
                               {"hex", hex}});
            w.add_tensor(name, type, std::move(ne), bytes.data(), bytes.size());
        };
        tensor("t.f32", GgmlType::F32, {7, 3});
        tensor("t.f16", GgmlType::F16, {5});
        tensor("t.bf16", GgmlType::BF16, {4, 2});
        tensor("t.q8_0", GgmlType::Q8_0, {64, 2});
        tensor("t.q2_k", GgmlType::Q2_K, {256, 2});
        tensor("t.q4_k", GgmlType::Q4_K, {256});
        tensor("t.iq2_xxs", GgmlType::IQ2_XXS, {512, 1, 2});
        tensor("t.mxfp4", GgmlType::MXFP4, {32, 3});
        tensor("t.i32", GgmlType::I32, {6, 129});
        w.write(argv[1]);
        std::cout << json{{"alignment", alignment ? alignment : 32u},
                          {"metadata", meta},
                          {"tensors", tensors}}
                         .dump()
                  << "\n";
    } catch (const Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
