#pragma once
// A session's serialised state (Session::write_state) as a string, and back, for the tests.
#include <sstream>
#include <string>

#include "runtime/session.h"

namespace ds4::test {

inline std::string state_of(const runtime::Session &s) {
    std::ostringstream out;
    s.write_state(out);
    return out.str();
}

inline void read_into(runtime::Session &s, const std::string &bytes) {
    std::istringstream in(bytes);
    s.read_state(in);
}

}  // namespace ds4::test
