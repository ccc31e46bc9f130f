// quantize-rows TYPE N_PER_ROW IN.f32 OUT: a test helper for the Python oracle comparisons
// (tests/quant/test_iq2_xxs_vs_ggml.py). Reads raw little-endian f32 rows of N_PER_ROW values,
// quantizes each with ds4's quantizer for TYPE (a ggml type name: IQ2_XXS, Q2_K, Q8_0 ...) and
// writes the raw blocks. Exit 0 on success, 2 with a message on any error.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/ggml_type.h"
#include "quant/quant.h"

namespace {

ds4::GgmlType type_by_name(const std::string &name) {
    for (uint32_t id = 0; id < 64; ++id) {
        const auto info = ds4::ggml_type_info(id);
        if (info && info->name == name) return info->type;
    }
    throw ds4::Error("unknown ggml type '" + name + "'");
}

void run(const std::string &type_name, const std::string &n_arg, const std::string &in_path,
         const std::string &out_path) {
    const ds4::GgmlType type = type_by_name(type_name);
    const int64_t n = std::stoll(n_arg);
    std::ifstream in(in_path, std::ios::binary);
    if (!in) throw ds4::Error("cannot open " + in_path);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    const size_t row_bytes_in = static_cast<size_t>(n) * sizeof(float);
    if (n <= 0 || bytes.size() % row_bytes_in != 0)
        throw ds4::Error(in_path + ": " + std::to_string(bytes.size()) +
                         " bytes is not a whole number of rows of " + n_arg + " f32 values");
    const size_t n_rows = bytes.size() / row_bytes_in;
    const size_t row_bytes_out = ds4::quant::row_size(type, n);
    std::vector<float> row(static_cast<size_t>(n));
    std::vector<char> out(n_rows * row_bytes_out);
    for (size_t r = 0; r < n_rows; ++r) {
        std::copy_n(bytes.data() + r * row_bytes_in, row_bytes_in,
                    reinterpret_cast<char *>(row.data()));
        ds4::quant::quantize_row(type, row.data(), out.data() + r * row_bytes_out, n);
    }
    std::ofstream f(out_path, std::ios::binary);
    f.write(out.data(), std::ssize(out));
    if (!f) throw ds4::Error("cannot write " + out_path);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: quantize-rows TYPE N_PER_ROW IN.f32 OUT\n");
        return 2;
    }
    try {
        run(argv[1], argv[2], argv[3], argv[4]);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "quantize-rows: error: %s\n", e.what());
        return 2;
    }
    return 0;
}
