#include "tokenizer/vocabulary.h"

#include <fmt/format.h>

#include "common/error.h"
#include "gguf/gguf_file.h"

namespace ds4::tokenizer {

Vocabulary load_vocabulary(const gguf::File &file) {
    const std::string model = file.get_string_or("tokenizer.ggml.model", "gpt2");
    if (model != "gpt2") {
        throw Error(
            fmt::format("{}: tokenizer.ggml.model is '{}', only byte-level BPE ('gpt2') "
                        "is supported",
                        file.path(), model));
    }
    const std::string pre = file.get_string_or("tokenizer.ggml.pre", "joyai-llm");
    if (pre != "joyai-llm" && pre != "deepseek-v3") {
        throw Error(
            fmt::format("{}: tokenizer.ggml.pre is '{}', only the DeepSeek V3/V4 "
                        "pre-tokenizer ('joyai-llm', 'deepseek-v3') is implemented",
                        file.path(), pre));
    }
    Vocabulary v;
    v.tokens = file.get_string_array("tokenizer.ggml.tokens");
    v.merges = file.get_string_array("tokenizer.ggml.merges");
    if (file.has("tokenizer.ggml.token_type")) {
        const std::vector<int64_t> types = file.get_int_array("tokenizer.ggml.token_type");
        if (types.size() != v.tokens.size()) {
            throw Error(fmt::format("{}: tokenizer.ggml.token_type has {} entries for {} tokens",
                                    file.path(), types.size(), v.tokens.size()));
        }
        v.types.assign(types.begin(), types.end());
    }
    if (v.tokens.empty())
        throw Error(fmt::format("{}: tokenizer.ggml.tokens is empty", file.path()));
    return v;
}

}  // namespace ds4::tokenizer
