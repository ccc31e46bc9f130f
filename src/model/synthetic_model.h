#pragma once
// Synthetic DeepSeek V4 models: any shape (tiny for tests, small for speed work, the full Flash
// layout), random but valid weights, and the real vocabulary copied from a vocab GGUF. Values
// are scaled so activations stay O(1) through every layer; they carry no meaning, but they
// exercise every code path and give the real byte counts per token.
#include <cstdint>
#include <string>

#include "model/hparams.h"
#include "model/quant_mix.h"

namespace ds4::gguf {
class File;
}

namespace ds4::model {

// "tiny" (seconds on a laptop core, crosses every boundary in a few dozen tokens), "small" (Flash
// widths, 6 layers, 32 experts: a few GB), "flash" (the published dimensions).
HParams shape_preset(const std::string &name, uint32_t n_vocab);
// A JSON object of HParams field names (as in hparams.h, e.g. {"n_layer": 4, "compress_ratio":
// [0,0,4,16]}) applied over the tiny preset.
HParams shape_from_json(const std::string &json_text, uint32_t n_vocab);

// Writes the model; `vocab` supplies every tokenizer.* key (its token count must not exceed
// hp.n_vocab). Progress goes to stderr when `progress` is set.
void write_synthetic_model(const HParams &hp, QuantMix mix, uint64_t seed, const gguf::File &vocab,
                           const std::string &out_path, bool progress);

}  // namespace ds4::model
