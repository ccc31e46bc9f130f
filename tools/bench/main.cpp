// ds4-bench: throughput at context frontiers, the reference's method (docs/SURFACES.md 5.1), with
// latency percentiles, peak memory, a hash of the generated tokens, medians over --runs, and a
// release gate against a baseline CSV (--baseline FILE --max-regress PCT: exit 1 on a regression or
// on different tokens). The method lives in frontier_bench.h; this file is flags, prompt and
// output.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "backend_option.h"
#include "cli_app.h"
#include "common/error.h"
#include "csv_file.h"
#include "exit_codes.h"
#include "frontier_bench.h"
#include "frontiers.h"
#include "input_files.h"
#include "memory_check.h"
#include "model_load.h"
#include "regression_gate.h"
#include "run_env.h"
#include "runtime/session.h"
#include "ssd_streaming_option.h"
#include "startup_line.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocabulary.h"
#include "tool_main.h"

namespace {

using ds4::tools::UsageError;

struct Options {
    std::string model = "ds4flash.gguf", prompt_file, chat_prompt_file, csv, baseline;
    // The reference bench's default system text has a final period, unlike the CLI's.
    std::string system = "You are a helpful assistant.";
    int threads = 0;
    ds4::runtime::Backend backend = ds4::runtime::Backend::Cpu;
    ds4::tools::LayerPlacement placement;           // --gpus, --layer-split
    ds4::runtime::StreamingModelOptions streaming;  // --ssd-streaming*
    uint32_t ctx_start = 2048, ctx_max = 32768, ctx_alloc = 0, step_incr = 2048, gen_tokens = 128;
    uint32_t chunk = 0, runs = 1;  // chunk 0: the backend's (runtime::default_chunk)
    double step_mul = 1, max_regress = 5;
    bool warm_weights = false;
};

// The reference spells the system flag "-sys", which CLI11 cannot declare; renamed before parsing.
std::vector<std::string> normalized_args(int argc, char **argv) {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes the arguments in reverse order
        std::string a = argv[i];
        args.push_back(a == "-sys" ? "--system" : a);
    }
    return args;
}

// Reads one byte of every page of the mapped model, so page faults of the first touch are not
// charged to the first frontier.
void warm_weights(const ds4::gguf::File &f) {
    volatile unsigned char sink = 0;
    for (uint64_t off = 0; off < f.file_size(); off += 4096) sink = sink + f.base()[off];
    (void)sink;
}

// A defect of the model file, of an input or of the arguments is bad input (exit 2); a backend
// that cannot start (no CUDA, no device) is a runtime failure (exit 1).
template <typename F>
auto as_usage_error(F &&f) {
    try {
        return f();
    } catch (const ds4::tools::BackendError &) {
        throw;
    } catch (const ds4::Error &e) {
        throw UsageError(e.what());
    }
}

