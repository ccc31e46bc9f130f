#include "official_vectors.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "repo_paths.h"

namespace ds4::test {

namespace {

namespace fs = std::filesystem;

std::string parse_hex(const std::string &hex, const std::string &where) {
    if (hex.size() % 2 || hex.size() > 256)
        throw Error(fmt::format("{}: bad token hex '{}'", where, hex));
    std::string out;
    for (size_t i = 0; i < hex.size(); i += 2) {
        unsigned v = 0;
        for (size_t k = i; k < i + 2; ++k) {
            const char c = hex[k];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) throw Error(fmt::format("{}: bad token hex '{}'", where, hex));
            v = v * 16 + unsigned(d);
        }
        out += static_cast<char>(v);
    }
    return out;
}

// The .vec names prompts relative to the repository root ("tests/test-vectors/prompts/x.txt");
// the vectors README says relative to the vectors folder. Both are accepted.
std::string resolve_prompt(const std::string &rel, const fs::path &vec_dir,
                           const std::string &where) {
    // Beside the .vec first, so a copied vectors folder uses its own prompts.
    const fs::path r(rel);
    std::vector<fs::path> candidates = {vec_dir / r};
    if (auto pos = rel.find("prompts/"); pos != std::string::npos)
        candidates.push_back(vec_dir / rel.substr(pos));
    candidates.push_back(vec_dir.parent_path().parent_path() / r);
    candidates.push_back(tools::find_repo_file(rel));
    for (const auto &c : candidates)
        if (fs::exists(c)) return c.string();
    throw Error(fmt::format("{}: prompt file {} not found", where, rel));
}

void read_official_json(VectorCase &c, const fs::path &vec_dir) {
    const fs::path p = vec_dir / "official" / (c.id + ".official.json");
    std::ifstream in(p);
    if (!in) throw Error(fmt::format("cannot read {}", p.string()));
    try {
        const auto j = nlohmann::json::parse(in);
        c.official_prompt_tokens = j.at("usage").at("prompt_tokens").get<int64_t>();
        for (const auto &s : j.at("steps")) {
            std::string bytes;
            for (int b : s.at("token").at("bytes")) bytes += static_cast<char>(b);
            c.official_json_tokens.push_back(bytes);
        }
    } catch (const nlohmann::json::exception &e) {
        throw Error(fmt::format("{}: {}", p.string(), e.what()));
    }
}

}  // namespace

std::vector<VectorCase> read_official_vectors(const std::string &vec_path) {
    std::ifstream in(vec_path);
    if (!in) throw Error(fmt::format("cannot read {}", vec_path));
    const fs::path vec_dir = fs::absolute(fs::path(vec_path)).parent_path();
    std::vector<VectorCase> cases;
    VectorCase *cur = nullptr;
    size_t declared_steps = 0;
    std::string line;
    for (int lineno = 1; std::getline(in, line); ++lineno) {
        const std::string where = fmt::format("{}:{}", vec_path, lineno);
        std::istringstream ls(line);
        std::string kw;
        if (!(ls >> kw) || kw[0] == '#') continue;
        if (kw == "case") {
            if (cur) throw Error(fmt::format("{}: 'case' before 'end'", where));
            VectorCase c;
            std::string prompt;
            if (!(ls >> c.id >> c.ctx >> declared_steps >> prompt) || declared_steps > 16)
                throw Error(
                    fmt::format("{}: expected 'case <id> <ctx> <steps<=16> <prompt>'", where));
            c.prompt_path = resolve_prompt(prompt, vec_dir, where);
            cases.push_back(std::move(c));
            cur = &cases.back();
        } else if (kw == "step") {
            VectorStep s;
            std::string hex;
            size_t n = 0;
            if (!cur || !(ls >> s.index >> hex >> n) || n > 32 ||
                s.index != static_cast<int>(cur->steps.size()))
                throw Error(
                    fmt::format("{}: expected 'step <next index> <hex> <count<=32>'", where));
            s.selected = parse_hex(hex, where);
            s.tops.resize(n);
            cur->steps.push_back(std::move(s));
        } else if (kw == "top") {
            if (!cur || cur->steps.empty())
                throw Error(fmt::format("{}: 'top' outside a step", where));
            auto &tops = cur->steps.back().tops;
            auto it = std::find_if(tops.begin(), tops.end(),
                                   [](const VectorTop &t) { return t.bytes.empty(); });
            std::string hex;
            double lp = 0;
            if (it == tops.end() || !(ls >> hex >> lp))
                throw Error(fmt::format("{}: unexpected 'top' line", where));
            it->bytes = parse_hex(hex, where);
            it->logprob = lp;
        } else if (kw == "end") {
            if (!cur || cur->steps.size() != declared_steps)
                throw Error(fmt::format("{}: 'end' after {} of {} steps", where,
                                        cur ? cur->steps.size() : 0, declared_steps));
            for (const auto &s : cur->steps)
                for (const auto &t : s.tops)
                    if (t.bytes.empty())
                        throw Error(fmt::format("{}: step {} has fewer 'top' lines than declared",
                                                where, s.index));
            read_official_json(*cur, vec_dir);
            cur = nullptr;
        } else {
            throw Error(fmt::format("{}: unknown line '{}'", where, kw));
        }
    }
    if (cur) throw Error(fmt::format("{}: case {} has no 'end'", vec_path, cur->id));
    if (cases.empty()) throw Error(fmt::format("{}: no cases", vec_path));
    return cases;
}

}  // namespace ds4::test
