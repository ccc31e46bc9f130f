#pragma once
// What the modes of ds4-test share: the options, the vocabulary, and the model the
// self-consistency modes run on. By default that model is a tiny synthetic one (the "tiny" shape
// of synthetic_model.h with the real vocabulary, q8_0) written to a temporary folder on first
// use, so every mode that needs no GPU and no downloaded weights runs anywhere, CI included.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "temp_dir.h"
#include "tokenizer/tokenizer.h"

namespace ds4::test {

struct TestOptions {
    std::string model;                  // --logprob-vectors weights ("" = none: those checks skip)
    std::string vocab;                  // tokenizer for the weights-free checks
    std::string vector_file;            // official.vec
    std::vector<std::string> cases;     // only these vector cases ("" = all)
    bool known_mismatch_cases = false;  // also run the cases the reference skips
    std::string consistency_model;      // --prefill-decode / --kv-roundtrip ("" = tiny synthetic)
    std::string fixtures_dir;           // tests/model/fixtures
    std::string fixtures_gguf_dir;  // make_tiny_models.py --gguf-dir output ("" = committed only)
    int threads = 0;                // 0 = all cores
    // The backend the modes' models run on (--backend); --backend-parity runs both.
    runtime::Backend backend = runtime::Backend::Cpu;
    // --gpus, --layer-split, --split: where the CUDA models' layers go (the CPU models' stay
    // whole).
    std::vector<int> gpus;
    std::vector<uint32_t> layer_starts;
    runtime::GpuSplit split = runtime::GpuSplit::Layers;
    // --ssd-streaming*: the CPU models of the modes stream their routed experts (the popularity
    // is kept only under --ssd-streaming-cache-dir when given).
    runtime::StreamingModelOptions streaming;
    std::string streaming_cache_dir;
    // The modes named on the command line (not those run by --all or by default): a mode whose
    // capability is missing here fails when named, and is skipped otherwise.
    std::set<std::string> named_modes;
    // --backend-parity: the prompt (none: its own), the greedy steps and the logits' bound.
    std::optional<std::string> prompt;
    uint32_t parity_steps = 64;
    double parity_bound = 1e-3;
};

class TestEnv {
  public:
    explicit TestEnv(TestOptions opts) : opts_(std::move(opts)) {}

    const TestOptions &opts() const { return opts_; }
    // The tokenizer of opts().vocab, loaded once; throws ds4::Error when it cannot be read.
    const tokenizer::Tokenizer &vocab();
    // The model of the self-consistency modes on opts().backend, loaded (and for the default,
    // written) once.
    runtime::Model &consistency_model();
    // That model's file (for the default, written on first use).
    const std::string &consistency_model_path();
    // A model loaded for the modes (tools::load_model: the upload shown on stderr, a backend that
    // cannot start thrown as tools::BackendError).
    std::unique_ptr<runtime::Model> load_model(const std::string &path, runtime::Backend backend);
    // One line saying which model that is.
    const std::string &consistency_model_description() const { return description_; }

  private:
    TestOptions opts_;
    std::optional<tokenizer::Tokenizer> vocab_;
    std::unique_ptr<tools::TempDir> tmp_;
    std::string path_;
    std::unique_ptr<runtime::Model> model_;
    std::string description_;
};

}  // namespace ds4::test
