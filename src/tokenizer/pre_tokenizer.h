#pragma once
// The DeepSeek V3/V4 pre-tokenizer ("joyai-llm" in GGUF files, "deepseek-v3" in llama.cpp):
// splits text into the pieces that BPE encodes independently.
//
// It reproduces the `pre_tokenizer` of DeepSeek's tokenizer.json exactly: a Sequence of three
// Split(behavior = Isolated) regexes, each applied to every piece left by the previous one
// (matches become pieces, and so do the unmatched gaps between them):
//
//   1. \p{N}{1,3}                     digits in groups of at most three, from the left
//   2. [一-龥぀-ゟ゠-ヿ]+               runs of CJK ideographs and kana
//   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+     ASCII punctuation + ASCII word
//    | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+               a word, with one leading non-letter
//    |  ?[\p{P}\p{S}]+[\r\n]*                             punctuation/symbol run
//    | \s*[\r\n]+ | \s+(?!\S) | \s+                       whitespace runs
//
// The regexes are evaluated by hand over Unicode classes (unicode_class.h), with the leftmost-
// first alternation and backtracking results of a regex engine worked out per alternative.
// Input that is not valid UTF-8 is split at each invalid byte: the valid stretches are
// pre-tokenized on their own and every invalid byte becomes a piece of its own.
#include <string_view>
#include <vector>

namespace ds4::tokenizer {

// Appends the pieces of `text`, in order, as views into `text`; their concatenation is `text`.
void pre_tokenize(std::string_view text, std::vector<std::string_view> &pieces);

}  // namespace ds4::tokenizer
