// ds4-server: an OpenAI- (chat, completions, Responses) and Anthropic-compatible HTTP server over
// the engine's session API (docs/SERVER.md).
#include <fmt/format.h>
#include <pthread.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "backend_option.h"
#include "cli_app.h"
#include "common/error.h"
#include "context_size.h"
#include "exit_codes.h"
#include "memory_check.h"
#include "model_load.h"
#include "run_env.h"
#include "runtime/session.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/kv_disk_cache.h"
#include "server/trace.h"
#include "ssd_streaming_option.h"
#include "startup_line.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocabulary.h"
#include "tool_main.h"

namespace {

using ds4::tools::UsageError;

constexpr const char *kTool = "ds4-server";

struct Options {
    std::string model = "ds4flash.gguf";
    std::string host = "127.0.0.1";
    int port = 8000;
    uint64_t ctx = 32768;
    int64_t n_predict = 393216;
    std::string api_key;
    bool cors = false;
    int threads = 0;
    size_t parallel = 1;
    size_t queue = ds4::server::kDefaultQueue;
    double keepalive = 5;
    int read_timeout = 10, write_timeout = 30, idle_timeout = 5;
    size_t responses_store = ds4::server::kDefaultResponsesStore;
    // Rewind points of each slot (docs/SERVER.md, Sessions and KV reuse).
    uint32_t rewind_interval = 2048, rewind_points = 16;
    ds4::tools::BackendFlags backend;
    // The disk KV cache (docs/SERVER.md, Disk KV cache).
    std::string kv_disk_dir;
    uint64_t kv_disk_space_mb = 4096;
    ds4::server::KvDiskOptions kv;
    std::string trace;  // --trace FILE (docs/SERVER.md, Trace file)
};

// A missing file is named as such before the library's message (bad input, exit 2).
template <typename F>
auto from_model_file(const std::string &path, F &&open) {
    std::error_code ec;
    if (!std::filesystem::is_directory(path, ec) && !std::filesystem::exists(path, ec))
        throw UsageError(fmt::format("cannot open model {}: no such file", path));
    return ds4::tools::from_model_file(path, std::forward<F>(open));
}

std::string model_id(const std::string &path) {
    std::string name = std::filesystem::path(path).filename().string();
    if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
    return name;
}

int server_main(int argc, char **argv) {
    using ds4::tools::integer_at_least;
    using ds4::tools::integer_in;
    Options opt;
    CLI::App app{
        "ds4-server: an OpenAI- and Anthropic-compatible HTTP server for DeepSeek V4 Flash "
        "(ds4cpp)",
        kTool};
    ds4::tools::configure_app(app, kTool);
    app.add_option("-m,--model", opt.model, "GGUF model path")->default_str(opt.model);
    app.add_option("--host", opt.host, "Address to listen on")->default_str(opt.host);
    app.add_option("--port", opt.port, "TCP port; 0 = any free port (printed at start)")
        ->check(integer_in(0, 65535))
        ->default_str("8000");
    auto *ctx = app.add_option("-c,--ctx", opt.ctx,
                               "Context size in tokens, allocated at start (clamped to the "
                               "model's context length)")
                    ->check(integer_at_least(1))
                    ->default_str("32768");
    app.add_option("-n,--tokens", opt.n_predict,
                   "Max generated tokens when a request gives no max_tokens")
        ->check(integer_in(1, std::numeric_limits<int32_t>::max()))
        ->default_str("393216");
    app.add_option("--api-key", opt.api_key,
                   "Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every request "
                   "but /health");
    app.add_flag("--cors", opt.cors, "Add Access-Control-Allow-* headers to every response");
    app.add_option("-t,--threads", opt.threads,
                   "CPU threads; 0 (the default) = DS4_THREADS when set, else all cores")
        ->check(integer_in(0, ds4::tools::kMaxThreads));
    app.add_option("--parallel", opt.parallel,
                   "Session slots, each with its own KV cache of --ctx positions")
        ->check(integer_in(1, 64))
        ->default_str("1");
    app.add_option("--queue", opt.queue,
                   "Requests that may wait for a slot when all are busy; more get 503")
        ->check(integer_in(0, 4096))
        ->default_str(std::to_string(ds4::server::kDefaultQueue));
    app.add_option("--keepalive", opt.keepalive,
                   "Seconds of silence after which a stream gets an SSE ': keep-alive' comment; "
                   "0 = never")
        ->check(ds4::tools::number_in(0, 3600))
        ->default_str("5");
    app.add_option("--read-timeout", opt.read_timeout,
                   "Seconds a client may take to send the next bytes of its request")
        ->check(integer_in(1, 3600))
        ->default_str("10");
    app.add_option("--write-timeout", opt.write_timeout,
                   "Seconds a client may take to accept the next bytes of an answer; then it is "
                   "treated as gone")
        ->check(integer_in(1, 3600))
        ->default_str("30");
    app.add_option("--idle-timeout", opt.idle_timeout,
                   "Seconds an idle keep-alive connection is kept open")
        ->check(integer_in(1, 3600))
        ->default_str("5");
    app.add_option("--responses-store", opt.responses_store,
                   "Stored /v1/responses answers kept in memory for previous_response_id and GET "
                   "/v1/responses/{id} (the oldest dropped first); 0 = none")
        ->check(integer_in(0, 1000000))
        ->default_str(std::to_string(ds4::server::kDefaultResponsesStore));
    app.add_option("--rewind-interval", opt.rewind_interval,
                   "A rewind point every N tokens of a slot's session: a prompt that shares only "
                   "part of the slot's tokens (an edited earlier message) resumes from the last "
                   "point before the first difference; 0 = only the end of the last prompt and "
                   "the start")
        ->check(integer_in(0, std::numeric_limits<int32_t>::max()))
        ->default_str("2048");
    app.add_option("--rewind-points", opt.rewind_points,
                   "Periodic rewind points a slot keeps; beyond it every other one is dropped "
                   "and the interval doubles")
        ->check(integer_in(1, 4096))
        ->default_str("16");
    app.add_option("--kv-disk-dir", opt.kv_disk_dir,
                   "Keep KV checkpoints in DIR (created, mode 0700) across restarts");
    auto *kv_space = app.add_option("--kv-disk-space-mb", opt.kv_disk_space_mb,
                                    "Disk budget of --kv-disk-dir in MiB")
                         ->check(integer_in(1, int64_t(1) << 40))
                         ->default_str("4096");
    auto *kv_min = app.add_option("--kv-cache-min-tokens", opt.kv.min_tokens,
                                  "Never save or load a disk checkpoint of fewer tokens")
                       ->check(integer_in(1, std::numeric_limits<int32_t>::max()))
                       ->default_str("512");
    auto *kv_cold = app.add_option("--kv-cache-cold-max-tokens", opt.kv.cold_max_tokens,
                                   "Save prompts of min..N tokens that reused nothing; 0 = never")
                        ->check(integer_in(0, std::numeric_limits<int32_t>::max()))
                        ->default_str("30000");
    auto *kv_interval =
        app.add_option("--kv-cache-continued-interval-tokens", opt.kv.continued_interval_tokens,
                       "Save every N tokens of a session (rounded up to the alignment); 0 = never")
            ->check(integer_in(0, std::numeric_limits<int32_t>::max()))
            ->default_str("10000");
    auto *kv_align =
        app.add_option("--kv-cache-boundary-align-tokens", opt.kv.boundary_align_tokens,
                       "Align cold save points down (continued steps up) to a multiple of N; 0 = "
                       "no alignment")
            ->check(integer_in(0, std::numeric_limits<int32_t>::max()))
            ->default_str("2048");
    auto *kv_trim =
        app.add_option("--kv-cache-boundary-trim-tokens", opt.kv.boundary_trim_tokens,
                       "Leave the prompt's last N tokens out of a cold save point (before the "
                       "alignment)")
            ->check(integer_in(0, std::numeric_limits<int32_t>::max()))
            ->default_str("32");
    bool reject_different_quant = false;  // what this server always does
    CLI::Option *kv_reject_quant = app.add_flag(
        "--kv-cache-reject-different-quant", reject_different_quant,
        "Accepted for the reference's command lines: a checkpoint of another routed-expert quant "
        "(or any other model file) is always refused here");
    app.add_option("--trace", opt.trace,
                   "Append a record per generation request (the rendered prompt, the tokens "
                   "reused and prefilled, the generated text, timings, the finish reason) to "
                   "FILE, one JSON object per line")
        ->type_name("FILE");
    ds4::tools::add_backend_options(app, opt.backend);
    ds4::tools::SsdStreamingFlags ssd;
    ds4::tools::add_ssd_streaming_options(app, ssd);
    if (const auto rc = ds4::tools::parse_args(app, argc, argv)) return *rc;

    // SIGINT / SIGTERM are taken by a thread of their own (sigwait), so that stopping the
    // listener is not done in a signal handler. Blocked before any other thread starts (the
    // model's thread pool inherits the mask). Before the server listens, a signal ends the
    // process at once; afterwards it stops the listener and the generation in progress.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    static std::atomic<bool> shutdown{false};
    static std::atomic<ds4::server::HttpServer *> listening{nullptr};
    static std::atomic<int> got{0};
    static std::atomic<bool> self_wake{false}, listen_returned{false};
    std::thread waiter([sigs] {
        int sig = 0;
        sigwait(&sigs, &sig);
        if (self_wake) return;
        got = sig;
        shutdown = true;
        if (auto *srv = listening.load()) {
            // Until listen() has returned: a stop() just before it starts would be lost.
            while (!listen_returned) {
                srv->stop();
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        } else {
            std::_Exit(sig == SIGINT ? ds4::tools::kExitInterrupted : ds4::tools::kExitOk);
        }
    });
    // Every way out of this function ends the waiter first.
    struct WaiterGuard {
        std::thread &t;
        ~WaiterGuard() {
            if (!got) {
                self_wake = true;
                pthread_kill(t.native_handle(), SIGTERM);
            }
            t.join();
        }
    } waiter_guard{waiter};
    const auto backend = opt.backend.backend();
    const auto placement = opt.backend.placement();
    opt.threads = ds4::tools::resolve_threads(opt.threads, kTool);
    ds4::tools::check_simd_env();
    if (opt.host.empty()) throw UsageError("--host must not be empty");
    if (opt.kv_disk_dir.empty()) {
        for (const CLI::Option *o : std::initializer_list<const CLI::Option *>{
                 kv_space, kv_min, kv_cold, kv_interval, kv_align, kv_trim, kv_reject_quant})
            if (o->count() > 0)
                throw UsageError(fmt::format("{} needs --kv-disk-dir", o->get_name()));
    }
    if (opt.kv.cold_max_tokens != 0 && opt.kv.cold_max_tokens < opt.kv.min_tokens)
        throw UsageError(fmt::format(
            "--kv-cache-cold-max-tokens {} must be 0 or at least --kv-cache-min-tokens {}",
            opt.kv.cold_max_tokens, opt.kv.min_tokens));

    // The trace file is opened before the model loads: a path that cannot be written fails at
    // once (exit 2).
    std::unique_ptr<ds4::server::TraceFile> trace;
    if (!opt.trace.empty()) {
        try {
            trace =
                std::make_unique<ds4::server::TraceFile>(opt.trace, [](const std::string &line) {
                    fmt::print(stderr, "{}: trace: {}\n", kTool, line);
                });
        } catch (const ds4::Error &e) {
            throw UsageError(fmt::format("--trace: {}", e.what()));
        }
    }

    const auto streaming = ssd.options(backend, opt.model);
    auto model = from_model_file(opt.model, [&] {
        return ds4::tools::load_model(
            kTool, opt.model,
            {.n_threads = opt.threads,
             .backend = backend,
             .streaming = streaming,
             .layer_starts = placement.layer_starts,
             .gpus = placement.gpus,
             .plan_ctx = uint32_t(std::min<uint64_t>(opt.ctx, UINT32_MAX)),
             .split = placement.split});
    });
    fmt::print(stderr, "{}", ds4::tools::startup_line(kTool, opt.model, *model));
    ds4::tools::print_ssd_streaming_startup(kTool, *model);
    // The cache's statistics and the routing popularity at a clean exit (SIGINT / SIGTERM once
    // listening included). The slots share the one expert cache: their steps never overlap.
    const ds4::tools::SsdStreamingAtExit ssd_report(kTool, *model);
    const ds4::tokenizer::Tokenizer tok = from_model_file(opt.model, [&] {
        return ds4::tokenizer::Tokenizer(ds4::tokenizer::load_vocabulary(model->file()));
    });
    const auto &hp = model->hparams();
    if (tok.n_tokens() > hp.n_vocab)
        throw UsageError(
            fmt::format("the vocabulary has {} tokens but the model only {} embedding rows",
                        tok.n_tokens(), hp.n_vocab));

    ds4::runtime::SessionOptions so;
    const uint64_t asked = ctx->count() > 0 || !hp.context_length
                               ? opt.ctx
                               : std::min<uint64_t>(opt.ctx, hp.context_length);
    so.ctx = ds4::tools::context_for(asked, hp, so, "--ctx");
    so.rewind_interval = opt.rewind_interval;
    so.max_rewind_points = opt.rewind_points;
    // Each slot holds its KV cache and its rewind points (the start, the end of the last prompt
    // and up to --rewind-points periodic ones: docs/SERVER.md, Sessions and KV reuse); with the
    // disk cache a second KV cache while a checkpoint is read (into a fresh cache, so that a bad
    // file leaves the session as it was).
    const uint64_t caches = opt.kv_disk_dir.empty() ? 1 : 2;
    const uint64_t points = 2 + (opt.rewind_interval ? opt.rewind_points : 0);
    if (model->backend() == ds4::runtime::Backend::Cpu)
        ds4::tools::check_memory_fits(
            opt.parallel * (caches * ds4::runtime::Session::kv_bytes_for(hp, so) +
                            points * ds4::runtime::Session::rewind_point_bytes_for(hp, so)),
            fmt::format("the KV caches of {} slot{} of {} tokens and {} rewind points each",
                        opt.parallel, opt.parallel == 1 ? "" : "s", so.ctx, points),
            "lower --ctx, --parallel or --rewind-points");

    // The disk KV cache is indexed (and evicted down to its budget) before the server listens.
    std::unique_ptr<ds4::server::KvDiskCache> disk;
    if (!opt.kv_disk_dir.empty()) {
        opt.kv.dir = opt.kv_disk_dir;
        opt.kv.budget_bytes = opt.kv_disk_space_mb << 20;
        // What besides the model changes a state's bits: the row format and QAT simulation.
        const uint64_t id = ds4::server::model_identity(
            model->file(), fmt::format("qat_sim={} f16_rows={}", so.forward.qat_sim, so.f16_rows));
        try {
            disk = std::make_unique<ds4::server::KvDiskCache>(
                opt.kv, id, so.ctx, [](const std::string &line) {
                    fmt::print(stderr, "{}: kv disk: {}\n", kTool, line);
                });
        } catch (const ds4::Error &e) {
            throw UsageError(fmt::format("--kv-disk-dir: {}", e.what()));
        }
    }
    ds4::server::Engine engine(*model, tok, so, opt.n_predict, &shutdown, opt.parallel, opt.queue);
    engine.set_disk_cache(disk.get());
    ds4::server::ServerOptions sopt{
        .host = opt.host,
        .port = opt.port,
        .api_key = opt.api_key,
        .cors = opt.cors,
        .model_id = model_id(opt.model),
        .model_aliases = {std::filesystem::path(opt.model).filename().string(), "deepseek-v4-flash",
                          "deepseek-chat", "deepseek-reasoner"},
        .max_completion_tokens = std::min<int64_t>(opt.n_predict, engine.ctx()),
        .keepalive_seconds = opt.keepalive,
        .read_timeout_seconds = opt.read_timeout,
        .write_timeout_seconds = opt.write_timeout,
        .idle_timeout_seconds = opt.idle_timeout,
        .responses_store = opt.responses_store,
        .trace = trace.get(),
    };
    ds4::server::HttpServer server(engine, sopt);
    const int port = server.bind();
    if (port < 0) {
        fmt::print(stderr, "{}: cannot listen on {}:{} (address in use or not available)\n", kTool,
                   opt.host, opt.port);
        return ds4::tools::kExitFailure;
    }
    fmt::print(stderr, "{}: context {} tokens, KV cache {:.2f} MiB x {} slot{}, queue {}\n", kTool,
               engine.ctx(), ds4::runtime::Session::kv_bytes_for(*model, so) / 1048576.0,
               opt.parallel, opt.parallel == 1 ? "" : "s", opt.queue);
    if (opt.rewind_interval)
        fmt::print(
            stderr, "{}: a rewind point every {} tokens, up to {} of {:.2f} MiB a slot\n", kTool,
            opt.rewind_interval, opt.rewind_points,
            ds4::runtime::Session::rewind_point_bytes_for(hp, so, model->backend()) / 1048576.0);
    fmt::print(stderr, "{}: listening on http://{}:{}\n", kTool, opt.host, port);

    listening = &server;
    const bool ok = server.listen();
    listen_returned = true;
    if (got == SIGINT || got == SIGTERM) {
        // Every handler has returned (listen() joins its threads): the slots are idle.
        engine.store_live_sessions();
        fmt::print(stderr, "{}: shut down ({})\n", kTool, got == SIGINT ? "SIGINT" : "SIGTERM");
        return got == SIGINT ? ds4::tools::kExitInterrupted : ds4::tools::kExitOk;
    }
    if (!ok) {
        fmt::print(stderr, "{}: the listener failed\n", kTool);
        return ds4::tools::kExitFailure;
    }
    return ds4::tools::kExitOk;
}

}  // namespace

int main(int argc, char **argv) {
    return ds4::tools::guarded_main(kTool, [&] { return server_main(argc, argv); });
}
