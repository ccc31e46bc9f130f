#pragma once
// The context a ds4 session gets for a requested size (--ctx, /ctx): at most the model's
// context_length (a larger request is clamped with a notice: positions past it were never
// trained, and the user gets the most the model supports rather than a refusal), at most the
// positions a session can index, and refused before allocation when its KV cache does not fit
// in the memory available.
#include <cstdint>
#include <string>

#include "model/hparams.h"
#include "runtime/session.h"

namespace ds4::tools {

// `flag` names the request in the messages ("--ctx", "/ctx"). `so.ctx` is ignored; the other
// session options decide the cache layout. Throws ds4::Error when the cache does not fit.
uint32_t context_for(uint64_t requested, const model::HParams &hp, runtime::SessionOptions so,
                     const std::string &flag);

}  // namespace ds4::tools
