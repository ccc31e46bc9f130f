#pragma once
// Data files that ship with the repository (the vocabulary, the official vectors, fixtures) are
// found relative to the working directory first, then relative to the source tree the tool was
// built from, so the tools work from the repository root, from a build folder, or from anywhere.
#include <string>
#include <string_view>

namespace ds4::tools {

// The first of `rel` and <source tree>/`rel` that exists; `rel` itself when neither does (so the
// caller's "not found" message names the path the user would expect).
std::string find_repo_file(std::string_view rel);

}  // namespace ds4::tools
