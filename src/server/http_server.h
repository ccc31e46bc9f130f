#pragma once
// The HTTP layer of ds4-server (docs/SERVER.md): routes, API key, CORS, body limit, JSON errors,
// non-streaming and SSE responses in the OpenAI (chat, completions, Responses) and Anthropic
// shapes, over an Engine.
#include <atomic>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/responses_store.h"
#include "server/trace.h"

namespace ds4::server {

inline constexpr size_t kMaxBodyBytes = 16u << 20;  // 16 MiB; larger bodies get 413

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;      // 0 = any free port
    std::string api_key;  // empty = no authentication; else a bearer token or x-api-key
    bool cors = false;
    std::string model_id;                    // the model file's base name without .gguf
    std::vector<std::string> model_aliases;  // also answered by GET /v1/models/{id}
    int64_t max_completion_tokens = 0;       // reported in the model object
    double keepalive_seconds = 5;       // SSE `: keep-alive` after this much silence; 0 = never
    time_t read_timeout_seconds = 10;   // reading a request (each wait for bytes)
    time_t write_timeout_seconds = 30;  // each wait for the client to take bytes
    time_t idle_timeout_seconds = 5;    // an idle keep-alive connection is closed after this
    int retry_after_seconds = 1;        // the Retry-After of a 503 (queue full)
    size_t http_threads = 0;            // 0 = max(16, 2 * (slots + queue) + 8)
    size_t responses_store = kDefaultResponsesStore;  // stored /v1/responses answers kept
    TraceFile *trace = nullptr;  // --trace: a record per generation request; null = none
};

class HttpServer {
  public:
    HttpServer(Engine &engine, ServerOptions opts);
    ~HttpServer();
    // Binds; returns the port bound (the free one chosen for port 0), or -1 when the address
    // cannot be bound.
    int bind();
    // Serves until stop(); returns false when the listener failed.
    bool listen();
    // Safe from another thread.
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ds4::server
