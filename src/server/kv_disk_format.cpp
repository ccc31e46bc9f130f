#include "server/kv_disk_format.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "common/error.h"

namespace ds4::server {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian: a big-endian host needs byte swaps here");

constexpr char kMagic[8] = {'D', 'S', '4', 'K', 'V', 'C', 'K', '\n'};

// The byte-at-a-time table of the reflected polynomial.
const std::array<uint32_t, 256> &crc_table() {
    static const std::array<uint32_t, 256> t = [] {
        std::array<uint32_t, 256> a{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            a[i] = c;
        }
        return a;
    }();
    return t;
}

template <typename T>
void put(uint8_t *p, T v) {
    std::memcpy(p, &v, sizeof v);
}

template <typename T>
T get(const uint8_t *p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

}  // namespace

const char *kv_save_reason_name(uint32_t reason) {
    switch (KvSaveReason(reason)) {
        case KvSaveReason::KV_SAVE_COLD:
            return "cold";
        case KvSaveReason::KV_SAVE_CONTINUED:
            return "continued";
        case KvSaveReason::KV_SAVE_SHUTDOWN:
            return "shutdown";
        case KvSaveReason::KV_SAVE_EVICT:
            return "evict";
    }
    return "unknown";
}

uint32_t crc32c(const void *data, size_t n, uint32_t crc) {
    const auto &t = crc_table();
    const auto *p = static_cast<const uint8_t *>(data);
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

std::array<uint8_t, kKvHeaderBytes> encode_kv_header(const KvHeader &h) {
    std::array<uint8_t, kKvHeaderBytes> b{};
    std::memcpy(b.data(), kMagic, sizeof kMagic);
    put<uint32_t>(b.data() + 8, kKvFormatVersion);
    put<uint32_t>(b.data() + 12, h.reason);
    put<uint64_t>(b.data() + 16, h.model_id);
    put<uint32_t>(b.data() + 24, h.ctx);
    put<uint32_t>(b.data() + 28, h.n_tokens);
    put<uint64_t>(b.data() + 32, h.payload_bytes);
    put<uint64_t>(b.data() + 40, h.created);
    put<uint32_t>(b.data() + 60, crc32c(b.data(), 60));
    return b;
}

KvHeader decode_kv_header(std::span<const uint8_t> b) {
    if (b.size() < kKvHeaderBytes)
        throw Error(
            fmt::format("{} bytes, shorter than the {}-byte header", b.size(), kKvHeaderBytes));
    if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0)
        throw Error("not a ds4 KV checkpoint (bad magic)");
    if (const uint32_t v = get<uint32_t>(b.data() + 8); v != kKvFormatVersion)
        throw Error(fmt::format("format version {}, this build reads {}", v, kKvFormatVersion));
    if (get<uint32_t>(b.data() + 60) != crc32c(b.data(), 60))
        throw Error("the header checksum does not match");
    for (size_t i = 48; i < 60; ++i)
        if (b[i] != 0) throw Error("reserved header bytes are not zero");
    KvHeader h;
    h.reason = get<uint32_t>(b.data() + 12);
    h.model_id = get<uint64_t>(b.data() + 16);
    h.ctx = get<uint32_t>(b.data() + 24);
    h.n_tokens = get<uint32_t>(b.data() + 28);
    h.payload_bytes = get<uint64_t>(b.data() + 32);
    h.created = get<uint64_t>(b.data() + 40);
    if (h.n_tokens == 0) throw Error("no tokens");
    if (h.n_tokens > h.ctx)
        throw Error(fmt::format("{} tokens in a context of {}", h.n_tokens, h.ctx));
    // 2^56 bytes is far beyond any disk: it keeps 64 + 4n + p + 4 from overflowing.
    if (h.payload_bytes > (uint64_t(1) << 56))
        throw Error(fmt::format("a payload of {} bytes", h.payload_bytes));
    return h;
}

uint64_t kv_file_bytes(const KvHeader &h) {
    return kKvHeaderBytes + 4 * uint64_t(h.n_tokens) + h.payload_bytes + 4;
}

KvCheckpoint parse_kv_checkpoint(std::span<const uint8_t> file) {
    KvCheckpoint c;
    c.header = decode_kv_header(file);
    const uint64_t want = kv_file_bytes(c.header);
    if (file.size() != want)
        throw Error(
            fmt::format("{} bytes, the header says {} (truncated or extended)", file.size(), want));
    const std::span<const uint8_t> body =
        file.subspan(kKvHeaderBytes, file.size() - kKvHeaderBytes - 4);
    if (get<uint32_t>(file.data() + file.size() - 4) != crc32c(body.data(), body.size()))
        throw Error("the checksum of the tokens and the payload does not match");
    c.tokens.resize(c.header.n_tokens);
    std::memcpy(c.tokens.data(), body.data(), c.tokens.size() * sizeof(int32_t));
    for (size_t i = 0; i < c.tokens.size(); ++i)
        if (c.tokens[i] < 0) throw Error(fmt::format("token {} is {}", i, c.tokens[i]));
    c.payload = body.subspan(c.tokens.size() * sizeof(int32_t));
    return c;
}

std::vector<uint8_t> build_kv_checkpoint(KvHeader h, std::span<const int32_t> tokens,
                                         std::span<const uint8_t> payload) {
    h.n_tokens = static_cast<uint32_t>(tokens.size());
    h.payload_bytes = payload.size();
    const auto head = encode_kv_header(h);
    std::vector<uint8_t> out(size_t(kv_file_bytes(h)));
    std::memcpy(out.data(), head.data(), head.size());
    std::memcpy(out.data() + kKvHeaderBytes, tokens.data(), tokens.size_bytes());
    if (!payload.empty())
        std::memcpy(out.data() + kKvHeaderBytes + tokens.size_bytes(), payload.data(),
                    payload.size());
    put<uint32_t>(out.data() + out.size() - 4,
                  crc32c(out.data() + kKvHeaderBytes, out.size() - kKvHeaderBytes - 4));
    return out;
}

}  // namespace ds4::server
