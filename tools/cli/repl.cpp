#include "repl.h"

#include <editline/readline.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>

#include "common/error.h"
#include "runtime/generate.h"
#include "text_printer.h"

namespace ds4::cli {
namespace {

std::atomic<bool> g_cancel{false};
void on_sigint(int) {
    g_cancel = true;
}

const char *kHelp =
    "commands: /help  /think  /think-max  /nothink  /ctx N  /read FILE  /quit (or /exit)\n"
    "Ctrl+C stops a generation; Ctrl+D quits.\n";

std::string trim(std::string s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
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
                if (cmd == "/help") {
                    fmt::print(stderr, "{}", kHelp);
                } else if (cmd == "/think" || cmd == "/nothink" || cmd == "/think-max") {
                    const auto want = cmd == "/think"     ? tokenizer::ThinkMode::kHigh
                                      : cmd == "/nothink" ? tokenizer::ThinkMode::kNone
                                                          : tokenizer::ThinkMode::kMax;
                    const auto eff = tokenizer::effective_think_mode(want, opt.ctx);
                    const bool prefix_changed =
                        (eff == tokenizer::ThinkMode::kMax) != (mode == tokenizer::ThinkMode::kMax);
                    mode = eff;
                    if (want == tokenizer::ThinkMode::kMax && eff != want)
                        fmt::print(stderr, "thinking: high (ctx below {})\n",
                                   tokenizer::kThinkMaxMinContext);
                    if (prefix_changed) {  // the Think Max text sits right after BOS: start over
                        transcript = tokenizer::encode_cli_preamble(tok, opt.system, mode);
                        session = make_session();
                    }
                } else if (cmd == "/ctx") {
                    const long n = std::strtol(arg.c_str(), nullptr, 10);
                    if (n <= 0) {
                        fmt::print(stderr, "ds4: /ctx needs a positive number\n");
                    } else {
                        opt.ctx = static_cast<uint32_t>(n);
                        session = make_session();  // KV discarded, transcript kept
                        fmt::print(stderr,
                                   "context: {} tokens (next turn prefills the transcript)\n",
                                   opt.ctx);
                    }
                } else if (cmd == "/read") {
                    std::ifstream in(arg, std::ios::binary);
                    if (!in) {
                        fmt::print(stderr, "ds4: cannot read {}\n", arg);
                    } else {
                        pending_user.assign(std::istreambuf_iterator<char>(in), {});
                    }
                } else {
                    fmt::print(stderr, "ds4: unknown command {} (/help lists them)\n", cmd);
                }
                continue;
            }
        }

        const size_t rollback = transcript.size();
        tokenizer::append_cli_user_turn(tok, line, mode, transcript);
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
        try {
            const auto st = runtime::generate(*session, suffix, sampler, gp, [&](int32_t id) {
                generated.push_back(id);
                printer.push(id);
            });
            printer.finish();
            fmt::print(stderr, "ds4: prefill: {:.2f} t/s, generation: {:.2f} t/s\n",
                       st.prefill_tps(), st.generation_tps());
        } catch (const Error &e) {
            fmt::print(stderr, "ds4: {}\n", e.what());
            transcript.resize(rollback);
            session = make_session();
            continue;
        }
        if (generated.empty()) {  // cancelled before anything: roll the turn back
            transcript.resize(rollback);
            session = make_session();
            continue;
        }
        transcript.insert(transcript.end(), generated.begin(), generated.end());
        if (generated.back() != tok.specials().eos) transcript.push_back(tok.specials().eos);
    }
    write_history(history.c_str());
    return 0;
}

}  // namespace ds4::cli
