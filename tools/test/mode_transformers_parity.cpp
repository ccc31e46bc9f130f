// --transformers-parity: every model of the committed fixtures (tests/model/fixtures/<model>/,
// expected logits from transformers' DeepseekV4ForCausalLM) against its f32 GGUF. Small GGUFs are
// committed beside the fixtures; the others are rebuilt by
// `python3 tests/model/make_tiny_models.py --gguf-dir DIR` and found with --fixtures-gguf-dir DIR
// (or DS4_PARITY_GGUF_DIR, as for the unit test). A model without a GGUF is skipped, saying how
// to make it.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "modes.h"
#include "transformers_parity.h"

namespace ds4::test {

namespace {

constexpr const char *kMode = "transformers-parity";
namespace fs = std::filesystem;

}  // namespace

void run_transformers_parity(TestEnv &env, Report &rep) {
    const fs::path dir = env.opts().fixtures_dir;
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto &e : fs::directory_iterator(dir, ec))
        if (fs::exists(e.path() / "index.json")) names.push_back(e.path().filename().string());
    if (names.empty()) {
        rep.fail(kMode, fmt::format("no fixtures (<model>/index.json) under {}", dir.string()));
        return;
    }
    std::sort(names.begin(), names.end());
    const std::string &gguf_dir = env.opts().fixtures_gguf_dir;
    for (const auto &name : names) {
        fs::path gguf = dir / name / "model-f32.gguf";
        if (!gguf_dir.empty() && fs::exists(fs::path(gguf_dir) / (name + "-f32.gguf")))
            gguf = fs::path(gguf_dir) / (name + "-f32.gguf");
        if (!fs::exists(gguf)) {
            rep.skip(
                kMode,
                fmt::format("{}: no GGUF ({}{}): make it with python3 "
                            "tests/model/make_tiny_models.py --gguf-dir DIR and pass "
                            "--fixtures-gguf-dir DIR",
                            name, gguf_dir.empty() ? "" : gguf_dir + "/" + name + "-f32.gguf or ",
                            gguf.string()));
            continue;
        }
        try {
            // Long prompts (a subset of positions stored) in batches of 256 up to each stored
            // position; the others token by token.
            const auto r = tools::check_transformers_fixture(
                (dir / name).string(), gguf.string(), env.opts().threads,
                {.chunk = 256, .backend = env.opts().backend});
            std::string what = fmt::format(
                "{}: {} logit rows, max |diff| {:.3g} / max |logit| {:.3g} = {:.3g} (bound {:g}); "
                "{} greedy steps",
                name, r.rows_compared, r.max_abs_diff, r.max_abs_ref, r.ratio(),
                tools::kTransformersParityBound, r.greedy_steps);
            for (const auto &p : r.problems) what += "; " + p;
            rep.check(r.ok(), kMode, what);
        } catch (const Error &e) {
            rep.fail(kMode, fmt::format("{}: {}", name, e.what()));
        }
    }
}

}  // namespace ds4::test
