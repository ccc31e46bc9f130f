// libFuzzer target for ds4-server's request side: the first byte picks a parser (OpenAI chat,
// OpenAI completions, Anthropic messages, Anthropic count_tokens, OpenAI responses) and the rest is
// the request body; or it picks the generated-text tool-call tracker, which is fed the rest in
// pieces whose sizes the next bytes choose. A parser must return a request or throw ApiError (the
// 4xx the handler sends); anything else escaping it (a json type error, std::out_of_range, ...)
// would be a 500, and aborts here. The tracker must never throw: generated text is not an input
// error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/responses_request.h"
#include "server/tool_calls.h"

namespace {

void parse(uint8_t which, std::string_view body) {
    using namespace ds4::server;
    try {
        switch (which % 5) {
            case 0:
                (void)parse_chat_request(body);
                break;
            case 1:
                (void)parse_completion_request(body);
                break;
            case 2:
                (void)parse_messages_request(body);
                break;
            case 3:
                (void)parse_messages_request(body, MessagesBody::CountTokens);
                break;
            default:
                (void)parse_responses_request(body);
        }
    } catch (const ApiError &) {
    } catch (const std::exception &e) {
        std::fprintf(stderr, "parser %d: not an ApiError: %s\n", which % 5, e.what());
        std::abort();
    }
}

void track(const uint8_t *data, size_t size) {
    if (size == 0) return;
    ds4::server::ToolCallTracker t;
    const bool prefilled = data[0] & 1;  // the answer starts with silent text (a prefill)
    size_t i = 1;
    for (bool first = true; i < size && !t.done(); first = false) {
        const size_t n = std::min<size_t>(size - i - 1, 1 + data[i] % 17);
        const std::string_view piece(reinterpret_cast<const char *>(data + i + 1), n);
        (void)(first && prefilled ? t.push_silent(piece) : t.push(piece));
        i += 1 + n;
    }
    (void)t.finish();
    for (const auto &c : t.calls()) (void)(c.name.size() + c.arguments.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const std::string_view body(reinterpret_cast<const char *>(data + 1), size - 1);
    if (data[0] < 200)
        parse(data[0], body);
    else
        track(data + 1, size - 1);
    return 0;
}
