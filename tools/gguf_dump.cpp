// ds4-gguf-dump: print a GGUF file's header, metadata and tensor table, as text or JSON.
// Exit status: 0 ok, 2 the file is missing or malformed (the error names the problem), 1 any
// other failure (docs/CLI.md).
#include <fmt/format.h>
#include <openssl/sha.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_app.h"
#include "common/error.h"
#include "exit_codes.h"
#include "gguf/gguf_file.h"
#include "tool_main.h"

using ds4::gguf::Array;
using ds4::gguf::Value;
using ds4::gguf::ValueType;
using nlohmann::json;

namespace {

json value_to_json(const Value &v) {
    switch (v.type()) {
        case ValueType::U8:
        case ValueType::U16:
        case ValueType::U32:
        case ValueType::U64:
            return v.as_unsigned();
        case ValueType::I8:
        case ValueType::I16:
        case ValueType::I32:
        case ValueType::I64:
            return v.as_signed();
        case ValueType::F32:
        case ValueType::F64: {
            const double d = v.as_double();
            if (std::isnan(d)) return "nan";
            if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
            return d;
        }
        case ValueType::BOOL:
            return v.as_bool();
        case ValueType::STRING: {
            // Not every GGUF string is valid UTF-8; keep the bytes recoverable.
            const std::string &s = v.as_string();
            return json::binary_t(std::vector<uint8_t>(s.begin(), s.end()));
        }
        case ValueType::ARRAY: {
            json items = json::array();
            for (const auto &item : v.as_array().items) items.push_back(value_to_json(item));
            return json{{"item_type", ds4::gguf::value_type_name(v.as_array().item_type)},
                        {"items", items}};
        }
    }
    return nullptr;
}

// Strings are emitted as hex so that arbitrary bytes survive JSON.
json strings_to_hex(json j) {
    if (j.is_binary()) {
        std::string hex;
        for (uint8_t b : j.get_binary()) hex += fmt::format("{:02x}", b);
        return json{{"hex", hex}};
    }
    if (j.is_object() && j.contains("items"))
        for (auto &item : j["items"]) item = strings_to_hex(item);
    return j;
}

std::string sha256_hex(const uint8_t *p, uint64_t n) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(p, n, md);
    std::string hex;
    for (unsigned char b : md) hex += fmt::format("{:02x}", b);
    return hex;
}

std::string value_summary(const Value &v) {
    if (v.type() == ValueType::ARRAY) {
        const Array &a = v.as_array();
        return fmt::format("[{} x {}]", a.items.size(), ds4::gguf::value_type_name(a.item_type));
    }
    if (v.type() == ValueType::STRING) {
        std::string s = v.as_string();
        if (s.size() > 60) s = s.substr(0, 57) + "...";
        return "\"" + s + "\"";
    }
    if (v.type() == ValueType::BOOL) return v.as_bool() ? "true" : "false";
    if (v.is_float()) return fmt::format("{}", v.as_double());
    if (v.type() == ValueType::I8 || v.type() == ValueType::I16 || v.type() == ValueType::I32 ||
        v.type() == ValueType::I64)
        return std::to_string(v.as_signed());
    return std::to_string(v.as_unsigned());
}

int dump_main(int argc, char **argv) {
    CLI::App app{"ds4-gguf-dump: print a GGUF file's metadata and tensor table", "ds4-gguf-dump"};
    ds4::tools::configure_app(app, "ds4-gguf-dump");
    std::string path;
    bool as_json = false, hash = false;
    app.add_option("file", path, "GGUF file")->required();
    app.add_flag("--json", as_json, "machine-readable output (strings as hex bytes)");
    app.add_flag("--hash", hash, "include the SHA-256 of every tensor's bytes");
    if (const auto rc = ds4::tools::parse_args(app, argc, argv)) return *rc;

    std::unique_ptr<ds4::gguf::File> f;
    try {
        f = ds4::gguf::File::open(path);
    } catch (const ds4::Error &e) {
        throw ds4::tools::UsageError(fmt::format("error: {}", e.what()));  // the file is at fault
    }
    if (as_json) {
        json out;
        out["version"] = f->version();
        out["alignment"] = f->alignment();
        out["data_offset"] = f->data_offset();
        json meta = json::array();
        for (const auto &[key, value] : f->metadata())
            meta.push_back({{"key", key},
                            {"type", ds4::gguf::value_type_name(value.type())},
                            {"value", strings_to_hex(value_to_json(value))}});
        out["metadata"] = meta;
        json tensors = json::array();
        for (const auto &t : f->tensors()) {
            json jt = {{"name", t.name},
                       {"type", ds4::ggml_type_name(t.type)},
                       {"type_id", static_cast<uint32_t>(t.type)},
                       {"ne", t.ne},
                       {"offset", t.offset},
                       {"n_bytes", t.n_bytes}};
            if (hash) jt["sha256"] = sha256_hex(t.data, t.n_bytes);
            tensors.push_back(jt);
        }
        out["tensors"] = tensors;
        std::cout << out.dump() << "\n";
    } else {
        fmt::print("{}: GGUF v{}, alignment {}, {} metadata keys, {} tensors, data at {}\n", path,
                   f->version(), f->alignment(), f->metadata().size(), f->tensors().size(),
                   f->data_offset());
        for (const auto &[key, value] : f->metadata())
            fmt::print("  {:<48} {:<7} {}\n", key, ds4::gguf::value_type_name(value.type()),
                       value_summary(value));
        for (const auto &t : f->tensors())
            fmt::print("  {:<40} {:<8} {:<24} {:>14} bytes{}\n", t.name,
                       ds4::ggml_type_name(t.type), t.shape_string(), t.n_bytes,
                       hash ? "  " + sha256_hex(t.data, t.n_bytes) : "");
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main("ds4-gguf-dump", [&] { return dump_main(argc, argv); });
}
