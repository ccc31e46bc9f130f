#include "token_hash.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <vector>

#include "common/error.h"

namespace ds4::tools {

std::string tokens_sha256(std::span<const int32_t> ids) {
    // Fixed byte order, so a baseline written on one machine is valid on another.
    std::vector<unsigned char> bytes;
    bytes.reserve(ids.size() * 4);
    for (int32_t id : ids) {
        const auto u = static_cast<uint32_t>(id);
        for (int s = 0; s < 32; s += 8) bytes.push_back(static_cast<unsigned char>(u >> s));
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
        throw Error("SHA-256 of the token ids failed (OpenSSL)");
    std::string hex;
    for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
    return hex;
}

}  // namespace ds4::tools
