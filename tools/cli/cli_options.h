#pragma once
// The ds4 CLI's options (docs/SURFACES.md 2.2), shared by the one-shot and interactive modes.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device_weights.h"
#include "runtime/expert_streaming.h"
#include "runtime/gpu_placement.h"
#include "runtime/sampler.h"
#include "tokenizer/chat_prompt.h"

namespace ds4::cli {

struct Options {
    std::string prompt, prompt_file;
    std::string system = std::string(tokenizer::kDefaultSystemText);
    std::string model = "ds4flash.gguf";
    uint32_t ctx = 32768;
    int64_t n_predict = 50000;
    int threads = 0;
    runtime::Backend backend = runtime::Backend::Cpu;
    std::vector<int> gpus;                                // --gpus
    std::vector<uint32_t> layer_starts;                   // --layer-split
    runtime::GpuSplit split = runtime::GpuSplit::Layers;  // --split
    runtime::StreamingModelOptions streaming;             // --ssd-streaming*
    uint32_t chunk = 0;  // 0: the backend's (runtime::default_chunk)
    runtime::SamplerParams sampling;
    tokenizer::ThinkMode think = tokenizer::ThinkMode::kHigh;
    bool qat_sim = true;
    bool strict = false;
    std::string dump_logprobs;
    int logprobs_top_k = 20;
};

}  // namespace ds4::cli
