#include "test_env.h"

#include <fmt/format.h>

#include "gguf/gguf_file.h"
#include "model/synthetic_model.h"
#include "model_load.h"
#include "ssd_streaming_option.h"

namespace ds4::test {

const tokenizer::Tokenizer &TestEnv::vocab() {
    if (!vocab_) vocab_.emplace(tokenizer::Tokenizer::from_gguf(opts_.vocab));
    return *vocab_;
}

const std::string &TestEnv::consistency_model_path() {
    if (!path_.empty()) return path_;
    std::string path = opts_.consistency_model;
    if (path.empty()) {
        // Seed and mix are fixed: the checks compare the engine with itself, so any valid
        // weights do, and the same ones every run make a failure reproducible.
        tmp_ = std::make_unique<tools::TempDir>("ds4-test-");
        path = tmp_->path() + "/tiny-q8_0.gguf";
        const auto vocab = gguf::File::open(opts_.vocab);
        const auto n_tokens =
            static_cast<uint32_t>(vocab->get_array("tokenizer.ggml.tokens").items.size());
        model::write_synthetic_model(model::shape_preset("tiny", n_tokens), model::QuantMix::Q8_0,
                                     1, *vocab, path, false);
        description_ = "tiny synthetic model (q8_0, real vocabulary), written for this run";
    } else {
        description_ = path;
    }
    path_ = path;
    return path_;
}

std::unique_ptr<runtime::Model> TestEnv::load_model(const std::string &path,
                                                    runtime::Backend backend) {
    runtime::ModelOptions mo{.n_threads = opts_.threads, .backend = backend};
    if (backend == runtime::Backend::Cuda) {
        mo.gpus = opts_.gpus;
        mo.layer_starts = opts_.layer_starts;
        mo.split = opts_.split;
    }
    if (opts_.streaming.enabled && backend == runtime::Backend::Cpu) {
        mo.streaming = opts_.streaming;
        if (!opts_.streaming_cache_dir.empty())
            mo.streaming.popularity_file =
                runtime::popularity_file_for(opts_.streaming_cache_dir, path);
    }
    auto model = tools::load_model("ds4-test", path, mo);
    tools::print_ssd_streaming_startup("ds4-test", *model);
    return model;
}

runtime::Model &TestEnv::consistency_model() {
    if (model_) return *model_;
    model_ = load_model(consistency_model_path(), opts_.backend);
    const auto &hp = model_->hparams();
    std::string ratios;
    for (uint32_t r : hp.compress_ratio)
        ratios += fmt::format("{}{}", ratios.empty() ? "" : ",", r);
    description_ += fmt::format(": {} layers, window {}, compress ratios [{}], indexer top-k {}",
                                hp.n_layer, hp.sliding_window, ratios, hp.idx_top_k);
    if (model_->device())
        description_ += fmt::format(", backend cuda ({})", model_->device()->device_name());
    return *model_;
}

}  // namespace ds4::test
