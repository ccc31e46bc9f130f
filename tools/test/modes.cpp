#include "modes.h"

namespace ds4::test {

const std::vector<Mode> &all_modes() {
    static const std::vector<Mode> modes = {
        {"logprob-vectors",
         "official vectors: prompt token counts on the vocabulary (always); greedy tokens and "
         "logprobs against -m / DS4_TEST_MODEL (skipped without a model)",
         run_logprob_vectors},
        {"prefill-decode",
         "batched prefill then decode equals token-by-token decode, bit for bit, around the "
         "model's window, compression ratios, indexer start and chunk sizes",
         run_prefill_decode},
        {"kv-roundtrip",
         "a snapshot restored (in the same or a fresh session) gives identical next logits",
         run_kv_roundtrip},
        {"transformers-parity",
         "the committed transformers fixtures (tests/model/fixtures) on their tiny models",
         run_transformers_parity},
        {"ssd-streaming-cache-pressure",
         "SSD expert streaming at the smallest cache budgets (floor, 2x floor, 10%, 25%), cold "
         "and preloaded, vs resident: prefill and decode logits bit-identical (a synthetic q2 "
         "model, and -m / DS4_TEST_MODEL when set); with --cuda the device tier at those "
         "budgets over a small and a full host tier, vs resident CUDA",
         run_ssd_streaming_cache_pressure},
        {"backend-parity",
         "CPU vs CUDA on one prompt (-p / --prompt-file, else its own) and -n greedy steps "
         "(default 64): top-1 equal at every step, max |cpu - cuda| / max |cpu| within "
         "--parity-bound; without CUDA or a device: fails when named, skipped under --all",
         run_backend_parity},
        {"server", "in-process server API checks (not built yet: skipped)", run_server},
    };
    return modes;
}

}  // namespace ds4::test
