// ds4-test: the engine's checks that need a whole model (docs/SURFACES.md 4.1, our modes): official
// vectors, self-consistency of prefill/decode and snapshots, transformers parity, and the modes
// of capabilities still to come. Modes run one by one (--prefill-decode ...) or all (--all, or no
// mode at all, as the reference's ds4_test). One line per check, then "N passed, N failed, N
// skipped"; exit 1 when a check failed, 2 on a usage error (docs/CLI.md). --backend cuda runs the
// modes' models on the CUDA device; --backend-parity compares that device with the CPU.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <map>

#include "backend_option.h"
#include "cli_app.h"
#include "exit_codes.h"
#include "input_files.h"
#include "modes.h"
#include "repo_paths.h"
#include "run_env.h"
#include "ssd_streaming_option.h"
#include "tool_main.h"

namespace {

std::string env_or(const char *name, const std::string &dflt) {
    const char *v = std::getenv(name);
    return v && *v ? std::string(v) : dflt;
}

int test_main(int argc, char **argv) {
    using namespace ds4::test;
    TestOptions opt;
    opt.model = env_or("DS4_TEST_MODEL", "");
    opt.vocab = ds4::tools::find_repo_file("models/ds4-vocab.gguf");
    opt.vector_file = env_or("DS4_TEST_VECTOR_FILE",
                             ds4::tools::find_repo_file("tests/test-vectors/official.vec"));
    opt.fixtures_dir = ds4::tools::find_repo_file("tests/model/fixtures");
    opt.fixtures_gguf_dir = env_or("DS4_PARITY_GGUF_DIR", "");

    CLI::App app{"ds4-test: official vectors, self-consistency and parity checks", "ds4-test"};
    ds4::tools::configure_app(app, "ds4-test");
    bool all = false, list = false;
    std::map<std::string, bool> chosen;
    app.add_flag("--all", all, "Run every mode (the default when no mode is given)");
    app.add_flag("--list", list, "List the modes and exit");
    for (const auto &m : all_modes()) app.add_flag("--" + m.name, chosen[m.name], m.help);
    app.add_option("-m,--model", opt.model,
                   "Weights for --logprob-vectors and --backend-parity (default: DS4_TEST_MODEL; "
                   "none: the continuation checks are skipped, --backend-parity takes "
                   "--consistency-model when given, else models/promessi-mini-q8_0.gguf)");
    app.add_option("--vocab", opt.vocab, "Vocabulary GGUF for the tokenization checks")
        ->capture_default_str();
    app.add_option("--vector-file", opt.vector_file, "official.vec (default: DS4_TEST_VECTOR_FILE)")
        ->capture_default_str();
    app.add_option("--case", opt.cases, "Only this vector case (repeatable)");
    app.add_flag("--known-mismatch-cases", opt.known_mismatch_cases,
                 "Also run the vector case the reference skips (long_memory_archive)");
    app.add_option("--consistency-model", opt.consistency_model,
                   "Model for --prefill-decode and --kv-roundtrip, and for --backend-parity "
                   "without -m (default: a tiny synthetic model written to a temporary folder; "
                   "--backend-parity then takes the shipped trained tiny model)");
    app.add_option("--fixtures-dir", opt.fixtures_dir, "transformers fixtures")
        ->capture_default_str();
    app.add_option("--fixtures-gguf-dir", opt.fixtures_gguf_dir,
                   "GGUFs from make_tiny_models.py --gguf-dir (default: DS4_PARITY_GGUF_DIR)");
    app.add_option("-t,--threads", opt.threads,
                   "CPU threads; 0 (the default) = DS4_THREADS when set, else all cores")
        ->check(ds4::tools::integer_in(0, ds4::tools::kMaxThreads));
    ds4::tools::BackendFlags backend;
    ds4::tools::add_backend_options(app, backend);
    ds4::tools::SsdStreamingFlags ssd;
    ds4::tools::add_ssd_streaming_options(app, ssd);
    std::string prompt_text, prompt_file;
    auto *prompt = app.add_option("-p,--prompt", prompt_text,
                                  "Prompt of --backend-parity (default: its own text of about 250 "
                                  "tokens), rendered as ds4 --nothink renders it");
    auto *prompt_path = app.add_option("--prompt-file", prompt_file,
                                       "Read the whole file as the prompt of --backend-parity");
    for (auto *o : {prompt, prompt_path}) o->multi_option_policy(CLI::MultiOptionPolicy::Throw);
    app.add_option("-n,--tokens", opt.parity_steps, "Greedy decode steps of --backend-parity")
        ->check(ds4::tools::integer_in(0, 1 << 20))
        ->capture_default_str();
    app.add_option("--parity-bound", opt.parity_bound,
                   "--backend-parity: largest max |cpu - cuda| / max |cpu| of the logits allowed "
                   "at any step")
        ->check(ds4::tools::number_in(0, 1e9))
        ->default_str("0.001");
    if (const auto rc = ds4::tools::parse_args(app, argc, argv)) return *rc;
    if (prompt->count() + prompt_path->count() > 1)
        throw ds4::tools::UsageError("specify only one prompt source");
    opt.backend = backend.backend();
    opt.gpus = backend.placement().gpus;
    opt.layer_starts = backend.placement().layer_starts;
    opt.split = backend.placement().split;
    opt.streaming = ssd.options(opt.backend, opt.model);
    opt.streaming.popularity_file.clear();  // per model, in TestEnv::load_model
    if (ssd.cache_dir_opt->count() > 0) opt.streaming_cache_dir = ssd.cache_dir;
    if (list) {
        for (const auto &m : all_modes()) fmt::print("--{:<30} {}\n", m.name, m.help);
        return 0;
    }
    // The environment is checked before any mode runs.
    opt.threads = ds4::tools::resolve_threads(opt.threads, "ds4-test");
    ds4::tools::check_simd_env();
    bool any = false;
    for (const auto &[name, on] : chosen) {
        any = any || on;
        if (on) opt.named_modes.insert(name);
    }
    // Inputs are read before any mode runs: a wrong path fails at once.
    if (prompt->count()) opt.prompt = prompt_text;
    if (prompt_path->count())
        opt.prompt = ds4::tools::read_input_file(prompt_file, "--prompt-file");

    TestEnv env(opt);
    // A backend that cannot start here ends the run with its one line (exit 1) before any mode,
    // rather than as a failed check in every mode.
    if (opt.backend == ds4::runtime::Backend::Cuda) (void)env.consistency_model();
    Report rep;
    for (const auto &m : all_modes())
        if (all || !any || chosen[m.name]) m.run(env, rep);
    rep.print_summary();
    // The report is on stdout; a failed run also says so where every tool reports failure.
    if (rep.failed() > 0)
        fmt::print(stderr, "ds4-test: {} of {} checks failed (see the report above)\n",
                   rep.failed(), rep.passed() + rep.failed());
    return rep.failed() > 0 ? ds4::tools::kExitFailure : ds4::tools::kExitOk;
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main("ds4-test", [&] { return test_main(argc, argv); });
}
