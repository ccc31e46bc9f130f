#pragma once
// Bit-for-bit comparison of two logit vectors, described for a failure line.
#include <string>
#include <vector>

namespace ds4::tools {

// "" when the vectors are identical bit for bit (so NaNs in the same places are equal and -0 is
// not +0); else how many entries differ, the first one, and the largest difference.
std::string logits_difference(const std::vector<float> &got, const std::vector<float> &want);

}  // namespace ds4::tools
