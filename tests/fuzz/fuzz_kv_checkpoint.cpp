// libFuzzer target: the disk KV cache's checkpoint parser (src/server/kv_disk_format.cpp) on
// arbitrary bytes. Every input must parse or throw ds4::Error; a parse that passes must describe
// exactly the bytes it was given.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/error.h"
#include "server/kv_disk_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::span<const uint8_t> bytes(data, size);
    try {
        (void)ds4::server::decode_kv_header(bytes);
    } catch (const ds4::Error &) {
    }
    try {
        const auto c = ds4::server::parse_kv_checkpoint(bytes);
        if (ds4::server::kv_file_bytes(c.header) != size) std::abort();
        if (c.tokens.size() != c.header.n_tokens) std::abort();
        if (c.payload.size() != c.header.payload_bytes) std::abort();
    } catch (const ds4::Error &) {
    }
    return 0;
}
