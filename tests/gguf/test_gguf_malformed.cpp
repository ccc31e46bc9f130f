// Every file of the hand-made malformed corpus is rejected with an error naming its defect.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "gguf/gguf_file.h"

namespace {

const std::string kDir = std::string(DS4_SOURCE_DIR) + "/tests/gguf/malformed/";

TEST(GgufMalformed, EveryCorpusFileFailsWithItsMessage) {
    std::ifstream in(kDir + "manifest.json");
    ASSERT_TRUE(in) << "missing " << kDir << "manifest.json (run tests/gguf/make_malformed.py)";
    const auto manifest = nlohmann::json::parse(in);
    ASSERT_GE(manifest.size(), 25u);
    for (const auto &[file, expected] : manifest.items()) {
        SCOPED_TRACE(file);
        try {
            auto f = ds4::gguf::File::open(kDir + file);
            ADD_FAILURE() << file << " was accepted";
        } catch (const ds4::Error &e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(expected.get<std::string>()), std::string::npos)
                << "error was: " << msg;
            EXPECT_NE(msg.find(file), std::string::npos) << "error does not name the file: " << msg;
        }
    }
}

TEST(GgufMalformed, MissingFileAndDirectoryAreErrors) {
    EXPECT_THROW(ds4::gguf::File::open(kDir + "does-not-exist.gguf"), ds4::Error);
    EXPECT_THROW(ds4::gguf::File::open(kDir), ds4::Error);
}

// Every proper prefix of a valid file is rejected (never a crash), except prefixes that still
// hold every byte a parser needs: a file is only valid when all tensors lie inside it.
TEST(GgufMalformed, EveryTruncationOfAValidFileIsRejected) {
    std::ifstream in(std::string(DS4_SOURCE_DIR) + "/tests/fuzz/corpus/gguf/valid_small.gguf",
                     std::ios::binary);
    ASSERT_TRUE(in);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    auto full = ds4::gguf::File::from_memory(bytes.data(), bytes.size());
    uint64_t end_of_tensors = 0;
    for (const auto &t : full->tensors())
        end_of_tensors = std::max(end_of_tensors, full->data_offset() + t.offset + t.n_bytes);
    for (size_t n = 0; n < end_of_tensors; ++n)
        EXPECT_THROW(ds4::gguf::File::from_memory(bytes.data(), n), ds4::Error) << "prefix " << n;
}

}  // namespace
