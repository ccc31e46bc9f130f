#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/api_error.h"
#include "server/connection_watch.h"
#include "server/responses_request.h"
#include "server/responses_response.h"
#include "server/tool_calls.h"
#include "server/webui.h"

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

// Whose error shape a path answers with: Anthropic's under /v1/messages, else OpenAI's.
enum class Api { OpenAI, Anthropic };

Api api_of(const std::string &path) {
    return path.starts_with("/v1/messages") ? Api::Anthropic : Api::OpenAI;
}

json error_json(Api api, const ApiError &e) {
    return api == Api::Anthropic ? anthropic_error_body(e.status, e.what(), e.extra)
                                 : error_body(e);
}

void send_error(httplib::Response &res, Api api, const ApiError &e) {
    send_json(res, e.status, error_json(api, e));
}

// An internal failure: typed server_error (OpenAI) or api_error (Anthropic) by its status.
ApiError internal_error(const std::string &message) {
    return ApiError(500, message, "internal_error", "");
}

std::string sse_data(const json &j) {
    return "data: " + dump(j) + "\n\n";
}

std::string sse_event(const std::string &name, const json &j) {
    return "event: " + name + "\n" + sse_data(j);
}

// Writes one piece of a stream; false when the client is gone.
using SendFn = std::function<bool(const std::string &)>;
using GoneFn = std::function<bool()>;

// Writes named events in order; false when the client is gone.
bool send_events(const SendFn &send, const std::vector<SseEvent> &events) {
    for (const SseEvent &e : events)
        if (!send(sse_event(e.name, e.data))) return false;
    return true;
}

// The writer of one SSE stream. Writes are serialized, and a comment `: keep-alive` is written
// whenever the stream has been silent for `interval` (a request waiting in line, a long prefill,
// other slots taking their turns), so that proxies and SDKs do not time out. A failed write means
// the client is gone: every later send fails at once.
class SseWriter {
  public:
    SseWriter(httplib::DataSink &sink, double interval) : sink_(sink) {
        if (interval > 0)
            ticker_ = std::thread([this, d = std::chrono::duration<double>(interval)] {
                tick(std::chrono::duration_cast<Clock::duration>(d));
            });
    }
    ~SseWriter() { stop(); }
    // Ends the keep-alive comments (before the stream's last chunk is written).
    void stop() {
        {
            std::lock_guard lock(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (ticker_.joinable()) ticker_.join();
    }
    bool send(const std::string &s) {
        std::lock_guard lock(mu_);
        return write(s);
    }
    bool gone() {
        std::lock_guard lock(mu_);
        return failed_;
    }

  private:
    using Clock = std::chrono::steady_clock;
    bool write(const std::string &s) {  // under mu_
        if (!failed_ && !(sink_.is_writable() && sink_.write(s.data(), s.size()))) failed_ = true;
        last_ = Clock::now();
        return !failed_;
    }
    void tick(Clock::duration interval) {
        std::unique_lock lock(mu_);
        while (!stopping_ && !failed_) {
            const auto due = last_ + interval;
            if (Clock::now() >= due)
                write(": keep-alive\n\n");
            else
                cv_.wait_until(lock, due);
        }
    }

    httplib::DataSink &sink_;
    std::mutex mu_;
    std::condition_variable cv_;
    Clock::time_point last_ = Clock::now();
    bool failed_ = false, stopping_ = false;
    std::thread ticker_;
};

// Answers with an SSE stream: body(send, gone) writes it and returns false when the client went
// away; gone() says whether it has (a failed write, or the connection closed). An exception from
// body ends the stream with an `event: error` in the API's shape.
void stream_events(httplib::Response &res, Api api, const char *path, double keepalive,
                   std::shared_ptr<ConnectionWatch> watch,
                   std::function<bool(const SendFn &, const GoneFn &)> body) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [api, path, keepalive, watch = std::move(watch),
                              body = std::move(body)](size_t, httplib::DataSink &sink) {
            SseWriter writer(sink, keepalive);
            const SendFn send = [&](const std::string &s) { return writer.send(s); };
            const GoneFn gone = [&] { return writer.gone() || watch->closed(); };
            std::string failure;
            try {
                if (!body(send, gone)) return false;
            } catch (const std::exception &e) {
                failure = e.what();
            } catch (...) {
                failure = "generation failed";
            }
            if (!failure.empty()) {
                fmt::print(stderr, "ds4-server: {}: generation failed: {}\n", path, failure);
                send(sse_event("error", error_json(api, internal_error(failure))));
            }
            writer.stop();
            sink.done();
            return true;
        });
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

// A GET of a file of the chat page (docs/SERVER.md, Chat page). The page holds no data, so it
// loads without the API key; its own API calls carry the key the user enters.
bool is_page_request(const httplib::Request &req) {
    return (req.method == "GET" || req.method == "HEAD") && webui_asset(req.path).has_value();
}

// httplib routes are regular expressions: the file name with every character but letters and
// digits escaped.
std::string page_route(std::string_view name) {
    std::string route = "/";
    for (const char c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) route += '\\';
        route += c;
    }
    return route;
}

