#include "tokenizer/stream_decoder.h"

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace ds4::tokenizer {

std::string StreamDecoder::push(int32_t id) {
    pending_ += tokenizer_.token_bytes(id);
    const size_t ready = utf8_complete_prefix(pending_);
    std::string out = pending_.substr(0, ready);
    pending_.erase(0, ready);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace ds4::tokenizer
