#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace ds4::server {

namespace {

using nlohmann::json;

// Model output may hold invalid UTF-8 (byte-level tokens): it is replaced, never thrown.
std::string dump(const json &j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(httplib::Response &res, int status, const json &body) {
    res.status = status;
    res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response &res, const ApiError &e) {
    send_json(res, e.status, error_body(e));
}

json usage_json(const GenResult &g) {
    return {{"prompt_tokens", g.prompt_tokens},
            {"completion_tokens", g.completion_tokens},
            {"total_tokens", g.prompt_tokens + g.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", g.cached_tokens}}}};
}

const char *default_message(int status) {
    switch (status) {
        case 400:
            return "bad HTTP request";
        case 404:
            return "unknown endpoint";
        case 405:
            return "method not allowed";
        case 413:
            return "request body too large";
        case 414:
            return "request URI too long";
        default:
            return status >= 500 ? "internal server error" : "request failed";
    }
}

const char *default_code(int status) {
    switch (status) {
        case 404:
            return "not_found";
        case 413:
            return "request_too_large";
        default:
            return status >= 500 ? "internal_error" : "invalid_request";
    }
}

bool same_key(const std::string &a, const std::string &b) {
    // Length-independent of where the first difference is.
    unsigned diff = a.size() != b.size();
    for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(a[i] ^ (i < b.size() ? b[i] : 0));
    return diff == 0;
}

}  // namespace

struct HttpServer::Impl {
    Engine &engine;
    ServerOptions opts;
    httplib::Server srv;
    std::atomic<uint64_t> seq{0};

    Impl(Engine &e, ServerOptions o) : engine(e), opts(std::move(o)) {}

    json model_object() const {
        return {{"id", opts.model_id},
                {"object", "model"},
                {"created", 1767225600},
                {"owned_by", "ds4cpp"},
                {"context_length", engine.ctx()},
                {"max_completion_tokens", opts.max_completion_tokens},
                {"aliases", opts.model_aliases}};
    }

    std::string model_name(const GenRequest &r) const {
        return r.model.empty() ? opts.model_id : r.model;
    }

    void log(const char *path, const GenResult &g) const {
        fmt::print(stderr,
                   "ds4-server: {} prompt {} tokens ({} cached, {:.3f} s), completion {} tokens "
                   "({:.3f} s), finish {}{}{}\n",
                   path, g.prompt_tokens, g.cached_tokens, g.prefill_seconds, g.completion_tokens,
                   g.generation_seconds, g.finish_reason, g.stop_sequence ? " (stop sequence)" : "",
                   g.disconnected ? ", client disconnected" : "");
    }

    json chat_message(const GenResult &g) const {
        json m = {{"role", "assistant"}, {"content", g.content}};
        if (!g.reasoning.empty()) m["reasoning_content"] = g.reasoning;
        return m;
    }

    // The streamed chunk of a delta (or of the end, with finish_reason).
    json chunk(Endpoint ep, const std::string &id, int64_t created, const std::string &model,
               const json &delta_or_text, const json &finish) const {
        if (ep == Endpoint::Chat)
            return {{"id", id},
                    {"object", "chat.completion.chunk"},
                    {"created", created},
                    {"model", model},
                    {"choices", json::array({{{"index", 0},
                                              {"delta", delta_or_text},
                                              {"logprobs", nullptr},
                                              {"finish_reason", finish}}})}};
        return {{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({{{"index", 0},
                                          {"text", delta_or_text},
                                          {"logprobs", nullptr},
                                          {"finish_reason", finish}}})}};
    }

    void generate(const httplib::Request &req, httplib::Response &res, Endpoint ep) {
        const char *path = ep == Endpoint::Chat ? "/v1/chat/completions" : "/v1/completions";
        auto r =
            std::make_shared<GenRequest>(ep == Endpoint::Chat ? parse_chat_request(req.body)
                                                              : parse_completion_request(req.body));
        auto prompt = std::make_shared<std::vector<int32_t>>(engine.prompt_tokens(*r));
        const std::string id =
            fmt::format("{}-{}", ep == Endpoint::Chat ? "chatcmpl" : "cmpl", ++seq);
        const int64_t created = std::time(nullptr);
        const std::string model = model_name(*r);

        if (!r->stream) {
            const GenResult g = engine.run(*r, *prompt, [](const Delta &) { return true; });
            log(path, g);
            json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", g.finish_reason}};
            if (ep == Endpoint::Chat)
                choice["message"] = chat_message(g);
            else
                choice["text"] = g.reasoning + g.content;
            send_json(res, 200,
                      {{"id", id},
                       {"object", ep == Endpoint::Chat ? "chat.completion" : "text_completion"},
                       {"created", created},
                       {"model", model},
                       {"choices", json::array({choice})},
                       {"usage", usage_json(g)}});
            return;
        }

        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", [this, r, prompt, id, created, model,
                                                               ep, path](size_t,
                                                                         httplib::DataSink &sink) {
            auto send_raw = [&](const std::string &s) {
                return sink.is_writable() && sink.write(s.data(), s.size());
            };
            auto send = [&](const json &j) { return send_raw("data: " + dump(j) + "\n\n"); };
            try {
                const json first =
                    ep == Endpoint::Chat ? json{{"role", "assistant"}, {"content", ""}} : json("");
                if (ep == Endpoint::Chat && !send(chunk(ep, id, created, model, first, nullptr)))
                    return false;
                const GenResult g = engine.run(*r, *prompt, [&](const Delta &d) {
                    if (ep == Endpoint::Completion)
                        return send(
                            chunk(ep, id, created, model, d.reasoning + d.content, nullptr));
                    json delta = json::object();
                    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
                    if (!d.content.empty()) delta["content"] = d.content;
                    return send(chunk(ep, id, created, model, delta, nullptr));
                });
                log(path, g);
                if (g.disconnected) return false;
                const json end = ep == Endpoint::Chat ? json::object() : json("");
                send(chunk(ep, id, created, model, end, g.finish_reason));
                if (r->include_usage) {
                    json u = chunk(ep, id, created, model, end, nullptr);
                    u["choices"] = json::array();
                    u["usage"] = usage_json(g);
                    send(u);
                }
                send_raw("data: [DONE]\n\n");
            } catch (const std::exception &e) {
                fmt::print(stderr, "ds4-server: {}: generation failed: {}\n", path, e.what());
                send_raw("event: error\ndata: " +
                         dump(error_body(500, e.what(), "internal_error")) + "\n\n");
            } catch (...) {
                send_raw("event: error\ndata: " +
                         dump(error_body(500, "generation failed", "internal_error")) + "\n\n");
            }
            sink.done();
            return true;
        });
    }

    // Runs a handler body: an ApiError is its JSON answer; anything else is an internal failure.
    template <typename F>
    void guarded(httplib::Response &res, F &&body) {
        try {
            body();
        } catch (const ApiError &e) {
            send_error(res, e);
        } catch (const std::bad_alloc &) {
            send_json(res, 500, error_body(500, "out of memory", "internal_error"));
        } catch (const std::exception &e) {
            fmt::print(stderr, "ds4-server: internal error: {}\n", e.what());
            send_json(res, 500, error_body(500, e.what(), "internal_error"));
        } catch (...) {
            send_json(res, 500, error_body(500, "internal error", "internal_error"));
        }
    }

    void setup() {
        srv.set_payload_max_length(kMaxBodyBytes);
        // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server
        // bind the port of a running one (and share its connections) instead of failing.
        srv.set_socket_options([](int sock) {
            int yes = 1;
            setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void *>(&yes),
                       sizeof(yes));
        });
        if (opts.cors)
            srv.set_default_headers({{"Access-Control-Allow-Origin", "*"},
                                     {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                                     {"Access-Control-Allow-Headers", "*"}});
        srv.set_pre_routing_handler([this](const httplib::Request &req, httplib::Response &res) {
            if (opts.api_key.empty() || req.method == "OPTIONS" || req.path == "/health")
                return httplib::Server::HandlerResponse::Unhandled;
            const std::string auth = req.get_header_value("Authorization");
            const std::string want = "Bearer " + opts.api_key;
            if (same_key(auth, want)) return httplib::Server::HandlerResponse::Unhandled;
            send_json(res, 401,
                      error_body(401,
                                 auth.empty() ? "missing API key: send Authorization: Bearer KEY"
                                              : "invalid API key",
                                 "invalid_api_key"));
            return httplib::Server::HandlerResponse::Handled;
        });
        srv.set_error_handler([](const httplib::Request &, httplib::Response &res) {
            if (!res.body.empty() || res.status < 400) return;
            send_json(
                res, res.status,
                error_body(res.status, default_message(res.status), default_code(res.status)));
        });
        srv.set_exception_handler(
            [](const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
                std::string what = "internal error";
                try {
                    if (ep) std::rethrow_exception(ep);
                } catch (const std::exception &e) {
                    what = e.what();
                } catch (...) {
                }
                send_json(res, 500, error_body(500, what, "internal_error"));
            });
        srv.Options(".*",
                    [](const httplib::Request &, httplib::Response &res) { res.status = 204; });
        srv.Get("/health", [this](const httplib::Request &, httplib::Response &res) {
            send_json(res, 200, {{"status", "ok"}, {"model", opts.model_id}});
        });
        srv.Get("/v1/models", [this](const httplib::Request &, httplib::Response &res) {
            guarded(res, [&] {
                send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
            });
        });
        srv.Get("/v1/models/(.+)", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(res, [&] {
                const std::string want = req.matches[1];
                bool known = want == opts.model_id;
                for (const auto &a : opts.model_aliases) known = known || want == a;
                if (!known)
                    throw ApiError(404, fmt::format("model '{}' not found", want),
                                   "model_not_found");
                send_json(res, 200, model_object());
            });
        });
        srv.Post("/v1/chat/completions",
                 [this](const httplib::Request &req, httplib::Response &res) {
                     guarded(res, [&] { generate(req, res, Endpoint::Chat); });
                 });
        srv.Post("/v1/completions", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(res, [&] { generate(req, res, Endpoint::Completion); });
        });
    }
};

HttpServer::HttpServer(Engine &engine, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, std::move(opts))) {
    impl_->setup();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
    if (impl_->opts.port == 0) return impl_->srv.bind_to_any_port(impl_->opts.host);
    return impl_->srv.bind_to_port(impl_->opts.host, impl_->opts.port) ? impl_->opts.port : -1;
}

bool HttpServer::listen() {
    return impl_->srv.listen_after_bind();
}

void HttpServer::stop() {
    impl_->srv.stop();
}

}  // namespace ds4::server
