#pragma once
// Token bytes made readable on one line of the report: quoted, control bytes and bytes of
// invalid UTF-8 written as \xNN (a token may be half of a multi-byte character).
#include <string>
#include <string_view>

namespace ds4::test {

std::string display_token(std::string_view bytes);

}  // namespace ds4::test
