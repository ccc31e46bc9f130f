#pragma once
// Prompt tokens the way the reference engine's CLI builds them (docs/MODEL.md 7.1-7.2,
// docs/SURFACES.md 2.3):
//
//   BOS [Think Max prefix] [system] <｜User｜> prompt <｜Assistant｜> (<think> | </think>)
//
// No separator is inserted anywhere and each text part is BPE-encoded on its own (no merge
// crosses a part boundary). An empty system text adds nothing. A prompt that starts with the BOS
// text is a pre-rendered transcript: it is encoded as chat text (specials recognised) and
// nothing is added.
#include <cstdint>
#include <string_view>
#include <vector>

namespace ds4::tokenizer {

class Tokenizer;

enum class ThinkMode {
    kNone,  // non-thinking: the assistant turn opens with </think>
    kHigh,  // thinking: the assistant turn opens with <think>
    kMax,   // thinking plus the Think Max instruction right after BOS
};

inline constexpr std::string_view kDefaultSystemText = "You are a helpful assistant";
// Think Max needs a context of at least this many tokens; below it, it falls back to kHigh.
inline constexpr uint64_t kThinkMaxMinContext = 393216;

// The Think Max instruction text, inserted right after BOS (ends with a blank line).
std::string_view think_max_prefix();

inline bool thinking_enabled(ThinkMode mode) {
    return mode != ThinkMode::kNone;
}
// The mode actually used with a context of n_ctx tokens (Think Max downgraded below 393216).
ThinkMode effective_think_mode(ThinkMode requested, uint64_t n_ctx);

// One-shot prompt (-p / --prompt-file).
std::vector<int32_t> encode_cli_prompt(const Tokenizer &tok, std::string_view prompt,
                                       std::string_view system, ThinkMode mode);

// Interactive transcript pieces: the preamble once (BOS, Think Max prefix, system), then one
// user turn per message (<｜User｜> text <｜Assistant｜> <think>|</think>).
std::vector<int32_t> encode_cli_preamble(const Tokenizer &tok, std::string_view system,
                                         ThinkMode mode);
void append_cli_user_turn(const Tokenizer &tok, std::string_view user, ThinkMode mode,
                          std::vector<int32_t> &out);

}  // namespace ds4::tokenizer
