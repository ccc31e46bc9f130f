// --ssd-streaming-cache-pressure (docs/SSD_STREAMING.md): the reference engine's seed bug report
// (the answer changed with the cache size, because slots were reused while still in use) as a
// check. A model runs resident, then streaming its routed experts at the smallest budgets (the
// floor, twice the floor, 10% and 25% of the routed experts), cold and preloaded: a prefill in
// chunks, then greedy decode steps on the resident run's tokens. Every logit of every step must be
// the resident run's, bit for bit. Always on a synthetic model in the published q2 expert types
// (tiny widths, 32 experts per layer; its slabs are not 4 KiB multiples, so O_DIRECT rounding is
// exercised); also on -m / DS4_TEST_MODEL when set, with the official short_code_completion prompt
// (the case of the report), cold only. With --cuda the same on the CUDA backend: the resident
// run on the device, the streamed ones with a device tier of each of those budgets, fed by a
// host tier of twice the floor (most experts then come from the disk) or of every expert.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "logits_diff.h"
#include "model/synthetic_model.h"
#include "model_boundaries.h"
#include "model_load.h"
#include "modes.h"
#include "official_vectors.h"
#include "runtime/expert_streaming.h"
#include "runtime/sampler.h"
#include "temp_dir.h"
#include "tokenizer/chat_prompt.h"

