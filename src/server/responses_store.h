#pragma once
// The stored responses of POST /v1/responses (docs/SERVER.md, Responses): what `store` keeps, so
// that GET /v1/responses/{id} returns a response, DELETE removes it, and previous_response_id
// continues its conversation. In memory, bounded to the last `capacity` responses stored (the
// oldest evicted first; 0 stores nothing). Thread-safe.
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/chat_render.h"

namespace ds4::server {

inline constexpr size_t kDefaultResponsesStore = 1000;

// One response's part of a conversation: its input and its output as chat messages, after those
// of the response it continued. A chain of responses shares its turns, so a long conversation
// costs each turn once.
struct ResponseTurn {
    std::shared_ptr<const ResponseTurn> previous;
    std::vector<tokenizer::ChatMessage> messages;
    ResponseTurn(std::shared_ptr<const ResponseTurn> prev, std::vector<tokenizer::ChatMessage> m)
        : previous(std::move(prev)), messages(std::move(m)) {}
    ~ResponseTurn();  // unlinks the chain without recursion
};

// The messages of the chain that ends at `last`, oldest first (none for nullptr).
std::vector<tokenizer::ChatMessage> conversation(const ResponseTurn *last);

class ResponsesStore {
  public:
    explicit ResponsesStore(size_t capacity) : capacity_(capacity) {}

    struct Entry {
        nlohmann::json response;  // the response object, as GET returns it
        std::shared_ptr<const ResponseTurn> turn;
        nlohmann::json input_items;  // its own input, as GET .../input_items lists it
    };
    // Stores (or replaces) `id`, evicting the oldest entries beyond the capacity.
    void put(const std::string &id, Entry e);
    std::optional<Entry> get(const std::string &id) const;
    // Removes `id`; false when it is not stored. Responses that continued it keep their history
    // (their turns share it), but `id` can no longer be fetched or continued.
    bool erase(const std::string &id);
    size_t size() const;
    size_t capacity() const { return capacity_; }

  private:
    mutable std::mutex mu_;
    size_t capacity_;
    std::deque<std::string> order_;  // oldest first
    std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ds4::server
