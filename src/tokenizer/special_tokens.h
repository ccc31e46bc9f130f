#pragma once
// The seven special tokens the engine recognises in rendered chat text, as the reference engine
// does (docs/MODEL.md section 6). Every other added token of the vocabulary (e.g.
// "<｜latest_reminder｜>", "<tool_result>" is not even one) is plain text to the tokenizer.
// Ids are never hard-coded: they are looked up by string in the vocabulary.
#include <array>
#include <cstdint>
#include <string_view>

namespace ds4::tokenizer {

// "｜" is U+FF5C FULLWIDTH VERTICAL LINE, "▁" is U+2581 LOWER ONE EIGHTH BLOCK.
inline constexpr std::string_view kBosText = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosText = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUserText = "<｜User｜>";
inline constexpr std::string_view kAssistantText = "<｜Assistant｜>";
inline constexpr std::string_view kThinkOpenText = "<think>";
inline constexpr std::string_view kThinkCloseText = "</think>";
inline constexpr std::string_view kDsmlText = "｜DSML｜";

struct ChatSpecialIds {
    int32_t bos = -1;
    int32_t eos = -1;
    int32_t user = -1;
    int32_t assistant = -1;
    int32_t think_open = -1;
    int32_t think_close = -1;
    int32_t dsml = -1;
};

// The strings in recognition order with the member each resolves to. None is a prefix of
// another, so the first one matching at a position is the only one.
struct ChatSpecial {
    std::string_view text;
    int32_t ChatSpecialIds::*id;
};
inline constexpr std::array<ChatSpecial, 7> kChatSpecials = {{
    {kBosText, &ChatSpecialIds::bos},
    {kEosText, &ChatSpecialIds::eos},
    {kUserText, &ChatSpecialIds::user},
    {kAssistantText, &ChatSpecialIds::assistant},
    {kThinkOpenText, &ChatSpecialIds::think_open},
    {kThinkCloseText, &ChatSpecialIds::think_close},
    {kDsmlText, &ChatSpecialIds::dsml},
}};

}  // namespace ds4::tokenizer