namespace ds4::test {

namespace {

constexpr const char *kMode = "ssd-streaming-cache-pressure";

struct Workload {
    std::vector<int32_t> prompt;
    uint32_t chunk = 16;
    uint32_t decode_steps = 16;
};

// The logits after each prefill chunk and each decode step, and the tokens decoded.
struct Trace {
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> decoded;
};

// `forced`: the tokens to decode (the resident run's); null: greedy from this run's logits.
Trace run_trace(runtime::Model &model, const Workload &w, const std::vector<int32_t> *forced) {
    const uint32_t ctx = uint32_t(w.prompt.size() + w.decode_steps + 1);
    runtime::Session s(model, {.ctx = ctx, .chunk = w.chunk});
    Trace t;
    for (size_t i = 0; i < w.prompt.size(); i += w.chunk) {
        const size_t n = std::min<size_t>(w.chunk, w.prompt.size() - i);
        t.logits.push_back(s.eval(std::span(w.prompt).subspan(i, n)));
    }
    for (uint32_t k = 0; k < w.decode_steps; ++k) {
        const int32_t id = forced ? (*forced)[k] : runtime::argmax(s.logits());
        t.decoded.push_back(id);
        t.logits.push_back(s.eval(std::span(&id, 1)));
    }
    return t;
}

// "" when every step's logits equal the oracle's bit for bit, else the first step that differs.
std::string compare_traces(const Trace &got, const Trace &want, size_t n_prefill_steps) {
    if (got.logits.size() != want.logits.size()) return "a different number of steps";
    for (size_t i = 0; i < want.logits.size(); ++i) {
        const std::string d = tools::logits_difference(got.logits[i], want.logits[i]);
        if (d.empty()) continue;
        return i < n_prefill_steps ? fmt::format("prefill chunk {}: {}", i + 1, d)
                                   : fmt::format("decode step {}: {}", i - n_prefill_steps + 1, d);
    }
    return "";
}

std::vector<uint64_t> smallest_budgets(const model::HParams &hp) {
    const uint64_t floor = hp.n_expert_used, total = uint64_t(hp.n_layer) * hp.n_expert;
    std::vector<uint64_t> b = {floor, 2 * floor, std::max(floor, total / 10),
                               std::max(floor, total / 4)};
    for (uint64_t &x : b) x = std::min(x, total);
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    return b;
}

std::string read_text(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("cannot read {}", path));
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void run_model(TestEnv &env, Report &rep, const std::string &name, const std::string &path,
               const Workload &w, bool with_preload, std::vector<std::string> &table) {
    const int threads = env.opts().threads;
    const runtime::Backend backend = env.opts().backend;
    const bool cuda = backend == runtime::Backend::Cuda;
    const auto resident =
        tools::load_model("ds4-test", path, {.n_threads = threads, .backend = backend});
    const model::HParams hp = resident->hparams();
    const Trace oracle = run_trace(*resident, w, nullptr);
    const size_t n_prefill = (w.prompt.size() + w.chunk - 1) / w.chunk;
    rep.note(kMode, fmt::format("{}: {} layers x {} experts ({} used per token), prompt {} tokens "
                                "in chunks of {}, then {} greedy decode steps",
                                name, hp.n_layer, hp.n_expert, hp.n_expert_used, w.prompt.size(),
                                w.chunk, w.decode_steps));
    const uint64_t n_total = uint64_t(hp.n_layer) * hp.n_expert;
    // CUDA: the host tier under each device tier; the CPU has the one cache.
    const std::vector<uint64_t> host_tiers =
        cuda ? std::vector<uint64_t>{std::min<uint64_t>(n_total, 2 * hp.n_expert_used), n_total}
             : std::vector<uint64_t>{0};
    for (const uint64_t budget : smallest_budgets(hp))
        for (const uint64_t host : host_tiers)
            for (const bool preload : {false, true}) {
                if (preload && !with_preload) continue;
                runtime::ModelOptions mo{.n_threads = threads, .backend = backend};
                mo.streaming.enabled = true;
                mo.streaming.budget.experts = cuda ? host : budget;
                mo.streaming.device.experts = cuda ? budget : 0;
                mo.streaming.host_tier = cuda;
                mo.streaming.preload = preload;
                std::string problem;
                experts::ExpertStats st;
                std::optional<runtime::DeviceTierStats> tier;
                try {
                    const auto streamed = tools::load_model("ds4-test", path, mo);
                    const Trace got = run_trace(*streamed, w, &oracle.decoded);
                    problem = compare_traces(got, oracle, n_prefill);
                    st = streamed->streaming()->source().stats();
                    if (streamed->device()) tier = streamed->device()->tier_stats();
                } catch (const Error &e) {
                    problem = e.what();
                }
                const double total = double(n_total);
                const std::string where =
                    cuda ? fmt::format("device tier {} experts ({:.1f}%), host tier {}", budget,
                                       100.0 * budget / total, host)
                         : fmt::format("budget {} experts ({:.1f}%)", budget,
                                       100.0 * budget / total);
                rep.check(
                    problem.empty(), kMode,
                    fmt::format("{}: {}, {}: {}", name, where, preload ? "preloaded" : "cold",
                                problem.empty() ? fmt::format("{} steps bit-identical to resident",
                                                              oracle.logits.size())
                                                : problem));
                // The device tier's counts where there is one, else the cache's.
                const uint64_t hits = tier ? tier->hits : st.hits,
                               misses = tier ? tier->misses : st.misses,
                               asked = tier ? tier->acquires : st.gets;
                table.push_back(fmt::format(
                    "{:<10} {:>7} {:>6.1f}% {:>6} {:<9} {:>9} {:>9} {:>8.2f}% {:>14} {}", name,
                    budget, 100.0 * budget / total, cuda ? fmt::format("{}", host) : "-",
                    preload ? "preloaded" : "cold", hits, misses,
                    asked ? 100.0 * double(hits) / double(asked) : 0.0, st.bytes_read,
                    problem.empty() ? "identical" : "DIFFERENT"));
            }
}

}  // namespace

void run_ssd_streaming_cache_pressure(TestEnv &env, Report &rep) {
    std::vector<std::string> table;
    try {
        // The synthetic model: tiny widths, 32 experts per layer (4 used), q2 expert types.
        tools::TempDir tmp("ds4-test-ssd-");
        const std::string path = tmp.path() + "/tiny-q2-32x.gguf";
        {
            const auto vocab = gguf::File::open(env.opts().vocab);
            const auto n_tokens =
                static_cast<uint32_t>(vocab->get_array("tokenizer.ggml.tokens").items.size());
            model::HParams hp = model::shape_preset("tiny", n_tokens);
            hp.n_expert = 32;
            hp.n_expert_used = 4;
            model::write_synthetic_model(hp, model::QuantMix::Q2, 11, *vocab, path, false);
        }
        {
            const auto f = gguf::File::open(path);
            Workload w;
            w.prompt = tools::spread_tokens(48, model::HParams::from_gguf(*f).n_vocab, 5);
            run_model(env, rep, "synthetic", path, w, true, table);
        }
        if (!env.opts().model.empty()) {
            Workload w;
            w.chunk = 256;
            w.decode_steps = 4;
            for (const VectorCase &c : read_official_vectors(env.opts().vector_file))
                if (c.id == "short_code_completion")
                    w.prompt = tokenizer::encode_cli_prompt(env.vocab(), read_text(c.prompt_path),
                                                            "", tokenizer::ThinkMode::kNone);
            if (w.prompt.empty())
                throw Error(
                    fmt::format("{} has no short_code_completion case", env.opts().vector_file));
            run_model(env, rep, "test-model", env.opts().model, w, false, table);
        } else {
            rep.note(kMode, "no -m / DS4_TEST_MODEL: the synthetic model only");
        }
    } catch (const Error &e) {
        rep.fail(kMode, e.what());
    }
    if (table.empty()) return;
    rep.note(kMode, fmt::format("{:<10} {:>7} {:>7} {:>6} {:<9} {:>9} {:>9} {:>9} {:>14} {}",
                                "model", "budget", "share", "host", "start", "hits", "misses",
                                "hit rate", "bytes read", "logits"));
    if (env.opts().backend == runtime::Backend::Cuda)
        rep.note(kMode,
                 "budget: the device tier; host: the host tier; hits and misses: the device "
                 "tier's; bytes read: from the disk into the host tier");
    for (const std::string &line : table) rep.note(kMode, line);
}

}  // namespace ds4::test