int run(const Options &opt) {
    std::error_code ec;
    if (!std::filesystem::exists(opt.model, ec))
        throw UsageError(
            fmt::format("model {} not found (-m FILE; a synthetic one: ds4-mkmodel "
                        "--shape tiny --out tiny.gguf)",
                        opt.model));
    if (std::filesystem::is_directory(opt.model, ec))
        throw UsageError(fmt::format("model {} is a directory, not a GGUF file", opt.model));
    // The frontier list is counted before it is built: a tiny step over a huge range would take
    // all memory, and no run could measure that many frontiers anyway.
    constexpr uint64_t kMaxFrontiers = 100000;
    uint64_t n_frontiers = 0;
    for (uint64_t cur = opt.ctx_start; cur < opt.ctx_max && n_frontiers <= kMaxFrontiers;
         ++n_frontiers)
        cur = std::max<uint64_t>(opt.step_mul > 1 ? uint64_t(std::ceil(double(cur) * opt.step_mul))
                                                  : cur + opt.step_incr,
                                 cur + 1);
    if (n_frontiers > kMaxFrontiers)
        throw UsageError(fmt::format(
            "--ctx-start {} to --ctx-max {} in these steps gives more than {} frontiers; take "
            "larger steps",
            opt.ctx_start, opt.ctx_max, kMaxFrontiers));
    const auto frontiers = as_usage_error([&] {
        return ds4::bench::bench_frontiers(opt.ctx_start, opt.ctx_max, opt.step_incr, opt.step_mul);
    });
    const uint64_t needed = uint64_t(opt.ctx_max) + opt.gen_tokens;
    if (!opt.ctx_alloc && needed + 1 > std::numeric_limits<uint32_t>::max())
        throw UsageError(
            fmt::format("--ctx-max + --gen-tokens = {} is more than a session holds", needed));
    const uint32_t ctx_alloc = opt.ctx_alloc ? opt.ctx_alloc : uint32_t(needed + 1);
    if (ctx_alloc <= needed)
        throw UsageError(fmt::format("--ctx-alloc {} must exceed --ctx-max + --gen-tokens = {}",
                                     ctx_alloc, needed));
    // Inputs are read and the output checked before the model loads: a wrong path fails at once.
    ds4::bench::CsvTable baseline;
    if (!opt.baseline.empty())
        baseline = as_usage_error([&] { return ds4::bench::read_csv_file(opt.baseline); });
    const bool chat = !opt.chat_prompt_file.empty();
    const std::string text =
        chat ? ds4::tools::read_input_file(opt.chat_prompt_file, "--chat-prompt-file")
             : ds4::tools::read_input_file(opt.prompt_file, "--prompt-file");
    if (!opt.csv.empty()) ds4::tools::check_output_writable(opt.csv, "--csv");

    auto model = as_usage_error([&] {
        return ds4::tools::load_model("ds4-bench", opt.model,
                                      {.n_threads = opt.threads,
                                       .backend = opt.backend,
                                       .streaming = opt.streaming,
                                       .layer_starts = opt.placement.layer_starts,
                                       .gpus = opt.placement.gpus,
                                       .plan_ctx = std::max(opt.ctx_max, opt.ctx_alloc),
                                       .split = opt.placement.split});
    });
    fmt::print(stderr, "{}", ds4::tools::startup_line("ds4-bench", opt.model, *model));
    ds4::tools::print_ssd_streaming_startup("ds4-bench", *model);
    const ds4::tools::SsdStreamingAtExit ssd_report("ds4-bench", *model);
    const ds4::tokenizer::Tokenizer tok = as_usage_error(
        [&] { return ds4::tokenizer::Tokenizer(ds4::tokenizer::load_vocabulary(model->file())); });
    // --prompt-file is raw text, plain BPE; --chat-prompt-file one non-thinking user turn.
    const std::vector<int32_t> prompt =
        chat ? ds4::tokenizer::encode_cli_prompt(tok, text, opt.system,
                                                 ds4::tokenizer::ThinkMode::kNone)
             : tok.encode(text);
    if (prompt.size() < opt.ctx_max)
        throw UsageError(
            fmt::format("the prompt has {} tokens; --ctx-max {} needs at least that "
                        "many (use a longer text or a lower --ctx-max)",
                        prompt.size(), opt.ctx_max));
    const ds4::runtime::SessionOptions session{.ctx = ctx_alloc, .chunk = opt.chunk};
    ds4::tools::check_memory_fits(ds4::runtime::Session::kv_bytes_for(model->hparams(), session),
                                  fmt::format("the KV cache of --ctx-alloc {}", ctx_alloc),
                                  "lower --ctx-max or --ctx-alloc");
    std::string fl;
    for (uint32_t f : frontiers) fl += fmt::format("{}{}", fl.empty() ? "" : ",", f);
    fmt::print(stderr,
               "ds4-bench: {} | {} prompt tokens | frontiers {} | {} gen tokens | ctx-alloc {} | "
               "chunk {} | {} run(s) | backend {}\n",
               opt.model, prompt.size(), fl, opt.gen_tokens, ctx_alloc,
               opt.chunk ? opt.chunk : ds4::runtime::default_chunk(model->backend()), opt.runs,
               ds4::runtime::backend_name(model->backend()));
    if (opt.warm_weights) warm_weights(model->file());

    ds4::bench::PassParams params{
        .session = session, .gen_tokens = opt.gen_tokens, .eos = tok.specials().eos};
    std::vector<std::vector<ds4::bench::FrontierSample>> runs;
    for (uint32_t r = 0; r < opt.runs; ++r)
        runs.push_back(ds4::bench::run_frontier_pass(
            *model, params, prompt, frontiers, [&](const ds4::bench::FrontierSample &s) {
                fmt::print(stderr,
                           "ds4-bench: run {}/{} ctx {}: prefill {} tokens {:.2f} t/s, gen {} "
                           "tokens {:.2f} t/s (p50 {:.3f} ms, p95 {:.3f} ms)\n",
                           r + 1, opt.runs, s.ctx_tokens, s.prefill_tokens, s.prefill_tps(),
                           s.gen_tokens, s.gen_tps(), s.p50_ms, s.p95_ms);
            }));
    const auto table = ds4::bench::median_rows(runs);
    const std::string csv = ds4::bench::format_csv(table);
    if (opt.csv.empty()) {
        std::fwrite(csv.data(), 1, csv.size(), stdout);
        std::fflush(stdout);
    } else {
        ds4::bench::write_text_file(opt.csv, csv);
    }

    if (opt.baseline.empty()) return 0;
    const auto gate = ds4::bench::check_regression(table, baseline, opt.max_regress);
    for (const auto &line : gate.lines) fmt::print(stderr, "ds4-bench: gate: {}\n", line);
    fmt::print(stderr,
               "ds4-bench: gate {} against {} (max regression {}%, {} comparisons, {} failed)\n",
               gate.passed() ? "passed" : "FAILED", opt.baseline, opt.max_regress, gate.comparisons,
               gate.failures);
    return gate.passed() ? 0 : 1;
}

