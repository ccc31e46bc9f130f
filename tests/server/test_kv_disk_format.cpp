// The disk KV cache's checkpoint format (src/server/kv_disk_format.h): CRC32C against its check
// value, round trips, and every truncation, byte flip and random mutation refused (never a crash).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "common/error.h"
#include "server/kv_disk_format.h"

using namespace ds4;
using namespace ds4::server;

namespace {

std::vector<uint8_t> sample_file() {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 37; ++i) tokens.push_back(i * 31 % 500);
    std::vector<uint8_t> payload(1000);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7 + 3);
    KvHeader h{.reason = uint32_t(KvSaveReason::KV_SAVE_COLD),
               .model_id = 0x1234abcd5678ef01ull,
               .ctx = 4096,
               .created = 1767225600};
    return build_kv_checkpoint(h, tokens, payload);
}

TEST(KvDiskFormat, Crc32cCheckValue) {
    EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
    EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
    EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(KvDiskFormat, RoundTrip) {
    const auto file = sample_file();
    ASSERT_EQ(file.size(), kKvHeaderBytes + 4 * 37 + 1000 + 4);
    const KvCheckpoint c = parse_kv_checkpoint(file);
    EXPECT_EQ(c.header.model_id, 0x1234abcd5678ef01ull);
    EXPECT_EQ(c.header.ctx, 4096u);
    EXPECT_EQ(c.header.n_tokens, 37u);
    EXPECT_EQ(c.header.payload_bytes, 1000u);
    EXPECT_EQ(c.header.created, 1767225600u);
    EXPECT_STREQ(kv_save_reason_name(c.header.reason), "cold");
    ASSERT_EQ(c.tokens.size(), 37u);
    EXPECT_EQ(c.tokens[5], 155);
    ASSERT_EQ(c.payload.size(), 1000u);
    EXPECT_EQ(c.payload[10], uint8_t(73));
}

TEST(KvDiskFormat, EveryTruncationAndExtensionIsRefused) {
    const auto file = sample_file();
    for (size_t n = 0; n < file.size(); ++n)
        EXPECT_THROW(parse_kv_checkpoint(std::span(file).first(n)), Error) << n;
    auto longer = file;
    longer.push_back(0);
    EXPECT_THROW(parse_kv_checkpoint(longer), Error);
}

TEST(KvDiskFormat, EveryBitFlipIsRefused) {
    const auto file = sample_file();
    for (size_t i = 0; i < file.size(); ++i)
        for (int bit = 0; bit < 8; bit += 3) {
            auto c = file;
            c[i] ^= uint8_t(1 << bit);
            EXPECT_THROW(parse_kv_checkpoint(c), Error) << i << " bit " << bit;
        }
}

TEST(KvDiskFormat, HeaderFieldsAreChecked) {
    KvHeader h{.model_id = 1, .ctx = 10, .n_tokens = 0};
    auto head = encode_kv_header(h);
    EXPECT_THROW(decode_kv_header(head), Error);  // no tokens
    h.n_tokens = 11;
    head = encode_kv_header(h);
    EXPECT_THROW(decode_kv_header(head), Error);  // more tokens than the context
    h.n_tokens = 5;
    h.payload_bytes = uint64_t(1) << 60;
    head = encode_kv_header(h);
    EXPECT_THROW(decode_kv_header(head), Error);  // a payload beyond any disk
    h.payload_bytes = 10;
    head = encode_kv_header(h);
    EXPECT_EQ(decode_kv_header(head).n_tokens, 5u);
    EXPECT_THROW(decode_kv_header(std::span(head).first(63)), Error);
    // A reserved byte set, with the header checksum fixed up: still refused.
    head[50] = 1;
    const uint32_t crc = crc32c(head.data(), 60);
    std::memcpy(head.data() + 60, &crc, 4);
    EXPECT_THROW(decode_kv_header(head), Error);
}

TEST(KvDiskFormat, RandomMutationsNeverCrash) {
    const auto file = sample_file();
    std::mt19937_64 rng(3);
    for (int i = 0; i < 20000; ++i) {
        auto c = file;
        switch (rng() % 4) {
            case 0:
                c.resize(rng() % (c.size() + 8));
                break;
            case 1:
                c[rng() % 64] = uint8_t(rng());
                break;
            case 2:
                for (int k = 0; k < 8; ++k) c[rng() % c.size()] = uint8_t(rng());
                break;
            default:
                c.insert(c.begin() + long(rng() % c.size()), uint8_t(rng()));
                break;
        }
        try {
            const KvCheckpoint k = parse_kv_checkpoint(c);
            EXPECT_EQ(k.payload.size(), k.header.payload_bytes);
        } catch (const Error &) {
        }
    }
}

}  // namespace
