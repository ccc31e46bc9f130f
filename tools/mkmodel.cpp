// ds4-mkmodel: write a synthetic DeepSeek V4 model of any shape with random valid weights and the
// real vocabulary. Needs no Python and no checkpoint; used by the README, tests and benchmarks.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>

#include "cli_app.h"
#include "common/error.h"
#include "exit_codes.h"
#include "gguf/gguf_file.h"
#include "input_files.h"
#include "model/hparams.h"
#include "model/synthetic_model.h"
#include "model/weights.h"
#include "repo_paths.h"
#include "tool_main.h"

namespace {

// models/ds4-vocab.gguf as every tool finds its data (tools/common/repo_paths.h): the working
// directory, the install prefix beside the binary, then the source tree.
std::string default_vocab_path() {
    return ds4::tools::find_repo_file("models/ds4-vocab.gguf");
}

using ds4::tools::UsageError;

int mkmodel_main(int argc, char **argv) {
    CLI::App app{
        "ds4-mkmodel: write a synthetic DeepSeek V4 model (random valid weights, real vocabulary)",
        "ds4-mkmodel"};
    ds4::tools::configure_app(app, "ds4-mkmodel");
    std::string shape = "tiny", quant = "q8_0", out, vocab_path = default_vocab_path();
    uint64_t seed = 1;
    bool quiet = false;
    app.add_option("--shape", shape, "tiny | small | flash | a JSON file of hyper-parameter fields")
        ->capture_default_str();
    app.add_option("--quant", quant, "f32 | q8_0 | q2 | q4 (q2/q4: the published expert types)")
        ->capture_default_str();
    app.add_option("--seed", seed, "random seed")->capture_default_str();
    app.add_option("--out", out, "output GGUF path")->required();
    app.add_option("--vocab", vocab_path, "GGUF holding the tokenizer.* keys to embed")
        ->capture_default_str();
    app.add_flag("-q,--quiet", quiet, "no progress on stderr");
    if (const auto rc = ds4::tools::parse_args(app, argc, argv)) return *rc;

    // The arguments are checked (and the shape file read) before anything is generated.
    const auto t0 = std::chrono::steady_clock::now();
    ds4::model::HParams hp;
    ds4::model::QuantMix mix;
    std::unique_ptr<ds4::gguf::File> vocab;
    try {
        std::error_code ec;
        if (std::filesystem::is_directory(vocab_path, ec))
            throw ds4::Error(fmt::format("--vocab {} is a directory, not a GGUF file", vocab_path));
        vocab = ds4::gguf::File::open(vocab_path);
        const auto n_tokens =
            static_cast<uint32_t>(vocab->get_array("tokenizer.ggml.tokens").items.size());
        if (shape == "tiny" || shape == "small" || shape == "flash")
            hp = ds4::model::shape_preset(shape, n_tokens);
        else
            hp = ds4::model::shape_from_json(
                ds4::tools::read_input_file(shape, "--shape (not a preset, so a JSON file)"),
                n_tokens);
        mix = ds4::model::parse_quant_mix(quant);
    } catch (const ds4::Error &e) {
        throw UsageError(e.what());
    }
    ds4::tools::check_output_writable(out, "--out");
    try {
        ds4::model::write_synthetic_model(hp, mix, seed, *vocab, out, !quiet);
        // Read the result back through the loader: what we write must be what we accept.
        auto f = ds4::gguf::File::open(out);
        const auto hp2 = ds4::model::HParams::from_gguf(*f);
        (void)ds4::model::ModelWeights::bind(*f, hp2);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!quiet)
            fmt::print(stderr, "ds4-mkmodel: wrote {} ({} shape, {} mix, {:.3f} GB) in {:.1f} s\n",
                       out, shape, quant, f->file_size() / 1e9, s);
    } catch (const ds4::Error &e) {
        throw ds4::Error(fmt::format("error: {}", e.what()));
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main("ds4-mkmodel", [&] { return mkmodel_main(argc, argv); });
}
