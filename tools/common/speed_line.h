#pragma once
// The line ds4 prints on stderr after a generation (one-shot and each chat turn):
//   ds4: prefill: 27 tokens, 0.011 s, 2459.09 t/s; generation: 32 tokens, 0.152 s, 204.00 t/s;
//   stopped: length
// (one line): counts, seconds and speeds of both phases, then why it stopped (length | eos |
// context full | interrupted). docs/CLI.md documents it; scripts grep "prefill:", "generation:".
#include <string>

#include "runtime/generate.h"

namespace ds4::tools {

std::string speed_line(const runtime::GenerateStats &st);

}  // namespace ds4::tools
