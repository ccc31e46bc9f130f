// ds4: the command-line entry point (spec/SURFACES.md section 2).
//
// Implemented today: --dump-tokens, which needs only a vocabulary (a model GGUF or the
// vocab-only models/ds4-vocab.gguf) and no engine. Generation, the REPL and the diagnostic modes
// need the inference engine, which is not built yet: they exit with status 2 and say so.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr const char *kDefaultModel = "ds4flash.gguf";

struct Options {
    std::string prompt;
    std::string prompt_file;
    std::string system = "You are a helpful assistant";
    std::string model = kDefaultModel;
    int64_t ctx = 32768;
    bool dump_tokens = false;
    bool think = false;
    bool think_max = false;
    bool nothink = false;
};

// The reference CLI spells the system flag "-sys" (one dash, three letters), which CLI11 cannot
// declare; it is renamed to its long form before parsing.
std::vector<std::string> normalized_args(int argc, char **argv) {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes the arguments in reverse order
        std::string a = argv[i];
        if (a == "-sys") a = "--system";
        args.push_back(a);
    }
    return args;
}

std::string read_file_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ds4::Error(fmt::format("cannot read prompt file {}", path));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// SURFACES 2.5: the ids as one JSON-style line, then one line per token: the id right-aligned in
// six columns, two spaces, the raw bytes of the token.
void print_tokens(const ds4::tokenizer::Tokenizer &tok, const std::vector<int32_t> &ids) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? ", " : "", ids[i]);
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    for (int32_t id : ids) {
        const std::string_view bytes = tok.token_bytes(id);
        std::string row = fmt::format("{:>6}  ", id);
        row.append(bytes);
        row += '\n';
        std::fwrite(row.data(), 1, row.size(), stdout);
    }
}

int dump_tokens(const Options &opt, bool model_given) {
    if (!model_given && !std::filesystem::exists(opt.model)) {
        fmt::print(stderr,
                   "ds4: model file {} not found (the default -m); --dump-tokens needs only a "
                   "vocabulary: pass -m models/ds4-vocab.gguf\n",
                   opt.model);
        return 1;
    }
    const auto tok = ds4::tokenizer::Tokenizer::from_gguf(opt.model);
    const std::string text =
        opt.prompt_file.empty() ? opt.prompt : read_file_bytes(opt.prompt_file);
    print_tokens(tok, tok.encode_chat_text(text));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options opt;
    CLI::App app{
        "ds4: DeepSeek V4 Flash inference (ds4cpp).\n"
        "Only --dump-tokens is available in this build; generation needs the inference engine, "
        "which is not built yet.",
        "ds4"};
    auto *prompt = app.add_option("-p,--prompt", opt.prompt, "Prompt text");
    auto *prompt_file =
        app.add_option("--prompt-file", opt.prompt_file, "Read the whole file as the prompt");
    app.add_option("--system", opt.system,
                   "System text, also spelled -sys; an empty string disables it (generation only)")
        ->default_str(opt.system);
    auto *model = app.add_option("-m,--model", opt.model, "GGUF path (a model or a vocabulary)")
                      ->default_str(kDefaultModel);
    app.add_option("-c,--ctx", opt.ctx, "Context size in tokens (generation only)")
        ->check(CLI::PositiveNumber)
        ->default_str("32768");
    app.add_flag("--think", opt.think, "Thinking mode, the default (generation only)");
    app.add_flag("--think-max", opt.think_max,
                 "Think Max when --ctx >= 393216, else --think (generation only)");
    app.add_flag("--nothink", opt.nothink, "Non-thinking mode (generation only)");
    app.add_flag("--dump-tokens", opt.dump_tokens,
                 "Print the tokens of the prompt text as written (special tokens recognised, no "
                 "chat template) and exit; needs no weights");
    for (auto *o : {prompt, prompt_file, model}) {
        o->multi_option_policy(CLI::MultiOptionPolicy::Throw);
    }

    try {
        std::vector<std::string> args = normalized_args(argc, argv);
        app.parse(args);
    } catch (const CLI::ParseError &e) {
        const int rc = app.exit(e);
        return e.get_exit_code() == 0 ? rc : 2;
    }
    if (prompt->count() + prompt_file->count() > 1) {
        fmt::print(stderr, "ds4: specify only one prompt source\n");
        return 2;
    }
    try {
        if (opt.dump_tokens) {
            if (prompt->count() + prompt_file->count() == 0) {
                fmt::print(stderr, "ds4: --dump-tokens requires -p or --prompt-file\n");
                return 2;
            }
            return dump_tokens(opt, model->count() > 0);
        }
    } catch (const ds4::Error &e) {
        fmt::print(stderr, "ds4: {}\n", e.what());
        return 1;
    }
    fmt::print(stderr,
               "ds4: generation needs the inference engine, which is not built yet; only "
               "--dump-tokens works in this build (see --help)\n");
    return 2;
}
