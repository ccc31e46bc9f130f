#include "experts/popularity.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace ds4::experts {
namespace {

constexpr std::string_view kMagic = "ds4-expert-popularity";
constexpr uint32_t kFormatVersion = 1;
// Bounds that keep a hostile file from asking for a huge table (Flash has 43 x 256).
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxExperts = 65536;
constexpr uint64_t kMaxKeys = uint64_t(1) << 22;
constexpr uint64_t kMaxFileBytes = uint64_t(64) << 20;

uint64_t fnv1a(std::string_view s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

std::vector<std::string_view> split_spaces(std::string_view line) {
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i <= line.size()) {
        const size_t j = line.find(' ', i);
        const size_t end = j == std::string_view::npos ? line.size() : j;
        out.push_back(line.substr(i, end - i));
        if (j == std::string_view::npos) break;
        i = j + 1;
    }
    return out;
}

// A decimal number, digits only, that fits.
bool parse_u64(std::string_view s, uint64_t *v) {
    if (s.empty() || s.size() > 20) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

std::string file_identity(const std::string &path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw Error(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(path, ec);
    const std::string name = ec ? path : abs.lexically_normal().string();
    return fmt::format("size={} mtime={}.{:09d} path={:016x}", uint64_t(st.st_size),
                       int64_t(st.st_mtim.tv_sec), int64_t(st.st_mtim.tv_nsec), fnv1a(name));
}

std::string popularity_to_text(const Popularity &p) {
    if (p.identity.find_first_of("\r\n") != std::string::npos)
        throw Error("expert popularity: the identity has a line break");
    if (p.counts.size() != uint64_t(p.n_layer) * p.n_expert)
        throw Error("expert popularity: counts do not match the shape");
    std::string out = fmt::format("{} {}\nidentity {}\nshape {} {}\n", kMagic, kFormatVersion,
                                  p.identity, p.n_layer, p.n_expert);
    uint64_t n = 0;
    for (uint64_t k = 0; k < p.counts.size(); ++k) {
        if (p.counts[k] == 0) continue;
        out += fmt::format("count {} {} {}\n", k / p.n_expert, k % p.n_expert, p.counts[k]);
        ++n;
    }
    out += fmt::format("end {}\n", n);
    return out;
}

std::optional<Popularity> popularity_from_text(std::string_view text, std::string *error) {
    Popularity p;
    uint64_t line_no = 0, n_counts = 0;
    std::vector<bool> seen;
    bool ended = false;
    auto fail = [&](const std::string &why) -> std::optional<Popularity> {
        if (error) *error = fmt::format("line {}: {}", line_no, why);
        return std::nullopt;
    };
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) return fail("no line break at the end of the file");
        const std::string_view line = text.substr(pos, nl - pos);
        pos = nl + 1;
        ++line_no;
        if (ended) return fail("text after the end line");
        if (line_no == 1) {
            if (line != fmt::format("{} {}", kMagic, kFormatVersion))
                return fail(fmt::format("not \"{} {}\"", kMagic, kFormatVersion));
            continue;
        }
        if (line_no == 2) {
            if (line.substr(0, 9) != "identity ") return fail("expected \"identity <text>\"");
            p.identity = std::string(line.substr(9));
            if (p.identity.find('\r') != std::string::npos) return fail("a carriage return");
            continue;
        }
        const std::vector<std::string_view> f = split_spaces(line);
        uint64_t a = 0, b = 0, c = 0;
        if (line_no == 3) {
            if (f.size() != 3 || f[0] != "shape" || !parse_u64(f[1], &a) || !parse_u64(f[2], &b))
                return fail("expected \"shape <n_layer> <n_expert>\"");
            if (a == 0 || b == 0 || a > kMaxLayers || b > kMaxExperts || a * b > kMaxKeys)
                return fail(fmt::format("implausible shape {} x {}", a, b));
            p.n_layer = uint32_t(a);
            p.n_expert = uint32_t(b);
            p.counts.assign(a * b, 0);
            seen.assign(a * b, false);
            continue;
        }
        if (!f.empty() && f[0] == "end") {
            if (f.size() != 2 || !parse_u64(f[1], &a)) return fail("expected \"end <n>\"");
            if (a != n_counts)
                return fail(fmt::format("end says {} counts, the file has {}", a, n_counts));
            ended = true;
            continue;
        }
        if (f.size() != 4 || f[0] != "count" || !parse_u64(f[1], &a) || !parse_u64(f[2], &b) ||
            !parse_u64(f[3], &c))
            return fail("expected \"count <layer> <expert> <n>\" or \"end <n>\"");
        if (a >= p.n_layer || b >= p.n_expert)
            return fail(fmt::format("layer {} expert {} outside the shape", a, b));
        const uint64_t k = a * p.n_expert + b;
        if (seen[k]) return fail(fmt::format("layer {} expert {} given twice", a, b));
        seen[k] = true;
        p.counts[k] = c;
        ++n_counts;
    }
    if (line_no < 3) return fail("the header is incomplete");
    if (!ended) return fail("no end line: the file was cut short");
    return p;
}

void save_popularity(const std::string &path, const Popularity &p) {
    const std::string text = popularity_to_text(p);
    const std::filesystem::path target(path);
    std::error_code ec;
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) throw Error(fmt::format("{}: cannot create the folder: {}", path, ec.message()));
    const std::string tmp = fmt::format("{}.tmp{}", path, ::getpid());
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f.write(text.data(), std::streamsize(text.size()));
        f.close();
        if (!f) {
            std::filesystem::remove(tmp, ec);
            throw Error(fmt::format("{}: cannot write the expert popularity", tmp));
        }
    }
    std::filesystem::rename(tmp, target, ec);
    if (ec) {
        std::error_code ignored;
        std::filesystem::remove(tmp, ignored);
        throw Error(fmt::format("{}: cannot rename the expert popularity into place: {}", path,
                                ec.message()));
    }
}

