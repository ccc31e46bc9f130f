#include "transformers_parity.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ds4::tools {

namespace {

std::vector<float> read_f32(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("cannot read fixture {}", path));
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    if (bytes.size() % 4) throw Error(fmt::format("{}: size is not a multiple of 4", path));
    std::vector<float> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
}

nlohmann::json read_json(const std::string &path) {
    std::ifstream in(path);
    if (!in) throw Error(fmt::format("cannot read fixture {}", path));
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception &e) {
        throw Error(fmt::format("{}: {}", path, e.what()));
    }
}

void check_prompt(runtime::Model &model, const std::string &dir, const nlohmann::json &prompt,
                  uint32_t V, const ParityOptions &opts, ParityResult &r) {
    const std::string pname = prompt.at("name");
    const auto tokens = prompt.at("tokens").get<std::vector<int32_t>>();
    const auto generated = prompt.at("generated").get<std::vector<int32_t>>();
    const size_t n_prompt = prompt.at("n_prompt").get<size_t>();
    // Small vocabularies carry the logits of every position; the real one full rows at a few.
    const auto &files = prompt.at("files");
    const bool all_rows = files.contains("logits");
    const auto expect = read_f32(
        dir + "/" +
        (all_rows ? files.at("logits") : files.at("full_rows")).at("file").get<std::string>());
    std::vector<size_t> row_of(tokens.size(), SIZE_MAX);
    if (all_rows) {
        for (size_t i = 0; i < tokens.size(); ++i) row_of[i] = i;
    } else {
        const auto pos = prompt.at("full_row_positions").get<std::vector<size_t>>();
        for (size_t k = 0; k < pos.size(); ++k) {
            if (pos[k] >= tokens.size())
                throw Error(
                    fmt::format("{}/{}: full row position {} past the tokens", dir, pname, pos[k]));
            row_of[pos[k]] = k;
        }
    }
    size_t n_rows = 0;
    for (size_t k : row_of) n_rows += k != SIZE_MAX;
    if (expect.size() != n_rows * V) {
        r.problems.push_back(fmt::format("{}: {} expected values, {} rows x {} vocabulary", pname,
                                         expect.size(), n_rows, V));
        return;
    }

    runtime::SessionOptions so{.ctx = static_cast<uint32_t>(tokens.size() + 1), .chunk = 1};
    so.forward.qat_sim = opts.qat_sim;
    auto compare = [&](size_t pos, const std::vector<float> &logits) {
        const float *ref = expect.data() + row_of[pos] * V;
        double row_max = 0;
        for (uint32_t v = 0; v < V; ++v) {
            row_max = std::max(row_max, double(std::fabs(logits[v] - ref[v])));
            r.max_abs_ref = std::max(r.max_abs_ref, double(std::fabs(ref[v])));
        }
        if (row_max > r.max_abs_diff || r.rows_compared == 0) r.worst_position = pos;
        r.max_abs_diff = std::max(r.max_abs_diff, row_max);
        r.row_diffs.emplace_back(pos, row_max);
        r.top1.push_back(runtime::argmax(logits));
        r.top1_ref.push_back(int32_t(std::max_element(ref, ref + V) - ref));
        float second = -INFINITY;
        for (uint32_t v = 0; v < V; ++v)
            if (int32_t(v) != r.top1_ref.back()) second = std::max(second, ref[v]);
        r.ref_margin.push_back(ref[r.top1_ref.back()] - second);
        r.top1_same += r.top1.back() == r.top1_ref.back();
        ++r.rows_compared;
    };
    if (opts.chunk > 1 && !all_rows && generated.empty()) {
        // Batches up to each stored position: the logits after a batch are those of its last token.
        runtime::SessionOptions sb = so;
        sb.chunk = opts.chunk;
        runtime::Session s(model, sb);
        size_t done = 0;
        for (size_t i = 0; i < tokens.size(); ++i) {
            if (row_of[i] == SIZE_MAX) continue;
            compare(i, s.eval(std::span(tokens).subspan(done, i + 1 - done)));
            done = i + 1;
        }
        return;
    }
    {
        runtime::Session s(model, so);
        for (size_t i = 0; i < tokens.size(); ++i) {
            const auto &logits = s.eval(std::span(tokens).subspan(i, 1));
            if (row_of[i] != SIZE_MAX) compare(i, logits);
            // The token after position i is the argmax of our logits there.
            if (i + 1 >= n_prompt && i + 1 - n_prompt < generated.size()) {
                const size_t step = i + 1 - n_prompt;
                const int32_t ours = runtime::argmax(logits);
                ++r.greedy_steps;
                if (opts.exact && ours != generated[step])
                    r.problems.push_back(fmt::format("{}: greedy step {}: ours {}, transformers {}",
                                                     pname, step, ours, generated[step]));
            }
        }
    }
    // Batched prefill of the prompt ends on exactly the logits of token-by-token evaluation.
    runtime::SessionOptions sc = so;
    sc.chunk = 16;
    runtime::Session chunked(model, sc), stepwise(model, so);
    if (chunked.eval(std::span(tokens).first(n_prompt)) !=
        stepwise.eval(std::span(tokens).first(n_prompt)))
        r.problems.push_back(
            fmt::format("{}: chunked prefill (16) differs from token-by-token evaluation", pname));
}

}  // namespace

std::string file_sha256(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("cannot read {}", path));
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
        throw Error(fmt::format("{}: SHA-256 failed", path));
    std::string hex;
    for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
    return hex;
}

ParityResult check_transformers_fixture(const std::string &fixture_dir, const std::string &gguf,
                                        int n_threads, const ParityOptions &opts) {
    const auto index = read_json(fixture_dir + "/index.json");
    auto model = runtime::Model::load(gguf, {.n_threads = n_threads, .backend = opts.backend});
    ParityResult r;
    try {
        const uint32_t V = index.at("vocab_size").get<uint32_t>();
        if (model->hparams().n_vocab != V) {
            r.problems.push_back(fmt::format("the GGUF has {} vocabulary entries, the fixture {}",
                                             model->hparams().n_vocab, V));
            return r;
        }
        for (const auto &prompt : index.at("prompts"))
            check_prompt(*model, fixture_dir, prompt, V, opts, r);
    } catch (const nlohmann::json::exception &e) {
        throw Error(fmt::format("{}/index.json: {}", fixture_dir, e.what()));
    }
    return r;
}

}  // namespace ds4::tools
