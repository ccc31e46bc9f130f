#include "logits_diff.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace ds4::tools {

std::string logits_difference(const std::vector<float> &got, const std::vector<float> &want) {
    if (got.size() != want.size())
        return fmt::format("{} logits instead of {}", got.size(), want.size());
    size_t n_diff = 0, first = 0;
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
        if (n_diff++ == 0) first = i;
        max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(want[i])));
    }
    if (n_diff == 0) return "";
    return fmt::format("{} of {} logits differ (first at {}: {} vs {}; max |diff| {:.3g})", n_diff,
                       got.size(), first, got[first], want[first], max_diff);
}

}  // namespace ds4::tools
