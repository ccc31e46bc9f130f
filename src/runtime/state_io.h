#pragma once
// Little-endian binary fields over iostreams for session state bytes (Session::write_state and
// the backends' write_state): a short read throws ds4::Error naming the field, so truncated
// bytes never pass for values. Callers validate every count before they allocate for it.
#include <fmt/format.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>

#include "common/error.h"

namespace ds4::runtime::state_io {

static_assert(std::endian::native == std::endian::little,
              "session state bytes are little-endian: a big-endian host needs byte swaps here");

inline void put_bytes(std::ostream &out, const void *p, size_t n) {
    out.write(static_cast<const char *>(p), static_cast<std::streamsize>(n));
    if (!out) throw Error("session state: the write failed");
}

template <typename T>
void put(std::ostream &out, T v) {
    put_bytes(out, &v, sizeof v);
}

inline void get_bytes(std::istream &in, void *p, size_t n, const char *what) {
    in.read(static_cast<char *>(p), static_cast<std::streamsize>(n));
    if (static_cast<size_t>(in.gcount()) != n)
        throw Error(
            fmt::format("session state: truncated in {} ({} of {} bytes)", what, in.gcount(), n));
}

template <typename T>
T get(std::istream &in, const char *what) {
    T v{};
    get_bytes(in, &v, sizeof v, what);
    return v;
}

}  // namespace ds4::runtime::state_io
