#pragma once
// Checks of the files a tool reads and writes, made before the model loads, so that a wrong path
// fails in a second with its reason instead of after minutes of loading (or as an uncaught
// stream exception). All throw UsageError naming the flag and the path.
#include <string>

namespace ds4::tools {

// The whole content of a regular file (or a pipe such as /dev/stdin). `what` names the source in
// the error, e.g. "--prompt-file".
std::string read_input_file(const std::string &path, const std::string &what);

// Throws unless `path` can be opened for writing: not empty, not a directory, its folder exists,
// and we may write there. Opens the file without truncating it; a file created by the check is
// removed again.
void check_output_writable(const std::string &path, const std::string &what);

}  // namespace ds4::tools