int bench_main(int argc, char **argv) {
    using ds4::tools::integer_in;
    using ds4::tools::number_in;
    constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
    Options opt;
    ds4::tools::BackendFlags backend;
    bool use_metal = false;
    CLI::App app{"ds4-bench: prefill and generation speed at context frontiers (CSV)", "ds4-bench"};
    ds4::tools::configure_app(app, "ds4-bench");
    auto *pf = app.add_option("--prompt-file", opt.prompt_file, "Raw text, plain BPE");
    auto *cpf = app.add_option("--chat-prompt-file", opt.chat_prompt_file,
                               "Text rendered as one non-thinking chat user message");
    app.add_option("--system", opt.system, "System text of --chat-prompt-file (also -sys)")
        ->capture_default_str();
    app.add_option("-m,--model", opt.model, "GGUF model")->capture_default_str();
    ds4::tools::add_backend_options(app, backend);
    ds4::tools::SsdStreamingFlags ssd;
    ds4::tools::add_ssd_streaming_options(app, ssd);
    app.add_flag("--metal", use_metal, "Metal backend (not part of ds4cpp: exits 2)");
    app.add_option("-t,--threads", opt.threads,
                   "CPU threads; 0 (the default) = DS4_THREADS when set, else all cores")
        ->check(integer_in(0, ds4::tools::kMaxThreads));
    app.add_flag("--warm-weights", opt.warm_weights, "Touch every page of the model first");
    app.add_option("--ctx-start", opt.ctx_start, "First frontier")
        ->check(integer_in(1, kMaxU32))
        ->capture_default_str();
    app.add_option("--ctx-max", opt.ctx_max, "Last frontier")
        ->check(integer_in(1, kMaxU32))
        ->capture_default_str();
    app.add_option("--ctx-alloc", opt.ctx_alloc,
                   "Context allocated (default: ctx-max + gen-tokens + 1)")
        ->check(integer_in(1, kMaxU32));
    app.add_option("--step-incr", opt.step_incr, "Frontier step when --step-mul is 1")
        ->check(integer_in(1, kMaxU32))
        ->capture_default_str();
    app.add_option("--step-mul", opt.step_mul, "Frontier multiplier (>= 1)")
        ->check(number_in(1, 1e6))
        ->capture_default_str();
    app.add_option("-n,--gen-tokens,--tokens", opt.gen_tokens, "Greedy tokens at each frontier")
        ->check(integer_in(1, kMaxU32))
        ->capture_default_str();
    app.add_option("--chunk", opt.chunk,
                   "Prefill batch size (the CUDA backend takes at most 65535)")
        ->check(integer_in(1, 1 << 20))
        ->default_str("256 on the CPU, 1024 with CUDA");
    app.add_option("--runs", opt.runs, "Runs in this process; rows report the medians")
        ->check(integer_in(1, 10000))
        ->capture_default_str();
    app.add_option("--csv", opt.csv, "Write the CSV here (default: stdout)");
    app.add_option("--baseline", opt.baseline,
                   "Baseline CSV: exit 1 when a median is more than --max-regress percent slower "
                   "or the generated tokens differ");
    app.add_option("--max-regress", opt.max_regress, "Allowed slowdown against --baseline, percent")
        ->check(number_in(0, 1e9))
        ->capture_default_str();
    if (const auto rc = ds4::tools::parse_args(app, normalized_args(argc, argv))) return *rc;
    if (pf->count() + cpf->count() != 1)
        throw UsageError("give exactly one of --prompt-file and --chat-prompt-file");
    if (use_metal)
        throw UsageError("the metal backend is not part of ds4cpp; use --backend cpu or cuda");
    opt.backend = backend.backend();
    opt.placement = backend.placement();
    opt.streaming = ssd.options(opt.backend, opt.model);
    if (opt.streaming.enabled && opt.warm_weights)
        throw UsageError(
            "--warm-weights touches every page of the model, its routed experts included: it "
            "cannot be combined with --ssd-streaming");
    // The environment is checked here, before any file is opened.
    opt.threads = ds4::tools::resolve_threads(opt.threads, "ds4-bench");
    ds4::tools::check_simd_env();
    return run(opt);
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main("ds4-bench", [&] { return bench_main(argc, argv); });
}
