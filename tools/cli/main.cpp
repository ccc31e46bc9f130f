// ds4: the command-line front end (docs/SURFACES.md section 2).
//
// Modes, in order of precedence: --dump-tokens (tokenizer only), --inspect (load and describe the
// model), --dump-logprobs (greedy continuation with alternatives, as JSON), one-shot generation
// (-p / --prompt-file), and the interactive chat (no prompt).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_options.h"
#include "common/error.h"
#include "logprobs_dump.h"
#include "model/model_summary.h"
#include "repl.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "text_printer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocabulary.h"

namespace {

using ds4::cli::Options;

std::atomic<bool> g_cancel{false};
void on_sigint(int) {
    g_cancel = true;
}

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

// docs/SURFACES.md 2.5: the ids as one line, then one line per token: the id right-aligned in six
// columns, two spaces, the raw bytes of the token.
void print_tokens(const ds4::tokenizer::Tokenizer &tok, const std::vector<int32_t> &ids) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? ", " : "", ids[i]);
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    for (int32_t id : ids) {
        std::string row = fmt::format("{:>6}  ", id);
        row.append(tok.token_bytes(id));
        row += '\n';
        std::fwrite(row.data(), 1, row.size(), stdout);
    }
}

std::string missing_model_message(const std::string &path) {
    return fmt::format(
        "model file {} not found. Pass -m FILE with one of:\n"
        "  - the published DeepSeek V4 Flash GGUF (q2 ~81 GiB or q4 ~153 GiB, as for the ds4 "
        "engine),\n"
        "  - a Hugging Face checkpoint converted with tools/convert/ds4-convert HF_DIR OUT.gguf "
        "--quant q8_0,\n"
        "  - a synthetic model: build/bin/ds4-mkmodel --shape tiny --quant q8_0 --out tiny.gguf\n"
        "    (random weights with the real vocabulary: it runs, but its text is noise).",
        path);
}

void print_progress(size_t done, size_t total) {
    if (total < 64) return;
    const bool tty = isatty(STDERR_FILENO);
    if (tty || done == total)
        fmt::print(stderr, "{}processing {} input tokens: {}/{} ({:.0f}%){}", tty ? "\r" : "",
                   total, done, total, 100.0 * done / total, done == total || !tty ? "\n" : "");
}

