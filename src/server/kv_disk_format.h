#pragma once
// The checkpoint file of ds4-server's disk KV cache (docs/SERVER.md, Disk KV cache). All fields
// little-endian:
//
//   header, 64 bytes:
//      0  u8[8]   magic "DS4KVCK\n"
//      8  u32     format version (1)
//     12  u32     save reason (KvSaveReason)
//     16  u64     model identity (kv_disk_cache.h, model_identity)
//     24  u32     ctx of the session that saved it
//     28  u32     token count n (> 0)
//     32  u64     payload bytes p
//     40  u64     created, Unix seconds
//     48  u8[12]  reserved, zero
//     60  u32     CRC32C of bytes 0..59
//   n x i32       the token ids
//   p bytes       the session state (runtime::Session::write_state)
//   u32           CRC32C of the token ids and the payload
//
// So a file is exactly 64 + 4n + p + 4 bytes, its header can be checked alone (the index at
// start), and every other byte is covered by the trailing checksum (before a load). Pure code:
// no I/O, no engine (the fuzz target compiles it alone).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ds4::server {

inline constexpr size_t kKvHeaderBytes = 64;
inline constexpr uint32_t kKvFormatVersion = 1;

enum class KvSaveReason : uint32_t {
    KV_SAVE_COLD = 1,       // after the prefill of a long prompt that reused nothing
    KV_SAVE_CONTINUED = 2,  // every --kv-cache-continued-interval-tokens positions
    KV_SAVE_SHUTDOWN = 3,   // a slot's live session at a clean shutdown
    KV_SAVE_EVICT = 4,      // a slot's live session before a prompt it is no prefix of replaces it
};
const char *kv_save_reason_name(uint32_t reason);

struct KvHeader {
    uint32_t reason = 0;
    uint64_t model_id = 0;
    uint32_t ctx = 0;
    uint32_t n_tokens = 0;
    uint64_t payload_bytes = 0;
    uint64_t created = 0;
};

// CRC32C (Castagnoli, reflected 0x82F63B78): crc32c(b, crc32c(a)) = crc32c(a ++ b).
uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0);

std::array<uint8_t, kKvHeaderBytes> encode_kv_header(const KvHeader &h);
// Throws ds4::Error naming the defect: short, magic, version, header checksum, reserved bytes,
// no tokens, or a payload so large that the file size overflows.
KvHeader decode_kv_header(std::span<const uint8_t> bytes);
// 64 + 4n + p + 4.
uint64_t kv_file_bytes(const KvHeader &h);

// A whole checkpoint in memory (tests, the fuzzer): the header, the size, token ids >= 0 and the
// trailing checksum checked. The payload is not interpreted (Session::read_state does that).
struct KvCheckpoint {
    KvHeader header;
    std::vector<int32_t> tokens;
    std::span<const uint8_t> payload;
};
KvCheckpoint parse_kv_checkpoint(std::span<const uint8_t> file);
// The bytes of a checkpoint (tests, the fuzz corpus); the server streams the same layout.
std::vector<uint8_t> build_kv_checkpoint(KvHeader h, std::span<const int32_t> tokens,
                                         std::span<const uint8_t> payload);

}  // namespace ds4::server
