#include "runtime/op_times.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gguf/ggml_type.h"

namespace ds4::runtime {

void OpTimes::add(const std::string &key, double ms, double bytes) {
    Total &t = totals_[key];
    t.calls += 1;
    t.ms += ms;
    t.bytes += bytes;
}

void OpTimes::report(const char *title) const {
    if (totals_.empty() || tokens_ == 0) return;
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto &a, const auto &b) { return a.second.ms > b.second.ms; });
    double total_ms = 0, total_bytes = 0;
    for (const auto &r : rows) {
        total_ms += r.second.ms;
        total_bytes += r.second.bytes;
    }
    const double n = double(tokens_);
    std::string out = fmt::format(
        "{}: {} tokens, {:.3f} ms per token timed, {:.3f} GB of weights per token\n"
        "  {:<40} {:>8} {:>10} {:>6} {:>10} {:>8}\n",
        title, tokens_, total_ms / n, total_bytes / n / 1e9, "operation", "calls/tok", "ms/tok",
        "%", "MB/tok", "GB/s");
    for (const auto &[key, t] : rows)
        out += fmt::format("  {:<40} {:>8.1f} {:>10.4f} {:>6.1f} {:>10.2f} {:>8.0f}\n", key,
                           double(t.calls) / n, t.ms / n, 100.0 * t.ms / total_ms,
                           t.bytes / n / 1e6, t.ms > 0 ? t.bytes / (t.ms * 1e-3) / 1e9 : 0.0);
    std::fputs(out.c_str(), stderr);
}

std::string weight_role(model::Tensor w) {
    std::string role = w->name;
    if (role.rfind("blk.", 0) == 0) role = role.substr(role.find('.', 4) + 1);
    if (role.size() > 7 && role.ends_with(".weight")) role.resize(role.size() - 7);
    return role + " " + std::string(ggml_type_name(w->type));
}

bool profile_requested(const char *name) {
    const char *v = std::getenv(name);
    return v != nullptr && *v != '\0' && std::string(v) != "0";
}

}  // namespace ds4::runtime
