#pragma once
// The one version string of every tool (--version), the project version CMake declares.
namespace ds4::tools {

const char *version_string();  // e.g. "ds4cpp 0.1.0"

}  // namespace ds4::tools
