#pragma once
// One server-sent event of the streams that name their events (Anthropic messages, OpenAI
// Responses): `event: NAME` and `data: JSON`, data.type being NAME.
#include <nlohmann/json.hpp>
#include <string>

namespace ds4::server {

struct SseEvent {
    std::string name;
    nlohmann::json data;
};

}  // namespace ds4::server
