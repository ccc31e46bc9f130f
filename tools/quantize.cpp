// ds4-quantize: rewrite a deepseek4 GGUF (e.g. the f32 output of tools/convert/ds4-convert) with
// the tensor types of a quant mix: q8_0, q4 (the published Q4_K-experts layout), q2 (the published
// IQ2_XXS gate/up, Q2_K down experts layout) or f32.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>

#include "cli_app.h"
#include "common/error.h"
#include "exit_codes.h"
#include "gguf/gguf_file.h"
#include "input_files.h"
#include "model/requantize.h"
#include "run_env.h"
#include "tool_main.h"

namespace {

using ds4::tools::UsageError;

// Writing the output truncates it; when it is the input (same path, a hard or symbolic link, a
// ./ spelling) that would destroy the source before it is read, so it is refused up front.
void check_distinct(const std::string &in, const std::string &out) {
    std::error_code ec;
    if (std::filesystem::equivalent(in, out, ec) && !ec)
        throw UsageError(
            fmt::format("the output {} is the input file {}; write to another path", out, in));
}

int quantize_main(int argc, char **argv) {
    CLI::App app{"ds4-quantize: rewrite a deepseek4 GGUF with the tensor types of a quant mix",
                 "ds4-quantize"};
    ds4::tools::configure_app(app, "ds4-quantize");
    std::string in, out, quant;
    bool quiet = false;
    int threads = 0;
    app.add_option("input", in, "source GGUF (any supported types)")->required();
    app.add_option("output", out, "destination GGUF (not the input)")->required();
    app.add_option("--quant", quant,
                   "f32 | q8_0 | q4 (routed experts Q4_K) | q2 (routed gate/up IQ2_XXS, down Q2_K)")
        ->required();
    app.add_flag("-q,--quiet", quiet, "no progress on stderr");
    app.add_option("-t,--threads", threads,
                   "threads quantizing rows; 0 (the default) = DS4_THREADS when set, else one per "
                   "core")
        ->check(ds4::tools::integer_in(0, ds4::tools::kMaxThreads));
    if (const auto rc = ds4::tools::parse_args(app, argc, argv)) return *rc;
    threads = ds4::tools::resolve_threads(threads, "ds4-quantize");
    ds4::tools::check_simd_env();

    // Everything about the arguments is checked before the output is touched.
    ds4::model::QuantMix mix;
    try {
        mix = ds4::model::parse_quant_mix(quant);
    } catch (const ds4::Error &e) {
        throw UsageError(e.what());
    }
    std::error_code ec;
    if (std::filesystem::is_directory(in, ec))
        throw UsageError(fmt::format("input {} is a directory, not a GGUF file", in));
    try {
        (void)ds4::gguf::File::open(in);
    } catch (const ds4::Error &e) {
        throw UsageError(e.what());
    }
    check_distinct(in, out);
    ds4::tools::check_output_writable(out, "output");
    try {
        ds4::model::requantize_model(in, out, mix, !quiet, threads);
    } catch (const ds4::Error &e) {
        throw ds4::Error(fmt::format("error: {}", e.what()));
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main("ds4-quantize", [&] { return quantize_main(argc, argv); });
}
