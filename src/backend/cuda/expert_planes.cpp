#include "backend/cuda/expert_planes.h"

#include <fmt/format.h>

#include <cstddef>

#include "common/error.h"
#include "quant/blocks.h"

namespace ds4::cuda {

static_assert(offsetof(quant::BlockIQ2_XXS, qs) == 2 && sizeof(quant::BlockIQ2_XXS) == 66);
static_assert(offsetof(quant::BlockQ2_K, qs) == 16 && offsetof(quant::BlockQ2_K, d) == 80 &&
              sizeof(quant::BlockQ2_K) == 84);
static_assert(offsetof(quant::BlockQ4_K, qs) == 16 && sizeof(quant::BlockQ4_K) == 144);

bool has_block_split(GgmlType type) {
    return type == GgmlType::IQ2_XXS || type == GgmlType::Q2_K || type == GgmlType::Q4_K;
}

BlockSplit block_split(GgmlType type) {
    switch (type) {
        case GgmlType::IQ2_XXS:
            return {int(sizeof(quant::BlockIQ2_XXS)), 2, 64};
        case GgmlType::Q2_K:
            return {int(sizeof(quant::BlockQ2_K)), 16, 64};
        case GgmlType::Q4_K:
            return {int(sizeof(quant::BlockQ4_K)), 16, 128};
        default:
            throw Error(fmt::format("no expert-table planes for {} blocks", ggml_type_name(type)));
    }
}

}  // namespace ds4::cuda
