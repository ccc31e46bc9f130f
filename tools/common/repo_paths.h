#pragma once
// Data files that ship with the repository (the vocabulary, the official vectors, fixtures) are
// looked up, for a repository-relative path `rel`, in this order:
//   1. `rel` itself when it is absolute or exists relative to the working directory;
//   2. <directory of the running binary>/<DS4_INSTALL_DATA_REL>/`rel`, the installed layout
//      (`cmake --install`: bin/ds4-test finds share/ds4cpp/tests/test-vectors/official.vec);
//   3. <source tree the binary was built from>/`rel`, the development fallback. Setting the
//      environment variable DS4_NO_SOURCE_FALLBACK (to anything but "" or "0") turns it off, so
//      an installed prefix can be tested on a machine that still has the sources.
// With DS4_PRINT_PATHS set (same rule), every lookup prints one line to stderr:
//   ds4: data REL -> PATH (cwd|install|source|not found)
// The rules are in docs/ARCHITECTURE.md ("Install layout").
#include <string>
#include <string_view>
#include <vector>

namespace ds4::tools {

// The first candidate that exists; `rel` itself when none does (so the caller's "not found"
// message names the path the user would expect).
std::string find_repo_file(std::string_view rel);

// One place `rel` may be found, in lookup order.
struct RepoPathCandidate {
    std::string origin;  // "cwd", "install" or "source"
    std::string path;
    bool exists = false;
};

// Every place find_repo_file tries for `rel` (absolute paths: just the path), in order; the
// source tree is left out when DS4_NO_SOURCE_FALLBACK is set.
std::vector<RepoPathCandidate> repo_file_candidates(std::string_view rel);

// <directory of the running binary>/<DS4_INSTALL_DATA_REL>, normalized ("" when the binary's
// path cannot be read).
std::string install_data_dir();

}  // namespace ds4::tools