LoadedPopularity load_popularity(const std::string &path, const std::string &identity,
                                 uint32_t n_layer, uint32_t n_expert) {
    LoadedPopularity r;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) {
        r.notice = fmt::format("no saved expert popularity at {}", path);
        return r;
    }
    if (size > kMaxFileBytes) {
        r.notice = fmt::format("ignoring {}: {} bytes is too large for an expert popularity file",
                               path, size);
        return r;
    }
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    if (!f) {
        r.notice = fmt::format("ignoring {}: cannot read it", path);
        return r;
    }
    std::string why;
    std::optional<Popularity> p = popularity_from_text(ss.str(), &why);
    if (!p) {
        r.notice = fmt::format("ignoring {}: {}", path, why);
        return r;
    }
    if (p->identity != identity) {
        r.notice = fmt::format("ignoring {}: saved for another model file ({}, this one is {})",
                               path, p->identity, identity);
        return r;
    }
    if (p->n_layer != n_layer || p->n_expert != n_expert) {
        r.notice =
            fmt::format("ignoring {}: saved for {} layers x {} experts, the model has {} x {}",
                        path, p->n_layer, p->n_expert, n_layer, n_expert);
        return r;
    }
    uint64_t selected = 0;
    for (uint64_t c : p->counts) selected += c != 0;
    r.notice = fmt::format("expert popularity from {}: {} experts selected before", path, selected);
    r.counts = std::move(p->counts);
    return r;
}

std::vector<ExpertKey> popular_first(std::span<const uint64_t> counts, uint32_t n_expert,
                                     size_t max_keys) {
    std::vector<uint64_t> keys;
    if (n_expert == 0) return {};
    for (uint64_t k = 0; k < counts.size(); ++k)
        if (counts[k] != 0) keys.push_back(k);
    std::stable_sort(keys.begin(), keys.end(),
                     [&](uint64_t a, uint64_t b) { return counts[a] > counts[b]; });
    if (keys.size() > max_keys) keys.resize(max_keys);
    std::vector<ExpertKey> out;
    out.reserve(keys.size());
    for (uint64_t k : keys) out.push_back({uint32_t(k / n_expert), uint32_t(k % n_expert)});
    return out;
}

}  // namespace ds4::experts
