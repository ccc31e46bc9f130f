#pragma once
// `ds4 --dump-logprobs FILE` (docs/SURFACES.md 2.6): a greedy continuation with the top-k
// alternatives of every step, as the reference engine's JSON, byte for byte in layout.
#include <cstdint>
#include <span>
#include <string>

#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace ds4::cli {

// Evaluates `prompt`, then up to `max_steps` greedy steps; writes the JSON to `path`.
void dump_logprobs(runtime::Session &session, const tokenizer::Tokenizer &tok,
                   std::span<const int32_t> prompt, int64_t max_steps, int top_k,
                   const std::string &path);

// JSON string body for token bytes: escaped, and every byte >= 0x80 written as \u00XX when the
// bytes are not valid UTF-8 (the `bytes` array is then the authoritative value).
std::string json_token_text(std::string_view bytes);

}  // namespace ds4::cli
