#pragma once
// The server's session slots over one loaded model (docs/SERVER.md, Sessions and KV reuse):
// prompts rendered and tokenized outside any lock, a request waiting in line (SlotScheduler) for
// the free slot that can resume the longest prefix of its prompt, the slots taking turns on the
// one compute engine, text decoded (UTF-8 safe), split into reasoning and content at the think
// tokens, tool calls taken out of the content when the request has tools, and cut at stop
// sequences.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "runtime/session.h"
#include "server/request.h"
#include "server/slots.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace ds4::server {

// What one step produced: text (at most one of the two is non-empty) and tool-call events.
struct Delta {
    std::string content, reasoning;
    std::vector<ToolEvent> tools;
};

struct GenResult {
    std::string content, reasoning;
    std::vector<tokenizer::ToolCall> tool_calls;  // ids left empty: the API layer assigns them
    // The last call was closed where its invoke broke (ToolCallTracker::cut); finish_reason is
    // then "length" when the token limit or a full context cut it.
    bool tool_call_cut = false;
    std::string finish_reason;  // "stop" | "length" | "tool_calls"
    size_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    size_t reasoning_tokens = 0;     // of completion_tokens, those chosen inside a think block
    std::vector<int32_t> generated;  // every token chosen, in order (completion_tokens of them)
    runtime::StopReason stop = runtime::StopReason::Length;
    bool stop_sequence = false;  // a stop sequence ended the text
    std::string matched_stop;    // which one
    bool disconnected = false;   // on_delta or gone() reported the client gone
    int slot = -1;               // the slot it ran on; -1: it left the queue without running
    double prefill_seconds = 0, generation_seconds = 0;
};

inline constexpr size_t kDefaultQueue = 16;  // requests that may wait for a slot

class KvDiskCache;

class Engine {
  public:
    using Ticket = SlotScheduler::Ticket;

    // `shutdown`, when set, stops generations in progress and empties the queue (the server is
    // going down). Each of the n_slots slots is a Session of `so` (its own KV cache).
    Engine(runtime::Model &model, const tokenizer::Tokenizer &tok, runtime::SessionOptions so,
           int64_t default_max_tokens, const std::atomic<bool> *shutdown, size_t n_slots = 1,
           size_t max_queue = kDefaultQueue);
    ~Engine();

    // The prompt tokens of a request: chat messages rendered as docs/SERVER.md says (no default
    // system text) followed by the assistant prefill, a completion prompt as `ds4 -p` renders it.
    std::vector<int32_t> tokenize(const GenRequest &r) const;
    // The same, but throws ApiError 400 (context_length_exceeded) when the prompt leaves no room
    // in the context; its `param` is `param` when given, else "messages" or "prompt".
    std::vector<int32_t> prompt_tokens(const GenRequest &r, const char *param = nullptr) const;

    // A place in line for a request, or nullopt when every slot is busy and the queue is full.
    std::optional<Ticket> enter() { return sched_.enter(); }

    // Runs one request: waits in line with `ticket` for a slot, resumes the slot's longest
    // reusable prefix of the prompt and evaluates the rest, generates, and frees the slot.
    // on_start(res), when given, is called once the slot is taken and the reused prefix chosen
    // (res.slot, res.prompt_tokens and res.cached_tokens are set), before the prefill. on_start
    // and on_delta(d) return false when the client is gone, and gone() (polled while queued,
    // between prefill chunks and before each token) returns true: generation then stops. A
    // request that leaves the queue without running (its client gone, or shutdown) comes back
    // with slot -1. Throws ds4::Error for an engine failure (the slot is reset).
    GenResult run(Ticket &ticket, const GenRequest &r, const std::vector<int32_t> &prompt,
                  const std::function<bool(const Delta &)> &on_delta,
                  const std::function<bool(const GenResult &)> &on_start = {},
                  const std::function<bool()> &gone = {});

    // The disk KV cache (docs/SERVER.md, Disk KV cache), or null for none: set before serving.
    // With one, run() restores a checkpoint longer than a slot's own reusable prefix and saves
    // at the cache's save points during the prefill and generation.
    void set_disk_cache(KvDiskCache *disk) { disk_ = disk; }
    // Saves each slot's live session of at least --kv-cache-min-tokens tokens (the shutdown
    // checkpoints). Call once no request runs any more; errors are logged by the cache.
    void store_live_sessions();

    uint32_t ctx() const { return ctx_; }
    size_t n_slots() const { return slots_.size(); }
    SlotScheduler::Status status() const { return sched_.status(); }
    int64_t default_max_tokens() const { return default_max_tokens_; }
    const tokenizer::Tokenizer &tokenizer() const { return tok_; }

  private:
    struct Slot;
    GenResult run_on(Slot &s, const GenRequest &r, const std::vector<int32_t> &prompt,
                     const std::function<bool(const Delta &)> &on_delta,
                     const std::function<bool(const GenResult &)> &on_start,
                     const std::function<bool()> &stop_requested, GenResult res);

    const tokenizer::Tokenizer &tok_;
    int64_t default_max_tokens_;
    const std::atomic<bool> *shutdown_;
    std::vector<std::unique_ptr<Slot>> slots_;
    uint32_t ctx_;
    SlotScheduler sched_;
    // One slot evaluates at a time: the CPU backend's thread pool (one per Model) refuses
    // concurrent loops, and the expert source is shared (docs/SERVER.md, Concurrency).
    FairTurn turn_;
    KvDiskCache *disk_ = nullptr;
};

}  // namespace ds4::server