int run(const Options &opt, bool model_given, bool dump_tokens, bool inspect, bool has_prompt) {
    if (!std::filesystem::exists(opt.model)) {
        fmt::print(stderr, "ds4: {}\n",
                   model_given ? fmt::format("cannot open model {}: no such file", opt.model)
                               : missing_model_message(opt.model));
        return model_given ? 2 : 1;
    }
    if (dump_tokens) {
        const auto tok = ds4::tokenizer::Tokenizer::from_gguf(opt.model);
        const std::string text =
            opt.prompt_file.empty() ? opt.prompt : read_file_bytes(opt.prompt_file);
        print_tokens(tok, tok.encode_chat_text(text));
        return 0;
    }

    std::unique_ptr<ds4::runtime::Model> model;
    try {
        model =
            ds4::runtime::Model::load(opt.model, {.n_threads = opt.threads, .strict = opt.strict});
    } catch (const ds4::Error &e) {
        fmt::print(stderr, "ds4: {}\n", e.what());
        return 2;
    }
    if (inspect) {
        std::fputs(
            ds4::model::inspect_report(opt.model, model->hparams(), model->weights()).c_str(),
            stdout);
        if (opt.strict) std::puts("  strict: the published DeepSeek V4 Flash layout");
        return 0;
    }
    const ds4::tokenizer::Tokenizer tok(ds4::tokenizer::load_vocabulary(model->file()));
    if (tok.n_tokens() > model->hparams().n_vocab)
        throw ds4::Error(
            fmt::format("the vocabulary has {} tokens but the model only {} embedding rows",
                        tok.n_tokens(), model->hparams().n_vocab));
    const auto &hp = model->hparams();

    ds4::runtime::SessionOptions so{.ctx = opt.ctx, .chunk = opt.chunk};
    so.forward.qat_sim = opt.qat_sim;
    {
        ds4::runtime::Session probe(*model, so);
        uint64_t comp_rows = 0;
        for (uint32_t il = 0; il < hp.n_layer; ++il)
            if (hp.compress_ratio[il]) comp_rows += opt.ctx / hp.compress_ratio[il] + 1;
        fmt::print(stderr,
                   "ds4: context buffers {:.2f} MiB (ctx={}, backend=cpu, prefill_chunk={}, "
                   "raw_kv_rows={}, "
                   "compressed_kv_rows={})\n",
                   probe.kv_bytes() / 1048576.0, opt.ctx, opt.chunk, hp.sliding_window, comp_rows);
    }
    if (!has_prompt) return ds4::cli::run_repl(*model, tok, opt);

    const std::string text =
        opt.prompt_file.empty() ? opt.prompt : read_file_bytes(opt.prompt_file);
    const auto mode = ds4::tokenizer::effective_think_mode(opt.think, opt.ctx);
    if (opt.think == ds4::tokenizer::ThinkMode::kMax && mode != opt.think)
        fmt::print(stderr, "ds4: --think-max needs --ctx >= {}; using normal thinking\n",
                   ds4::tokenizer::kThinkMaxMinContext);
    const std::vector<int32_t> prompt =
        ds4::tokenizer::encode_cli_prompt(tok, text, opt.system, mode);
    if (prompt.size() >= opt.ctx)
        throw ds4::Error(fmt::format("the prompt has {} tokens, the context holds {} (raise --ctx)",
                                     prompt.size(), opt.ctx));

    ds4::runtime::Session session(*model, so);
    if (!opt.dump_logprobs.empty()) {
        ds4::cli::dump_logprobs(session, tok, prompt, opt.n_predict, opt.logprobs_top_k,
                                opt.dump_logprobs);
        return 0;
    }
    std::signal(SIGINT, on_sigint);
    // A pre-rendered transcript decides its own thinking state by its last special token.
    const bool pre_rendered = text.rfind(ds4::tokenizer::kBosText, 0) == 0;
    const bool in_reasoning = pre_rendered ? prompt.back() == tok.specials().think_open
                                           : ds4::tokenizer::thinking_enabled(mode);
    ds4::cli::TextPrinter printer(tok, in_reasoning, isatty(STDOUT_FILENO));
    ds4::runtime::Sampler sampler(opt.sampling);
    ds4::runtime::GenerateParams gp{
        .max_tokens = opt.n_predict, .stop_ids = {tok.specials().eos}, .cancel = &g_cancel};
    const auto st = ds4::runtime::generate(
        session, prompt, sampler, gp, [&](int32_t id) { printer.push(id); }, print_progress);
    printer.finish();
    fmt::print(stderr, "ds4: prefill: {:.2f} t/s, generation: {:.2f} t/s\n", st.prefill_tps(),
               st.generation_tps());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options opt;
    bool dump_tokens = false, inspect = false, think = false, nothink = false, think_max = false,
         no_qat = false;
    bool use_cpu = false, use_cuda = false;
    std::string backend = "cpu";
    uint64_t seed = 0;
    CLI::App app{"ds4: DeepSeek V4 Flash inference (ds4cpp). With no prompt: interactive chat.",
                 "ds4"};
    auto *prompt = app.add_option("-p,--prompt", opt.prompt, "Prompt text");
    auto *prompt_file =
        app.add_option("--prompt-file", opt.prompt_file, "Read the whole file as the prompt");
    app.add_option("--system", opt.system,
                   "System text, also spelled -sys; an empty string disables it")
        ->default_str(opt.system);
    auto *model =
        app.add_option("-m,--model", opt.model, "GGUF model path")->default_str("ds4flash.gguf");
    app.add_option("-c,--ctx", opt.ctx, "Context size in tokens")
        ->check(CLI::PositiveNumber)
        ->default_str("32768");
    app.add_option("-n,--tokens", opt.n_predict, "Max generated tokens")
        ->check(CLI::PositiveNumber)
        ->default_str("50000");
    app.add_option("--temp", opt.sampling.temperature, "Temperature; 0 = greedy")
        ->check(CLI::Range(0.0, 100.0))
        ->default_str("1");
    app.add_option("--top-p", opt.sampling.top_p, "Nucleus sampling")
        ->check(CLI::Range(0.0, 1.0))
        ->default_str("1");
    app.add_option("--min-p", opt.sampling.min_p, "Min-p relative to the top token")
        ->check(CLI::Range(0.0, 1.0))
        ->default_str("0.05");
    app.add_option("--top-k", opt.sampling.top_k, "Top-k; 0 = off")
        ->check(CLI::NonNegativeNumber)
        ->default_str("0");
    app.add_option("--seed", seed, "RNG seed (>= 1); default from the clock")
        ->check(CLI::PositiveNumber);
    app.add_flag("--think", think, "Thinking mode (the default)");
    app.add_flag("--think-max", think_max, "Think Max when --ctx >= 393216, else normal thinking");
    app.add_flag("--nothink", nothink,
                 "Non-thinking mode (the assistant turn opens with </think>)");
    app.add_option("-t,--threads", opt.threads, "CPU threads (default: DS4_THREADS or all cores)")
        ->check(CLI::PositiveNumber);
    app.add_flag("--cpu", use_cpu, "CPU backend (the default)");
    app.add_flag("--cuda", use_cuda, "CUDA backend (not part of this build yet: exits 2)");
    app.add_option("--backend", backend, "Backend by name: cpu | cuda (cuda: not built yet)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--chunk", opt.chunk, "Prefill batch size in tokens")
        ->check(CLI::PositiveNumber)
        ->default_str("256");
    app.add_flag("--no-qat-sim", no_qat,
                 "Do not simulate the model's FP8 KV / FP4 indexer quantization (for comparisons "
                 "with references "
                 "that omit it, e.g. transformers)");
    app.add_flag("--strict", opt.strict,
                 "Require the published DeepSeek V4 Flash layout (q2, q4 or mixed)");
    app.add_flag("--inspect", inspect,
                 "Load the model, print a summary and exit (2 on a bad file)");
    app.add_flag("--dump-tokens", dump_tokens,
                 "Print the tokens of the prompt text as written (special tokens recognised, no "
                 "chat template) and "
                 "exit; needs only a vocabulary (e.g. -m models/ds4-vocab.gguf)");
    app.add_option("--dump-logprobs", opt.dump_logprobs,
                   "Write a greedy continuation with top-k alternatives as JSON");
    app.add_option("--logprobs-top-k", opt.logprobs_top_k,
                   "Alternatives per step for --dump-logprobs (max 128)")
        ->check(CLI::Range(1, 128))
        ->default_str("20");
    for (auto *o : {prompt, prompt_file, model})
        o->multi_option_policy(CLI::MultiOptionPolicy::Throw);

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
    if (think + nothink + think_max > 1) {
        fmt::print(stderr, "ds4: --think, --think-max and --nothink are exclusive\n");
        return 2;
    }
    if (use_cuda || backend == "cuda") {
        fmt::print(stderr, "ds4: the CUDA backend is not part of this build yet; use --cpu\n");
        return 2;
    }
    (void)use_cpu;
    opt.think = nothink     ? ds4::tokenizer::ThinkMode::kNone
                : think_max ? ds4::tokenizer::ThinkMode::kMax
                            : ds4::tokenizer::ThinkMode::kHigh;
    opt.qat_sim = !no_qat;
    opt.sampling.seed = seed;
    if (!opt.dump_logprobs.empty()) opt.sampling.temperature = 0.0f;
    if (opt.threads == 0)
        if (const char *env = std::getenv("DS4_THREADS")) opt.threads = std::max(0, std::atoi(env));
    const bool has_prompt = prompt->count() + prompt_file->count() > 0;
    if ((dump_tokens || !opt.dump_logprobs.empty()) && !has_prompt) {
        fmt::print(stderr, "ds4: {} requires -p or --prompt-file\n",
                   dump_tokens ? "--dump-tokens" : "--dump-logprobs");
        return 2;
    }
    try {
        return run(opt, model->count() > 0, dump_tokens, inspect, has_prompt);
    } catch (const ds4::Error &e) {
        fmt::print(stderr, "ds4: {}\n", e.what());
        return 1;
    }
}
