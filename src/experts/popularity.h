#pragma once
// Routing popularity saved per model, to seed the streaming cache at the next start: how often
// each (layer, expert) was selected, keyed by the identity of the model file it was counted on.
//
// The file is text, one record a line:
//
//   ds4-expert-popularity 1            format name and version
//   identity <text to end of line>     the model file's identity (file_identity below)
//   shape <n_layer> <n_expert>
//   count <layer> <expert> <n>         one line per expert selected at least once, each once
//   end <number of count lines>        absent when the file was cut short
//
// A file that does not parse exactly, was saved for another file or shape, or is missing is
// ignored with a notice: popularity is a hint, never a reason to fail a start.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "experts/expert_source.h"

namespace ds4::experts {

struct Popularity {
    std::string identity;
    uint32_t n_layer = 0, n_expert = 0;
    std::vector<uint64_t> counts;  // index layer * n_expert + expert
};

// "size=<bytes> mtime=<s>.<ns> path=<16 hex digits of the absolute path's FNV-1a hash>": changes
// when the file is rewritten, moved or replaced. Throws ds4::Error when the file cannot be stat'ed.
std::string file_identity(const std::string &path);

// Throws ds4::Error for an identity with a line break or counts of the wrong size.
std::string popularity_to_text(const Popularity &p);
// The popularity, or nullopt with the first defect (and its line) in *error.
std::optional<Popularity> popularity_from_text(std::string_view text, std::string *error);

// Writes a temporary file beside `path` and renames it over, so a reader never sees half a file;
// creates the folder. Throws ds4::Error naming the path.
void save_popularity(const std::string &path, const Popularity &p);

struct LoadedPopularity {
    std::optional<std::vector<uint64_t>> counts;  // set when the file is usable
    std::string notice;                           // why it is not, or what was loaded
};
LoadedPopularity load_popularity(const std::string &path, const std::string &identity,
                                 uint32_t n_layer, uint32_t n_expert);

// The selected experts, most selected first (ties by layer, then expert), at most max_keys: the
// order preload wants.
std::vector<ExpertKey> popular_first(std::span<const uint64_t> counts, uint32_t n_expert,
                                     size_t max_keys);

}  // namespace ds4::experts
