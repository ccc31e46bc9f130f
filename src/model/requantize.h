#pragma once
// Rewrites a deepseek4 GGUF with the tensor types of a quant mix: the published types for every
// role (F16 HC/router/compressor/indexer/embedding, Q8_0 projections, shared experts and head,
// F32 norms) and the mix's routed-expert types. Values go through f32: dequantize the source
// row, quantize it to the target type. All other metadata is copied unchanged.
#include <string>

#include "model/synthetic_model.h"

namespace ds4::model {

// Throws ds4::Error for a mix whose types have no quantizer here, for shapes a type cannot hold
// (rows not a multiple of the block size) and for values a quantizer refuses (IQ2_XXS: inf/NaN).
// Rows are quantized on n_threads threads (0: one per core); the output does not depend on it.
void requantize_model(const std::string &in_path, const std::string &out_path, QuantMix mix,
                      bool progress, int n_threads = 0);

}  // namespace ds4::model
