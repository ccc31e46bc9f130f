// Prints the engine's logits at every position of a token sequence, for the llama.cpp parity test
// (test_llamacpp_parity.py): the tokens are evaluated one at a time (chunk 1) in one session, and
// after each one the full logit row is written as raw little-endian f32, so the output file is a
// [n_tokens, n_vocab] f32 matrix.
//
//   ds4-dump-logits MODEL.gguf TOKENS OUT.f32 [--qat 0|1] [--f16-rows 0|1] [--llama-rounding 0|1]
//   [--fresh 0|1]
//                   [--threads N]
//
// TOKENS: comma-separated token ids. --qat: the FP8 KV / FP4 indexer simulation (default 1, the
// engine's default); --f16-rows: cached rows rounded to f16 (default: the session's default, f16
// iff --qat 1); --llama-rounding: round as llama.cpp's CPU backend does (ForwardOptions);
// --fresh: every token in a new session, at position 0.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace {

int usage() {
    std::fprintf(stderr,
                 "usage: ds4-dump-logits MODEL.gguf TOKENS OUT.f32 [--qat 0|1] [--f16-rows 0|1] "
                 "[--llama-rounding 0|1] [--fresh 0|1] "
                 "[--threads N]\n");
    return 2;
}

int run(int argc, char **argv) {
    if (argc < 4) return usage();
    const std::string model_path = argv[1], out_path = argv[3];
    std::vector<int32_t> tokens;
    {
        std::stringstream ss(argv[2]);
        std::string item;
        while (std::getline(ss, item, ',')) tokens.push_back(static_cast<int32_t>(std::stol(item)));
    }
    bool qat = true, llama_rounding = false, fresh = false;
    int f16_rows = -1, threads = 1;
    for (int i = 4; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        const std::string opt = argv[i], val = argv[i + 1];
        if (opt == "--qat")
            qat = val != "0";
        else if (opt == "--f16-rows")
            f16_rows = val != "0" ? 1 : 0;
        else if (opt == "--llama-rounding")
            llama_rounding = val != "0";
        else if (opt == "--fresh")
            fresh = val != "0";
        else if (opt == "--threads")
            threads = std::stoi(val);
        else
            return usage();
    }
    if (tokens.empty()) return usage();
    {
        auto model = ds4::runtime::Model::load(model_path, {.n_threads = threads});
        ds4::runtime::SessionOptions so{.ctx = static_cast<uint32_t>(tokens.size() + 1),
                                        .chunk = 1};
        so.forward.qat_sim = qat;
        so.forward.llama_cpp_rounding = llama_rounding;
        so.f16_rows = f16_rows;
        std::ofstream out(out_path, std::ios::binary);
        auto session = std::make_unique<ds4::runtime::Session>(*model, so);
        for (size_t i = 0; i < tokens.size(); ++i) {
            if (fresh && i > 0) session = std::make_unique<ds4::runtime::Session>(*model, so);
            const auto &logits = session->eval(std::vector<int32_t>{tokens[i]});
            out.write(reinterpret_cast<const char *>(logits.data()),
                      static_cast<std::streamsize>(logits.size() * sizeof(float)));
        }
        if (!out) {
            std::fprintf(stderr, "ds4-dump-logits: cannot write %s\n", out_path.c_str());
            return 1;
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {  // bad numbers in the arguments, or the engine's errors
        std::fprintf(stderr, "ds4-dump-logits: %s\n", e.what());
        return 1;
    }
}
