// ds4-mkmodel: write a synthetic DeepSeek V4 model of any shape with random valid weights and the
// real vocabulary. Needs no Python and no checkpoint; used by the README, tests and benchmarks.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "model/hparams.h"
#include "model/synthetic_model.h"
#include "model/weights.h"

namespace {

// models/ds4-vocab.gguf relative to the working directory, else to the repository the binary
// was built from.
std::string default_vocab_path() {
    const std::string rel = "models/ds4-vocab.gguf";
    if (std::filesystem::exists(rel)) return rel;
    const std::string src = std::string(DS4_SOURCE_DIR) + "/" + rel;
    if (std::filesystem::exists(src)) return src;
    return rel;
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app{"Write a synthetic DeepSeek V4 model (random valid weights, real vocabulary)"};
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
    CLI11_PARSE(app, argc, argv);

    try {
        const auto t0 = std::chrono::steady_clock::now();
        auto vocab = ds4::gguf::File::open(vocab_path);
        const auto n_tokens =
            static_cast<uint32_t>(vocab->get_array("tokenizer.ggml.tokens").items.size());
        ds4::model::HParams hp;
        if (shape == "tiny" || shape == "small" || shape == "flash") {
            hp = ds4::model::shape_preset(shape, n_tokens);
        } else {
            std::ifstream in(shape);
            if (!in)
                throw ds4::Error(
                    fmt::format("--shape {}: not a preset and not a readable file", shape));
            std::stringstream ss;
            ss << in.rdbuf();
            hp = ds4::model::shape_from_json(ss.str(), n_tokens);
        }
        const auto mix = ds4::model::parse_quant_mix(quant);
        ds4::model::write_synthetic_model(hp, mix, seed, *vocab, out, !quiet);
        // Read the result back through the loader: what we write must be what we accept.
        auto f = ds4::gguf::File::open(out);
        const auto hp2 = ds4::model::HParams::from_gguf(*f);
        (void)ds4::model::ModelWeights::bind(*f, hp2);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!quiet)
            fmt::print(stderr, "mkmodel: wrote {} ({} shape, {} mix, {:.3f} GB) in {:.1f} s\n", out,
                       shape, quant, f->file_size() / 1e9, s);
    } catch (const ds4::Error &e) {
        fmt::print(stderr, "ds4-mkmodel: error: {}\n", e.what());
        return 2;
    }
    return 0;
}
