#include "logprobs_dump.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace ds4::cli {

namespace {

std::string token_json(const tokenizer::Tokenizer &tok, int32_t id) {
    const std::string_view bytes = tok.token_bytes(id);
    std::string b;
    for (size_t i = 0; i < bytes.size(); ++i)
        b += fmt::format("{}{}", i ? "," : "", static_cast<unsigned char>(bytes[i]));
    return fmt::format("{{\"id\":{},\"text\":\"{}\",\"bytes\":[{}]}}", id, json_token_text(bytes),
                       b);
}

}  // namespace

std::string json_token_text(std::string_view bytes) {
    const bool utf8 = tokenizer::utf8_is_valid(bytes);
    std::string out;
    for (char ch : bytes) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20 || (!utf8 && c >= 0x80))
                    out += fmt::format("\\u{:04x}", c);
                else
                    out += ch;
        }
    }
    return out;
}

void dump_logprobs(runtime::Session &session, const tokenizer::Tokenizer &tok,
                   std::span<const int32_t> prompt, int64_t max_steps, int top_k,
                   const std::string &path) {
    session.eval(prompt);
    const int64_t room = int64_t(session.ctx()) - int64_t(prompt.size()) - 1;
    const int64_t steps = std::max<int64_t>(0, std::min(max_steps, room));
    std::string out = fmt::format(
        "{{\n  \"source\":\"ds4\",\n  \"prompt_tokens\":{},\n  \"ctx\":{},\n  \"top_k\":{},\n  "
        "\"steps\":[\n",
        prompt.size(), session.ctx(), top_k);
    for (int64_t step = 0; step < steps; ++step) {
        const std::vector<float> &logits = session.logits();
        // logprob = logit - logsumexp(all finite logits), in double.
        double mx = -INFINITY;
        for (float l : logits)
            if (std::isfinite(l)) mx = std::max(mx, double(l));
        double sum = 0;
        for (float l : logits)
            if (std::isfinite(l)) sum += std::exp(double(l) - mx);
        const double lse = mx + std::log(sum);
        std::vector<int32_t> ids(logits.size());
        std::iota(ids.begin(), ids.end(), 0);
        const size_t k = std::min<size_t>(top_k, ids.size());
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        const int32_t selected = ids[0];
        out += fmt::format("    {{\"step\":{},\"selected\":{},\"top_logprobs\":[", step,
                           token_json(tok, selected));
        for (size_t i = 0; i < k; ++i)
            out +=
                fmt::format("{}{{\"token\":{},\"logit\":{:.9g},\"logprob\":{:.9g}}}", i ? "," : "",
                            token_json(tok, ids[i]), logits[ids[i]], double(logits[ids[i]]) - lse);
        out += "]}";
        const bool last = selected == tok.specials().eos || step + 1 == steps;
        out += last ? "\n" : ",\n";
        if (last) break;
        session.eval(std::span(&selected, 1));
    }
    out += "  ]\n}\n";
    std::FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(fmt::format("cannot write {}", path));
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw Error(fmt::format("write to {} failed", path));
}

}  // namespace ds4::cli
