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
#include <limits>
#include <string>
#include <vector>

#include "backend_option.h"
#include "cli_app.h"
#include "cli_options.h"
#include "common/error.h"
#include "context_size.h"
#include "exit_codes.h"
#include "input_files.h"
#include "logprobs_dump.h"
#include "model/model_summary.h"
#include "model_load.h"
#include "repl.h"
#include "run_env.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "speed_line.h"
#include "ssd_streaming_option.h"
#include "startup_line.h"
#include "text_printer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocabulary.h"
#include "tool_main.h"

namespace {

using ds4::cli::Options;
using ds4::tools::UsageError;

// --dump-logprobs alternatives per step: larger requests are capped, as the reference does.
constexpr int kMaxLogprobsTopK = 128;

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

// What main checked from the command line, for run().
struct Request {
    bool model_given = false, dump_tokens = false, inspect = false, has_prompt = false;
    bool ctx_given = false;
    uint64_t ctx = 32768;  // as asked; run() clamps it (context_size.h)
};

int run(Options opt, const Request &req) {
    std::error_code ec;
    if (!std::filesystem::exists(opt.model, ec)) {
        if (ec && ec != std::errc::no_such_file_or_directory)
            throw UsageError(fmt::format("cannot open model {}: {}", opt.model, ec.message()));
        if (req.model_given)
            throw UsageError(fmt::format("cannot open model {}: no such file", opt.model));
        fmt::print(stderr, "ds4: {}\n", missing_model_message(opt.model));
        return ds4::tools::kExitFailure;
    }
    // Inputs are read and outputs checked before the model loads: a wrong path fails at once.
    const std::string text = opt.prompt_file.empty()
                                 ? opt.prompt
                                 : ds4::tools::read_input_file(opt.prompt_file, "--prompt-file");
    if (!opt.dump_logprobs.empty())
        ds4::tools::check_output_writable(opt.dump_logprobs, "--dump-logprobs");
    if (req.dump_tokens) {
        const auto tok = ds4::tools::from_model_file(
            opt.model, [&] { return ds4::tokenizer::Tokenizer::from_gguf(opt.model); });
        print_tokens(tok, tok.encode_chat_text(text));
        return 0;
    }

    auto model = ds4::tools::from_model_file(opt.model, [&] {
        return ds4::tools::load_model("ds4", opt.model,
                                      {.n_threads = opt.threads,
                                       .strict = opt.strict,
                                       .backend = opt.backend,
                                       .streaming = opt.streaming,
                                       .layer_starts = opt.layer_starts,
                                       .gpus = opt.gpus,
                                       .plan_ctx = opt.ctx,
                                       .split = opt.split});
    });
    fmt::print(stderr, "{}", ds4::tools::startup_line("ds4", opt.model, *model));
    ds4::tools::print_ssd_streaming_startup("ds4", *model);
    const ds4::tools::SsdStreamingAtExit ssd_report("ds4", *model);
    if (req.inspect) {
        std::fputs(
            ds4::model::inspect_report(opt.model, model->hparams(), model->weights()).c_str(),
            stdout);
        if (opt.strict) std::puts("  strict: the published DeepSeek V4 Flash layout");
        return 0;
    }
    const ds4::tokenizer::Tokenizer tok = ds4::tools::from_model_file(opt.model, [&] {
        return ds4::tokenizer::Tokenizer(ds4::tokenizer::load_vocabulary(model->file()));
    });
    if (tok.n_tokens() > model->hparams().n_vocab)
        throw UsageError(
            fmt::format("the vocabulary has {} tokens but the model only {} embedding rows",
                        tok.n_tokens(), model->hparams().n_vocab));
    const auto &hp = model->hparams();

    ds4::runtime::SessionOptions so{.chunk = opt.chunk};
    so.forward.qat_sim = opt.qat_sim;
    // Clamped to the model and checked against the free memory before anything is allocated;
    // the default is clamped without a notice, since nobody asked for it.
    const uint64_t asked = req.ctx_given || !hp.context_length
                               ? req.ctx
                               : std::min<uint64_t>(req.ctx, hp.context_length);
    opt.ctx = ds4::tools::context_for(asked, hp, so, "--ctx");
    so.ctx = opt.ctx;
    {
        ds4::runtime::Session probe(*model, so);
        // The check above used the computed size; the allocation must be that size.
        const uint64_t computed = ds4::runtime::Session::kv_bytes_for(*model, so);
        if (probe.kv_bytes() != computed)
            throw ds4::Error(fmt::format("internal: KV cache of {} bytes, {} computed beforehand",
                                         probe.kv_bytes(), computed));
        uint64_t comp_rows = 0;
        for (uint32_t il = 0; il < hp.n_layer; ++il)
            if (hp.compress_ratio[il]) comp_rows += opt.ctx / hp.compress_ratio[il] + 1;
        fmt::print(stderr,
                   "ds4: context buffers {:.2f} MiB, {} bytes (ctx={}, backend={}, "
                   "prefill_chunk={}, raw_kv_rows={}, compressed_kv_rows={})\n",
                   probe.kv_bytes() / 1048576.0, probe.kv_bytes(), opt.ctx,
                   ds4::runtime::backend_name(model->backend()), probe.chunk(), hp.sliding_window,
                   comp_rows);
    }
    if (!req.has_prompt) return ds4::cli::run_repl(*model, tok, opt);

    const auto mode = ds4::tokenizer::effective_think_mode(opt.think, opt.ctx);
    if (opt.think == ds4::tokenizer::ThinkMode::kMax && mode != opt.think)
        fmt::print(stderr, "ds4: --think-max needs --ctx >= {}; using normal thinking\n",
                   ds4::tokenizer::kThinkMaxMinContext);
    const std::vector<int32_t> prompt =
        ds4::tokenizer::encode_cli_prompt(tok, text, opt.system, mode);
    if (prompt.size() >= opt.ctx)
        throw UsageError(fmt::format("the prompt has {} tokens, the context holds {} (raise --ctx)",
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
    fmt::print(stderr, "{}", ds4::tools::speed_line(st));
    if (st.stop == ds4::runtime::StopReason::ContextFull)
        fmt::print(stderr,
                   "ds4: the context is full ({} tokens); raise --ctx for a longer answer\n",
                   opt.ctx);
    return st.stop == ds4::runtime::StopReason::Interrupted ? ds4::tools::kExitInterrupted : 0;
}

int ds4_main(int argc, char **argv) {
    using ds4::tools::integer_at_least;
    using ds4::tools::integer_in;
    using ds4::tools::number_in;
    constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
    Options opt;
    Request req;
    bool think = false, nothink = false, think_max = false, no_qat = false;
    ds4::tools::BackendFlags backend;
    uint64_t seed = 0;
    CLI::App app{"ds4: DeepSeek V4 Flash inference (ds4cpp). With no prompt: interactive chat.",
                 "ds4"};
    ds4::tools::configure_app(app, "ds4");
    auto *prompt = app.add_option("-p,--prompt", opt.prompt, "Prompt text");
    auto *prompt_file =
        app.add_option("--prompt-file", opt.prompt_file, "Read the whole file as the prompt");
    app.add_option("--system", opt.system,
                   "System text, also spelled -sys; an empty string disables it")
        ->default_str(opt.system);
    auto *model =
        app.add_option("-m,--model", opt.model, "GGUF model path")->default_str("ds4flash.gguf");
    auto *ctx = app.add_option("-c,--ctx", req.ctx,
                               "Context size in tokens; above the model's context length it is "
                               "clamped to it (with a notice)")
                    ->check(integer_at_least(1))
                    ->default_str("32768");
    app.add_option("-n,--tokens", opt.n_predict, "Max generated tokens")
        ->check(integer_in(1, std::numeric_limits<int64_t>::max()))
        ->default_str("50000");
    app.add_option("--temp", opt.sampling.temperature, "Temperature; 0 = greedy")
        ->check(number_in(0.0, 100.0))
        ->default_str("1");
    app.add_option("--top-p", opt.sampling.top_p, "Nucleus sampling")
        ->check(number_in(0.0, 1.0))
        ->default_str("1");
    app.add_option("--min-p", opt.sampling.min_p, "Min-p relative to the top token")
        ->check(number_in(0.0, 1.0))
        ->default_str("0.05");
    app.add_option("--top-k", opt.sampling.top_k, "Top-k; 0 = off")
        ->check(integer_in(0, kMaxInt))
        ->default_str("0");
    app.add_option("--seed", seed, "RNG seed (>= 1); default from the clock")
        ->check(integer_at_least(1));
    app.add_flag("--think", think, "Thinking mode (the default)");
    app.add_flag("--think-max", think_max, "Think Max when --ctx >= 393216, else normal thinking");
    app.add_flag("--nothink", nothink,
                 "Non-thinking mode (the assistant turn opens with </think>)");
    app.add_option("-t,--threads", opt.threads,
                   "CPU threads; 0 (the default) = DS4_THREADS when set, else all cores")
        ->check(integer_in(0, ds4::tools::kMaxThreads));
    ds4::tools::add_backend_options(app, backend);
    ds4::tools::SsdStreamingFlags ssd;
    ds4::tools::add_ssd_streaming_options(app, ssd);
    app.add_option("--chunk", opt.chunk,
                   "Prefill batch size in tokens (the CUDA backend takes at most 65535)")
        ->check(integer_in(1, 1 << 20))
        ->default_str("256 on the CPU, 1024 with CUDA");
    app.add_flag("--no-qat-sim", no_qat,
                 "Do not simulate the model's FP8 KV / FP4 indexer quantization (for comparisons "
                 "with references "
                 "that omit it, e.g. transformers)");
    app.add_flag("--strict", opt.strict,
                 "Require the published DeepSeek V4 Flash layout (q2, q4 or mixed)");
    app.add_flag("--inspect", req.inspect,
                 "Load the model, print a summary and exit (2 on a bad file)");
    app.add_flag("--dump-tokens", req.dump_tokens,
                 "Print the tokens of the prompt text as written (special tokens recognised, no "
                 "chat template) and "
                 "exit; needs only a vocabulary (e.g. -m models/ds4-vocab.gguf)");
    app.add_option("--dump-logprobs", opt.dump_logprobs,
                   "Write a greedy continuation with top-k alternatives as JSON");
    app.add_option("--logprobs-top-k", opt.logprobs_top_k,
                   "Alternatives per step for --dump-logprobs (larger values are capped at 128)")
        ->check(integer_in(1, 1 << 30))
        ->default_str("20");
    for (auto *o : {prompt, prompt_file, model})
        o->multi_option_policy(CLI::MultiOptionPolicy::Throw);

    if (const auto rc = ds4::tools::parse_args(app, normalized_args(argc, argv))) return *rc;
    if (prompt->count() + prompt_file->count() > 1)
        throw UsageError("specify only one prompt source");
    if (think + nothink + think_max > 1)
        throw UsageError("--think, --think-max and --nothink are exclusive");
    opt.backend = backend.backend();
    opt.gpus = backend.placement().gpus;
    opt.layer_starts = backend.placement().layer_starts;
    opt.split = backend.placement().split;
    opt.streaming = ssd.options(opt.backend, opt.model);
    opt.think = nothink     ? ds4::tokenizer::ThinkMode::kNone
                : think_max ? ds4::tokenizer::ThinkMode::kMax
                            : ds4::tokenizer::ThinkMode::kHigh;
    opt.qat_sim = !no_qat;
    opt.sampling.seed = seed;
    if (!opt.dump_logprobs.empty()) opt.sampling.temperature = 0.0f;
    if (opt.logprobs_top_k > kMaxLogprobsTopK) {  // the reference caps it the same way
        fmt::print(stderr, "ds4: --logprobs-top-k {} capped at {}\n", opt.logprobs_top_k,
                   kMaxLogprobsTopK);
        opt.logprobs_top_k = kMaxLogprobsTopK;
    }
    // The environment is checked here, before any file is opened.
    opt.threads = ds4::tools::resolve_threads(opt.threads, "ds4");
    ds4::tools::check_simd_env();
    req.has_prompt = prompt->count() + prompt_file->count() > 0;
    req.model_given = model->count() > 0;
    req.ctx_given = ctx->count() > 0;
    if ((req.dump_tokens || !opt.dump_logprobs.empty()) && !req.has_prompt)
        throw UsageError(fmt::format("{} requires -p or --prompt-file",
                                     req.dump_tokens ? "--dump-tokens" : "--dump-logprobs"));
    return run(opt, req);
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main("ds4", [&] { return ds4_main(argc, argv); });
}