void send_page_file(httplib::Response &res, const WebAsset &a) {
    // no-cache: a rebuilt server's page is fetched again, not taken from the browser's cache. The
    // policy allows this origin only (no inline script, nothing from elsewhere).
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header(
        "Content-Security-Policy",
        "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'");
    res.set_content(a.body.data(), a.body.size(), std::string(a.content_type));
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

    ResponsesStore stored;

    Impl(Engine &e, ServerOptions o)
        : engine(e), opts(std::move(o)), stored(opts.responses_store) {}

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
        if (g.slot < 0) {
            fmt::print(stderr, "ds4-server: {} left the queue: {}\n", path,
                       g.disconnected ? "client disconnected" : "shutting down");
            return;
        }
        fmt::print(stderr,
                   "ds4-server: {} slot {} prompt {} tokens ({} cached, {:.3f} s), completion {} "
                   "tokens ({:.3f} s), finish {}{}{}\n",
                   path, g.slot, g.prompt_tokens, g.cached_tokens, g.prefill_seconds,
                   g.completion_tokens, g.generation_seconds, g.finish_reason,
                   g.stop_sequence ? " (stop sequence)" : "",
                   g.disconnected ? ", client disconnected" : "");
    }

    // A place in line for the request; 503 with Retry-After when the queue is full.
    std::shared_ptr<Engine::Ticket> admit(httplib::Response &res) {
        std::optional<Engine::Ticket> t = engine.enter();
        if (!t) {
            const SlotScheduler::Status st = engine.status();
            res.set_header("Retry-After", std::to_string(opts.retry_after_seconds));
            throw ApiError(503,
                           fmt::format("server busy: all {} slots are busy and {} requests are "
                                       "waiting (--queue {}); retry later",
                                       st.slots, st.queued, st.max_queue),
                           "server_busy", "");
        }
        return std::make_shared<Engine::Ticket>(std::move(*t));
    }

    // The request's connection, watched for the client going away.
    static std::shared_ptr<ConnectionWatch> watch_of(const httplib::Request &req) {
        return std::make_shared<ConnectionWatch>(req.local_addr, req.local_port, req.remote_addr,
                                                 req.remote_port);
    }

    // A non-streamed request that did not run: the client left the queue, or shutdown.
    static void check_ran(const GenResult &g) {
        if (g.slot < 0)
            throw ApiError(503, g.disconnected ? "client disconnected" : "server shutting down",
                           g.disconnected ? "client_disconnected" : "shutting_down", "");
    }

    // When a request came in (a handler's first statement).
    struct Arrival {
        std::chrono::system_clock::time_point at = std::chrono::system_clock::now();
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    };

    // What the trace record of a request says besides its result (docs/SERVER.md, Trace file).
    struct Traced {
        const char *path;
        std::string id;
        bool stream = false;
        std::shared_ptr<const std::string> body;  // the request body, kept only with --trace
        Arrival arrival;
    };

    Traced traced(const httplib::Request &req, const char *path, std::string id, bool stream,
                  const Arrival &arrival) const {
        Traced t{path, std::move(id), stream, nullptr, arrival};
        if (opts.trace) t.body = std::make_shared<const std::string>(req.body);
        return t;
    }

    // Appends the request's record to the trace file, if any: g is null when the engine failed
    // (`error` says how). Never throws: a trace that cannot be written does not fail a request.
    void trace(const Traced &t, const GenRequest &r, const std::vector<int32_t> &prompt,
               const GenResult *g, const std::string &error) const noexcept {
        if (!opts.trace) return;
        try {
            using ordered = nlohmann::ordered_json;
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                t.arrival.at.time_since_epoch())
                                .count();
            const time_t secs = time_t(ms / 1000);
            std::tm tm{};
            gmtime_r(&secs, &tm);
            const std::string stamp = fmt::format(
                "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, int(ms % 1000));
            const tokenizer::Tokenizer &tok = engine.tokenizer();
            const bool ran = g && g->slot >= 0;
            ordered rec;
            rec["time"] = stamp;  // first: TraceFile recognises a record by its start
            rec["id"] = t.id;
            rec["endpoint"] = t.path;
            rec["stream"] = t.stream;
            rec["model"] = model_name(r);
            rec["slot"] = ran ? ordered(g->slot) : ordered(nullptr);
            rec["prompt"] = tok.decode(prompt);
            rec["prompt_tokens"] = prompt.size();
            rec["cached_tokens"] = ran ? g->cached_tokens : 0;
            rec["prefill_tokens"] = ran ? prompt.size() - g->cached_tokens : 0;
            rec["generated"] = g ? tok.decode(g->generated) : "";
            rec["completion_tokens"] = g ? g->completion_tokens : 0;
            rec["reasoning_tokens"] = g ? g->reasoning_tokens : 0;
            ordered calls = ordered::array();
            if (g)
                for (const tokenizer::ToolCall &c : g->tool_calls)
                    calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
            rec["tool_calls"] = calls;
            rec["finish_reason"] = ran ? ordered(g->finish_reason) : ordered(nullptr);
            rec["stop_sequence"] =
                g && g->stop_sequence ? ordered(g->matched_stop) : ordered(nullptr);
            rec["disconnected"] = g && g->disconnected;
            rec["error"] = !error.empty() ? ordered(error)
                           : g && !ran
                               ? ordered(g->disconnected ? "left the queue: client disconnected"
                                                         : "left the queue: shutting down")
                               : ordered(nullptr);
            rec["max_tokens"] = r.max_tokens ? ordered(*r.max_tokens) : ordered(nullptr);
            // A float as its shortest spelling (0.05, not 0.05000000074505806).
            const auto num = [](float f) {
                return std::strtod(fmt::format("{}", f).c_str(), nullptr);
            };
            rec["sampling"] = {{"temperature", num(r.sampling.temperature)},
                               {"top_p", num(r.sampling.top_p)},
                               {"min_p", num(r.sampling.min_p)},
                               {"top_k", r.sampling.top_k},
                               {"seed", r.sampling.seed}};
            rec["thinking"] =
                tokenizer::thinking_enabled(tokenizer::effective_think_mode(r.think, engine.ctx()));
            rec["timings"] = {{"total_s", std::chrono::duration<double>(
                                              std::chrono::steady_clock::now() - t.arrival.t0)
                                              .count()},
                              {"prefill_s", g ? g->prefill_seconds : 0.0},
                              {"generation_s", g ? g->generation_seconds : 0.0}};
            rec["body"] = t.body ? *t.body : "";
            opts.trace->write(rec);
        } catch (...) {
            // The record is lost; the request is not.
        }
    }

    // Runs a request on the engine, logs it and traces it (also when the engine fails).
    GenResult run(const Traced &t, Engine::Ticket &ticket, const GenRequest &r,
                  const std::vector<int32_t> &prompt,
                  const std::function<bool(const Delta &)> &on_delta,
                  const std::function<bool(const GenResult &)> &on_start,
                  const std::function<bool()> &gone) {
        GenResult g;
        try {
            g = engine.run(ticket, r, prompt, on_delta, on_start, gone);
        } catch (const std::exception &e) {
            trace(t, r, prompt, nullptr, e.what());
            throw;
        } catch (...) {
            trace(t, r, prompt, nullptr, "generation failed");
            throw;
        }
        log(t.path, g);
        trace(t, r, prompt, &g, "");
        return g;
    }

    // A non-streamed request run to its end (or until its client goes away), logged; throws
    // check_ran's error when it did not run.
    GenResult run_whole(const Traced &t, Engine::Ticket &ticket, const GenRequest &r,
                        const std::vector<int32_t> &prompt, ConnectionWatch &watch) {
        GenResult g = run(
            t, ticket, r, prompt, [](const Delta &) { return true; }, {},
            [&] { return watch.closed(); });
        check_ran(g);
        return g;
    }

    json chat_message(const GenResult &g) const {
        json m = {{"role", "assistant"}, {"content", g.content}};
        if (!g.reasoning.empty()) m["reasoning_content"] = g.reasoning;
        if (!g.tool_calls.empty()) {
            m["tool_calls"] = json::array();
            for (const tokenizer::ToolCall &c : g.tool_calls)
                m["tool_calls"].push_back(
                    {{"id", make_tool_id("call_")},
                     {"type", "function"},
                     {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        return m;
    }

    // The delta of a tool-call event: the call's id, type and name first, then its arguments in
    // pieces (End adds nothing).
    static json tool_delta(const ToolEvent &e, std::vector<std::string> &ids) {
        json call = {{"index", e.index}};
        if (e.kind == ToolEvent::Kind::Start) {
            ids.push_back(make_tool_id("call_"));
            call["id"] = ids.back();
            call["type"] = "function";
            call["function"] = {{"name", e.text}, {"arguments", ""}};
        } else {
            call["function"] = {{"arguments", e.text}};
        }
        return {{"tool_calls", json::array({call})}};
    }

    // The streamed chunk of a delta (or of the end, with finish_reason).
    json chunk(Endpoint ep, const std::string &id, int64_t created, const std::string &model,
               const json &delta_or_text, const json &finish) const {
        const bool chat = ep == Endpoint::Chat;
        return {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({{{"index", 0},
                                          {chat ? "delta" : "text", delta_or_text},
                                          {"logprobs", nullptr},
                                          {"finish_reason", finish}}})}};
    }

    void generate(const httplib::Request &req, httplib::Response &res, Endpoint ep) {
        const Arrival arrival;
        const char *path = ep == Endpoint::Chat ? "/v1/chat/completions" : "/v1/completions";
        auto r =
            std::make_shared<GenRequest>(ep == Endpoint::Chat ? parse_chat_request(req.body)
                                                              : parse_completion_request(req.body));
        auto prompt = std::make_shared<std::vector<int32_t>>(engine.prompt_tokens(*r));
        const std::string id =
            fmt::format("{}-{}", ep == Endpoint::Chat ? "chatcmpl" : "cmpl", ++seq);
        const int64_t created = std::time(nullptr);
        const std::string model = model_name(*r);
        auto ticket = admit(res);
        auto watch = watch_of(req);
        const Traced t = traced(req, path, id, r->stream, arrival);

        if (!r->stream) {
            const GenResult g = run_whole(t, *ticket, *r, *prompt, *watch);
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

        stream_events(
            res, Api::OpenAI, path, opts.keepalive_seconds, watch,
            [this, r, prompt, ticket, id, created, model, ep, t](const SendFn &send_raw,
                                                                 const GoneFn &gone) {
                auto send = [&](const json &j) { return send_raw(sse_data(j)); };
                const json first =
                    ep == Endpoint::Chat ? json{{"role", "assistant"}, {"content", ""}} : json("");
                if (ep == Endpoint::Chat && !send(chunk(ep, id, created, model, first, nullptr)))
                    return false;
                std::vector<std::string> tool_ids;
                const auto on_delta = [&](const Delta &d) {
                    if (ep == Endpoint::Completion)
                        return send(
                            chunk(ep, id, created, model, d.reasoning + d.content, nullptr));
                    if (!d.reasoning.empty() || !d.content.empty()) {
                        json delta = json::object();
                        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
                        if (!d.content.empty()) delta["content"] = d.content;
                        if (!send(chunk(ep, id, created, model, delta, nullptr))) return false;
                    }
                    for (const ToolEvent &e : d.tools) {
                        if (e.kind == ToolEvent::Kind::End) continue;
                        if (!send(chunk(ep, id, created, model, tool_delta(e, tool_ids), nullptr)))
                            return false;
                    }
                    return true;
                };
                const GenResult g = run(t, *ticket, *r, *prompt, on_delta, {}, gone);
                if (g.disconnected) return false;
                check_ran(g);
                const json end = ep == Endpoint::Chat ? json::object() : json("");
                send(chunk(ep, id, created, model, end, g.finish_reason));
                if (r->include_usage) {
                    json u = chunk(ep, id, created, model, end, nullptr);
                    u["choices"] = json::array();
                    u["usage"] = usage_json(g);
                    send(u);
                }
                send_raw("data: [DONE]\n\n");
                return true;
            });
    }

    // POST /v1/messages (docs/SERVER.md, Anthropic messages).
    void messages(const httplib::Request &req, httplib::Response &res) {
        static constexpr const char *path = "/v1/messages";
        const Arrival arrival;
        auto r = std::make_shared<GenRequest>(parse_messages_request(req.body));
        auto prompt = std::make_shared<std::vector<int32_t>>(engine.prompt_tokens(*r));
        const std::string id = fmt::format("msg_{}", ++seq);
        const std::string model = model_name(*r);
        auto ticket = admit(res);
        auto watch = watch_of(req);
        const Traced t = traced(req, path, id, r->stream, arrival);
        if (!r->stream) {
            const GenResult g = run_whole(t, *ticket, *r, *prompt, *watch);
            send_json(res, 200, anthropic_message(g, id, model));
            return;
        }
        stream_events(
            res, Api::Anthropic, path, opts.keepalive_seconds, watch,
            [this, r, prompt, ticket, id, model, t](const SendFn &send, const GoneFn &gone) {
                AnthropicStream events(id, model);
                auto send_all = [&](const std::vector<SseEvent> &evs) {
                    return send_events(send, evs);
                };
                const GenResult g = run(
                    t, *ticket, *r, *prompt,
                    [&](const Delta &d) { return send_all(events.delta(d)); },
                    [&](const GenResult &s) { return send_all(events.start(s)); }, gone);
                if (g.disconnected) return false;
                check_ran(g);
                send_all(events.finish(g));
                return true;
            });
    }

    // POST /v1/responses (docs/SERVER.md, Responses). With previous_response_id the stored
    // conversation of that response comes before the input; with store, the answer and its
    // conversation are kept (before the answer is sent, so that the next turn finds it).
    void responses(const httplib::Request &req, httplib::Response &res) {
        static constexpr const char *path = "/v1/responses";
        const Arrival arrival;
        auto rr = std::make_shared<ResponsesRequest>(parse_responses_request(req.body));
        std::shared_ptr<const ResponseTurn> previous;
        if (!rr->previous_response_id.empty()) {
            const auto found = stored.get(rr->previous_response_id);
            if (!found) {
                ApiError e(400,
                           fmt::format("Previous response with id '{}' not found.",
                                       rr->previous_response_id),
                           "previous_response_not_found");
                e.extra["param"] = "previous_response_id";
                throw e;
            }
            previous = found->turn;
        }
        with_history(*rr, conversation(previous.get()));
        auto prompt =
            std::make_shared<std::vector<int32_t>>(engine.prompt_tokens(rr->gen, "input"));
        const ResponseMeta meta{make_tool_id("resp_"), std::time(nullptr), model_name(rr->gen),
                                rr->echo};
        auto ticket = admit(res);
        auto watch = watch_of(req);
        const Traced t = traced(req, path, meta.id, rr->gen.stream, arrival);
        // The turn kept is the input and the output read back as input items: what a client
        // replaying this response would send.
        auto keep = [this, rr, previous, id = meta.id](const json &response) {
            if (!rr->store) return;
            std::vector<tokenizer::ChatMessage> turn = rr->input;
            for (auto &m : read_input_items(response.at("output"), "output"))
                turn.push_back(std::move(m));
            stored.put(id, {response, std::make_shared<ResponseTurn>(previous, std::move(turn)),
                            rr->input_items});
        };
        if (!rr->gen.stream) {
            const GenResult g = run_whole(t, *ticket, rr->gen, *prompt, *watch);
            const json body = response_from_result(meta, g);
            keep(body);
            send_json(res, 200, body);
            return;
        }
        stream_events(
            res, Api::OpenAI, path, opts.keepalive_seconds, watch,
            [this, rr, prompt, ticket, meta, keep, t](const SendFn &send, const GoneFn &gone) {
                ResponsesStream events(meta);
                if (!send_events(send, events.start())) return false;
                const GenResult g = run(
                    t, *ticket, rr->gen, *prompt,
                    [&](const Delta &d) { return send_events(send, events.delta(d)); }, {}, gone);
                if (g.disconnected) return false;
                check_ran(g);
                const std::vector<SseEvent> last = events.finish(g);
                keep(events.response());
                send_events(send, last);
                return true;
            });
    }

    // GET /v1/responses/{id}: a stored response.
    void stored_response(const httplib::Request &req, httplib::Response &res) {
        const std::string id = req.matches[1];
        const auto found = stored.get(id);
        if (!found)
            throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "not_found");
        send_json(res, 200, found->response);
    }

    // GET /v1/responses/{id}/input_items: a page of the stored response's own input items.
    void stored_input_items(const httplib::Request &req, httplib::Response &res) {
        const std::string id = req.matches[1];
        const auto found = stored.get(id);
        if (!found)
            throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "not_found");
        size_t limit = 20;
        if (req.has_param("limit")) {
            const std::string v = req.get_param_value("limit");
            char *end = nullptr;
            const long n = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || n < 1 || n > 100) {
                ApiError e(400, "'limit' must be a whole number from 1 to 100", "invalid_value");
                e.extra["param"] = "limit";
                throw e;
            }
            limit = size_t(n);
        }
        const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
        if (order != "asc" && order != "desc") {
            ApiError e(400, "'order' must be 'asc' or 'desc'", "invalid_value");
            e.extra["param"] = "order";
            throw e;
        }
        const std::string after = req.has_param("after") ? req.get_param_value("after") : "";
        send_json(res, 200, input_items_page(found->input_items, limit, order == "asc", after));
    }

    // DELETE /v1/responses/{id}: OpenAI's deletion object, or 404 as GET answers an unknown id.
    void delete_response(const httplib::Request &req, httplib::Response &res) {
        const std::string id = req.matches[1];
        if (!stored.erase(id))
            throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "not_found");
        send_json(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
    }

    // POST /v1/messages/count_tokens: the prompt's length, as /v1/messages would run it.
    void count_tokens(const httplib::Request &req, httplib::Response &res) {
        const GenRequest r = parse_messages_request(req.body, MessagesBody::CountTokens);
        send_json(res, 200, {{"input_tokens", engine.tokenize(r).size()}});
    }

    // Runs a handler body: an ApiError is its JSON answer; anything else is an internal failure.
    // The error shape is the one of the request's path.
    template <typename F>
    void guarded(const httplib::Request &req, httplib::Response &res, F &&body) {
        const Api api = api_of(req.path);
        try {
            body();
        } catch (const ApiError &e) {
            send_error(res, api, e);
        } catch (const std::bad_alloc &) {
            send_error(res, api, internal_error("out of memory"));
        } catch (const std::exception &e) {
            fmt::print(stderr, "ds4-server: internal error: {}\n", e.what());
            send_error(res, api, internal_error(e.what()));
        } catch (...) {
            send_error(res, api, internal_error("internal error"));
        }
    }

    void setup() {
        srv.set_payload_max_length(kMaxBodyBytes);
        // A thread per connection being served: every slot and queue place, plus room for the
        // requests that get a 503, /health, and idle keep-alive connections.
        const SlotScheduler::Status st = engine.status();
        const size_t threads = opts.http_threads > 0
                                   ? opts.http_threads
                                   : std::max<size_t>(16, 2 * (st.slots + st.max_queue) + 8);
        srv.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
        srv.set_read_timeout(opts.read_timeout_seconds);
        srv.set_write_timeout(opts.write_timeout_seconds);
        srv.set_keep_alive_timeout(opts.idle_timeout_seconds);
        // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server
        // bind the port of a running one (and share its connections) instead of failing.
        srv.set_socket_options([](int sock) {
            int yes = 1;
            setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void *>(&yes),
                       sizeof(yes));
        });
        if (opts.cors)
            srv.set_default_headers({{"Access-Control-Allow-Origin", "*"},
                                     {"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
                                     {"Access-Control-Allow-Headers", "*"}});
        srv.set_pre_routing_handler([this](const httplib::Request &req, httplib::Response &res) {
            if (opts.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" ||
                is_page_request(req))
                return httplib::Server::HandlerResponse::Unhandled;
            // Either header carries the key: OpenAI clients send a bearer token, Anthropic's send
            // x-api-key.
            const std::string auth = req.get_header_value("Authorization");
            const std::string x_key = req.get_header_value("x-api-key");
            if (same_key(auth, "Bearer " + opts.api_key) || same_key(x_key, opts.api_key))
                return httplib::Server::HandlerResponse::Unhandled;
            send_error(res, api_of(req.path),
                       ApiError(401,
                                auth.empty() && x_key.empty()
                                    ? "missing API key: send Authorization: Bearer KEY or "
                                      "x-api-key: KEY"
                                    : "invalid API key",
                                "invalid_api_key"));
            return httplib::Server::HandlerResponse::Handled;
        });
        srv.set_error_handler([](const httplib::Request &req, httplib::Response &res) {
            if (!res.body.empty() || res.status < 400) return;
            send_error(
                res, api_of(req.path),
                ApiError(res.status, default_message(res.status), default_code(res.status), ""));
        });
        srv.set_exception_handler(
            [](const httplib::Request &req, httplib::Response &res, std::exception_ptr ep) {
                std::string what = "internal error";
                try {
                    if (ep) std::rethrow_exception(ep);
                } catch (const std::exception &e) {
                    what = e.what();
                } catch (...) {
                }
                send_error(res, api_of(req.path), internal_error(what));
            });
        srv.Options(".*",
                    [](const httplib::Request &, httplib::Response &res) { res.status = 204; });
        srv.Get("/health", [this](const httplib::Request &, httplib::Response &res) {
            const SlotScheduler::Status st = engine.status();
            send_json(
                res, 200,
                {{"status", "ok"},
                 {"model", opts.model_id},
                 {"slots", {{"total", st.slots}, {"busy", st.busy}, {"free", st.slots - st.busy}}},
                 {"queue", {{"waiting", st.queued}, {"max", st.max_queue}}}});
        });
        // The chat page: "/" is its index.html; any other path stays a 404.
        const auto page = [](const httplib::Request &req, httplib::Response &res) {
            if (const auto a = webui_asset(req.path)) send_page_file(res, *a);
        };
        srv.Get("/", page);
        for (const WebFile &f : webui_files()) srv.Get(page_route(f.name), page);
        srv.Get("/v1/models", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(req, res, [&] {
                send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
            });
        });
        srv.Get("/v1/models/(.+)", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(req, res, [&] {
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
                     guarded(req, res, [&] { generate(req, res, Endpoint::Chat); });
                 });
        srv.Post("/v1/completions", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(req, res, [&] { generate(req, res, Endpoint::Completion); });
        });
        srv.Post("/v1/messages", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(req, res, [&] { messages(req, res); });
        });
        srv.Post("/v1/responses", [this](const httplib::Request &req, httplib::Response &res) {
            guarded(req, res, [&] { responses(req, res); });
        });
        srv.Get("/v1/responses/([^/]+)/input_items",
                [this](const httplib::Request &req, httplib::Response &res) {
                    guarded(req, res, [&] { stored_input_items(req, res); });
                });
        srv.Get("/v1/responses/([^/]+)",
                [this](const httplib::Request &req, httplib::Response &res) {
                    guarded(req, res, [&] { stored_response(req, res); });
                });
        srv.Delete("/v1/responses/([^/]+)",
                   [this](const httplib::Request &req, httplib::Response &res) {
                       guarded(req, res, [&] { delete_response(req, res); });
                   });
        srv.Post("/v1/messages/count_tokens",
                 [this](const httplib::Request &req, httplib::Response &res) {
                     guarded(req, res, [&] { count_tokens(req, res); });
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
