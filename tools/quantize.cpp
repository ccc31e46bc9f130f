// ds4-quantize: rewrite a deepseek4 GGUF (e.g. the f32 output of tools/convert/ds4-convert) with
// the tensor types of a quant mix: q8_0, q4 (the published Q4_K-experts layout), q2 (the published
// IQ2_XXS gate/up, Q2_K down experts layout) or f32.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "model/requantize.h"

int main(int argc, char **argv) {
    CLI::App app{"Rewrite a deepseek4 GGUF with the tensor types of a quant mix"};
    std::string in, out, quant;
    bool quiet = false;
    int threads = 0;
    app.add_option("input", in, "source GGUF (any supported types)")->required();
    app.add_option("output", out, "destination GGUF")->required();
    app.add_option("--quant", quant,
                   "f32 | q8_0 | q4 (routed experts Q4_K) | q2 (routed gate/up IQ2_XXS, down Q2_K)")
        ->required();
    app.add_flag("-q,--quiet", quiet, "no progress on stderr");
    app.add_option("-t,--threads", threads, "threads quantizing rows (default: one per core)")
        ->check(CLI::NonNegativeNumber);
    CLI11_PARSE(app, argc, argv);
    try {
        ds4::model::requantize_model(in, out, ds4::model::parse_quant_mix(quant), !quiet, threads);
    } catch (const ds4::Error &e) {
        fmt::print(stderr, "ds4-quantize: error: {}\n", e.what());
        return 2;
    }
    return 0;
}
