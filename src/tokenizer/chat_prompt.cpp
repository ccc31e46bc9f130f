#include "tokenizer/chat_prompt.h"

#include "tokenizer/tokenizer.h"

namespace ds4::tokenizer {

std::string_view think_max_prefix() {
    return "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
           "You MUST be very thorough in your thinking and comprehensively decompose the problem "
           "to resolve the root cause, rigorously stress-testing your logic against all potential "
           "paths, edge cases, and adversarial scenarios.\n"
           "Explicitly write out your entire deliberation process, documenting every intermediate "
           "step, considered alternative, and rejected hypothesis to ensure absolutely no "
           "assumption is left unchecked.\n\n";
}

ThinkMode effective_think_mode(ThinkMode requested, uint64_t n_ctx) {
    if (requested == ThinkMode::kMax && n_ctx < kThinkMaxMinContext) return ThinkMode::kHigh;
    return requested;
}

std::vector<int32_t> encode_cli_preamble(const Tokenizer &tok, std::string_view system,
                                         ThinkMode mode) {
    std::vector<int32_t> out{tok.specials().bos};
    if (mode == ThinkMode::kMax) tok.encode_append(think_max_prefix(), out);
    if (!system.empty()) tok.encode_append(system, out);
    return out;
}

void append_cli_user_turn(const Tokenizer &tok, std::string_view user, ThinkMode mode,
                          std::vector<int32_t> &out) {
    const ChatSpecialIds &s = tok.specials();
    out.push_back(s.user);
    tok.encode_append(user, out);
    out.push_back(s.assistant);
    out.push_back(thinking_enabled(mode) ? s.think_open : s.think_close);
}

std::vector<int32_t> encode_cli_prompt(const Tokenizer &tok, std::string_view prompt,
                                       std::string_view system, ThinkMode mode) {
    if (prompt.starts_with(kBosText)) return tok.encode_chat_text(prompt);
    std::vector<int32_t> out = encode_cli_preamble(tok, system, mode);
    append_cli_user_turn(tok, prompt, mode, out);
    return out;
}

}  // namespace ds4::tokenizer
