#pragma once
// Interactive multi-turn chat (docs/SURFACES.md 2.8): one live session whose KV cache carries over
// from turn to turn, so each turn prefills only its new tokens.
#include "cli_options.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace ds4::cli {

int run_repl(runtime::Model &model, const tokenizer::Tokenizer &tok, Options opt);

}  // namespace ds4::cli
