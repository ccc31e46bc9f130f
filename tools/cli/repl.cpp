#include "repl.h"

#include <editline/readline.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>

#include "common/error.h"
#include "context_size.h"
#include "input_files.h"
#include "runtime/generate.h"
#include "speed_line.h"
#include "text_printer.h"
#include "tool_main.h"

namespace ds4::cli {
namespace {

std::atomic<bool> g_cancel{false};
void on_sigint(int) {
    g_cancel = true;
}

const char *kHelp =
    "commands: /help  /think  /think-max  /nothink  /ctx N  /clear  /read FILE  /quit (or "
    "/exit)\n"
    "/ctx N: a new context of N tokens (the conversation is kept); /clear: drop the "
    "conversation\n"
    "Ctrl+C stops a generation; Ctrl+D quits.\n";

std::string trim(std::string s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The way out of a full context, printed when a turn or an answer hits it.
void print_context_full(size_t tokens, uint32_t ctx) {
    fmt::print(stderr,
               "ds4: the context is full ({} tokens of {}): /ctx N for a larger one (the "
               "conversation is kept), /clear to start over\n",
               tokens, ctx);
}

// A positive whole number, or nothing (the whole argument must be digits).
std::optional<uint64_t> parse_count(const std::string &s) {
    uint64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v == 0) return std::nullopt;
    return v;
}

}  // namespace

int run_repl(runtime::Model &model, const tokenizer::Tokenizer &tok, Options opt) {
    const std::string history =
        std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.ds4_history";
    using_history();
    read_history(history.c_str());
    stifle_history(512);
    std::signal(SIGINT, on_sigint);
    fmt::print(stderr, "{}", kHelp);

    auto make_session = [&] {
        runtime::SessionOptions so{.ctx = opt.ctx, .chunk = opt.chunk};
        so.forward.qat_sim = opt.qat_sim;
        return std::make_unique<runtime::Session>(model, so);
    };
    auto session = make_session();
    tokenizer::ThinkMode mode = tokenizer::effective_think_mode(opt.think, opt.ctx);
    std::vector<int32_t> transcript = tokenizer::encode_cli_preamble(tok, opt.system, mode);
    std::string pending_user;  // set by /read
    runtime::Sampler sampler(opt.sampling);
    const bool color = isatty(STDOUT_FILENO);

    auto run_command = [&](const std::string &cmd, const std::string &arg) {
        if (cmd == "/help") {
            fmt::print(stderr, "{}", kHelp);
        } else if (cmd == "/think" || cmd == "/nothink" || cmd == "/think-max") {
            const auto want = cmd == "/think"     ? tokenizer::ThinkMode::kHigh
                              : cmd == "/nothink" ? tokenizer::ThinkMode::kNone
                                                  : tokenizer::ThinkMode::kMax;
            const auto eff = tokenizer::effective_think_mode(want, opt.ctx);
            const bool prefix_changed =
                (eff == tokenizer::ThinkMode::kMax) != (mode == tokenizer::ThinkMode::kMax);
            if (prefix_changed) {  // the Think Max text sits right after BOS: start over
                // Both are made before either is replaced: a failure leaves the chat as it was.
                auto fresh_transcript = tokenizer::encode_cli_preamble(tok, opt.system, eff);
                auto fresh_session = make_session();
                transcript.swap(fresh_transcript);
                session.swap(fresh_session);
            }
            mode = eff;
            if (want == tokenizer::ThinkMode::kMax && eff != want)
                fmt::print(stderr, "thinking: high (ctx below {})\n",
                           tokenizer::kThinkMaxMinContext);
        } else if (cmd == "/ctx") {
            const auto n = parse_count(arg);
            if (!n) {
                fmt::print(stderr, "ds4: /ctx needs a positive number of tokens, got '{}'\n",
                           arg.substr(0, 40));
                return;
            }
            runtime::SessionOptions so{.chunk = opt.chunk};
            so.forward.qat_sim = opt.qat_sim;
            const uint32_t old = opt.ctx;
            opt.ctx = tools::context_for(*n, model.hparams(), so, "/ctx");  // may refuse
            try {
                session = make_session();  // KV discarded, transcript kept
            } catch (...) {
                opt.ctx = old;
                throw;
            }
            fmt::print(stderr, "context: {} tokens (next turn prefills the transcript)\n", opt.ctx);
        } else if (cmd == "/clear") {
            auto fresh_transcript = tokenizer::encode_cli_preamble(tok, opt.system, mode);
            auto fresh_session = make_session();
            transcript.swap(fresh_transcript);
            session.swap(fresh_session);
            fmt::print(stderr, "conversation cleared\n");
        } else if (cmd == "/read") {
            pending_user = tools::read_input_file(arg, "/read");
            if (pending_user.empty()) fmt::print(stderr, "ds4: /read {}: the file is empty\n", arg);
        } else {
            fmt::print(stderr, "ds4: unknown command {} (/help lists them)\n", cmd.substr(0, 40));
        }
    };

    for (;;) {
        std::string line;
        if (!pending_user.empty()) {
            line.swap(pending_user);
        } else {
            char *raw = readline("ds4> ");
            if (!raw) break;  // Ctrl+D
            line = trim(raw);
            std::free(raw);
            if (line.empty()) continue;
            add_history(line.c_str());
            if (line[0] == '/') {
                const auto sp = line.find(' ');
                const std::string cmd = line.substr(0, sp),
                                  arg = sp == std::string::npos ? "" : trim(line.substr(sp));
                if (cmd == "/quit" || cmd == "/exit") break;
                // A failed command reports and leaves the conversation as it was.
                try {
                    run_command(cmd, arg);
                } catch (...) {
                    tools::report_current_exception("ds4");
                }
                continue;
            }
        }
        const size_t rollback = transcript.size();
        // A failed turn is rolled back, with a fresh session: its KV may hold part of it. When
        // even that fails (memory), the old session stays: it holds more than the transcript,
        // so the next turn makes a new one before using it.
        auto roll_back = [&]() noexcept {
            transcript.resize(rollback);
            try {
                session = make_session();
            } catch (...) {
                tools::report_current_exception("ds4");
            }
        };
        try {
            tokenizer::append_cli_user_turn(tok, line, mode, transcript);
            if (transcript.size() >= opt.ctx) {
                print_context_full(transcript.size(), opt.ctx);
                roll_back();
                continue;
            }
            // Only the suffix the live session has not seen is prefilled.
            const auto &seen = session->tokens();
            if (seen.size() > transcript.size() ||
                !std::equal(seen.begin(), seen.end(), transcript.begin())) {
                session = make_session();
            }
            const std::span<const int32_t> suffix(transcript.data() + session->tokens().size(),
                                                  transcript.size() - session->tokens().size());
            g_cancel = false;
            TextPrinter printer(tok, tokenizer::thinking_enabled(mode), color);
            std::vector<int32_t> generated;
            runtime::GenerateParams gp{
                .max_tokens = opt.n_predict, .stop_ids = {tok.specials().eos}, .cancel = &g_cancel};
            const auto st = runtime::generate(*session, suffix, sampler, gp, [&](int32_t id) {
                generated.push_back(id);
                printer.push(id);
            });
            printer.finish();
            fmt::print(stderr, "{}", tools::speed_line(st));
            if (generated.empty()) {  // cancelled before anything: roll the turn back
                roll_back();
                continue;
            }
            transcript.insert(transcript.end(), generated.begin(), generated.end());
            if (generated.back() != tok.specials().eos) transcript.push_back(tok.specials().eos);
            if (st.stop == runtime::StopReason::ContextFull)
                print_context_full(transcript.size(), opt.ctx);
        } catch (...) {
            tools::report_current_exception("ds4");
            roll_back();
        }
    }
    write_history(history.c_str());
    return 0;
}

}  // namespace ds4::cli
