#include "fixture_files.h"

#include <fstream>
#include <iterator>

#include "common/error.h"

namespace ds4::quant::testing {

std::vector<uint8_t> read_fixture(const std::string &name) {
    const std::string path = std::string(DS4_SOURCE_DIR) + "/tests/quant/fixtures/" + name;
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw Error("cannot open fixture " + path +
                    " (regenerate with tests/quant/gen_quant_fixtures.py)");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace ds4::quant::testing
