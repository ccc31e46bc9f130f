// ds4-test: the engine's checks that need a whole model (docs/SURFACES.md 4.1, our modes): official
// vectors, self-consistency of prefill/decode and snapshots, transformers parity, and the modes
// of capabilities still to come. Modes run one by one (--prefill-decode ...) or all (--all, or no
// mode at all, as the reference's ds4_test). One line per check, then "N passed, N failed, N
// skipped"; exit 1 when a check failed, 2 on a usage error.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <map>

#include "modes.h"
#include "repo_paths.h"

namespace {

std::string env_or(const char *name, const std::string &dflt) {
    const char *v = std::getenv(name);
    return v && *v ? std::string(v) : dflt;
}

}  // namespace

int main(int argc, char **argv) {
    using namespace ds4::test;
    TestOptions opt;
    opt.model = env_or("DS4_TEST_MODEL", "");
    opt.vocab = ds4::tools::find_repo_file("models/ds4-vocab.gguf");
    opt.vector_file = env_or("DS4_TEST_VECTOR_FILE",
                             ds4::tools::find_repo_file("tests/test-vectors/official.vec"));
    opt.fixtures_dir = ds4::tools::find_repo_file("tests/model/fixtures");
    opt.fixtures_gguf_dir = env_or("DS4_PARITY_GGUF_DIR", "");
    opt.threads = std::atoi(env_or("DS4_THREADS", "0").c_str());

    CLI::App app{"ds4-test: official vectors, self-consistency and parity checks", "ds4-test"};
    bool all = false, list = false;
    std::map<std::string, bool> chosen;
    app.add_flag("--all", all, "Run every mode (the default when no mode is given)");
    app.add_flag("--list", list, "List the modes and exit");
    for (const auto &m : all_modes()) app.add_flag("--" + m.name, chosen[m.name], m.help);
    app.add_option("-m,--model", opt.model,
                   "Weights for --logprob-vectors (default: DS4_TEST_MODEL; none: those checks "
                   "are skipped)");
    app.add_option("--vocab", opt.vocab, "Vocabulary GGUF for the tokenization checks")
        ->capture_default_str();
    app.add_option("--vector-file", opt.vector_file, "official.vec (default: DS4_TEST_VECTOR_FILE)")
        ->capture_default_str();
    app.add_option("--case", opt.cases, "Only this vector case (repeatable)");
    app.add_flag("--known-mismatch-cases", opt.known_mismatch_cases,
                 "Also run the vector case the reference skips (long_memory_archive)");
    app.add_option("--consistency-model", opt.consistency_model,
                   "Model for --prefill-decode and --kv-roundtrip (default: a tiny synthetic "
                   "model written to a temporary folder)");
    app.add_option("--fixtures-dir", opt.fixtures_dir, "transformers fixtures")
        ->capture_default_str();
    app.add_option("--fixtures-gguf-dir", opt.fixtures_gguf_dir,
                   "GGUFs from make_tiny_models.py --gguf-dir (default: DS4_PARITY_GGUF_DIR)");
    app.add_option("-t,--threads", opt.threads, "CPU threads (default: DS4_THREADS or all cores)")
        ->check(CLI::NonNegativeNumber);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        const int rc = app.exit(e);
        return e.get_exit_code() == 0 ? rc : 2;
    }
    if (list) {
        for (const auto &m : all_modes()) fmt::print("--{:<30} {}\n", m.name, m.help);
        return 0;
    }
    bool any = false;
    for (const auto &[name, on] : chosen) any = any || on;

    TestEnv env(opt);
    Report rep;
    for (const auto &m : all_modes())
        if (all || !any || chosen[m.name]) m.run(env, rep);
    rep.print_summary();
    return rep.failed() > 0 ? 1 : 0;
}
