// The ggml type table (src/gguf/ggml_type.cpp) against gguf-py's GGML_QUANT_SIZES.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "fixture_files.h"
#include "gguf/ggml_type.h"

namespace ds4 {
namespace {

struct PyTypeSize {
    uint32_t id;
    std::string name;
    uint32_t block_elems;
    uint32_t block_bytes;
};

std::vector<PyTypeSize> gguf_py_sizes() {
    const std::vector<uint8_t> bytes = quant::testing::read_fixture("ggml_quant_sizes.txt");
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    std::vector<PyTypeSize> out;
    PyTypeSize t;
    while (in >> t.id >> t.name >> t.block_elems >> t.block_bytes) out.push_back(t);
    return out;
}

TEST(GgmlTypeTable, MatchesGgufPy) {
    const std::vector<PyTypeSize> py = gguf_py_sizes();
    ASSERT_GT(py.size(), 30u);
    int compared = 0;
    for (const PyTypeSize &t : py) {
        const auto ours = ggml_type_info(t.id);
        if (!ours) continue;  // a type gguf-py knows and we do not read (e.g. NVFP4)
        EXPECT_EQ(ours->name, t.name) << "id " << t.id;
        EXPECT_EQ(ours->block_elems, t.block_elems) << t.name;
        // Q8_1: gguf-py says 40 bytes, ggml's block_q8_1 (f16 d, f16 s, 32 int8) is 36; we
        // follow ggml, and never read Q8_1 data.
        if (t.name != "Q8_1") {
            EXPECT_EQ(ours->block_bytes, t.block_bytes) << t.name;
        }
        ++compared;
    }
    // every type we know is one gguf-py knows
    for (uint32_t id = 0; id < 256; ++id) {
        if (!ggml_type_info(id)) continue;
        bool found = false;
        for (const PyTypeSize &t : py) found |= t.id == id;
        EXPECT_TRUE(found) << "id " << id << " (" << ggml_type_info(id)->name
                           << ") is not in gguf-py";
    }
    EXPECT_GE(compared, 32);
}

}  // namespace
}  // namespace ds4
