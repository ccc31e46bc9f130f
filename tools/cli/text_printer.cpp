#include "text_printer.h"

#include <cstdio>

namespace ds4::cli {

namespace {
constexpr const char *kGrey = "\x1b[90m";
constexpr const char *kReset = "\x1b[0m";
}  // namespace

TextPrinter::TextPrinter(const tokenizer::Tokenizer &tok, bool in_reasoning, bool color)
    : tok_(tok), decoder_(tok), reasoning_(in_reasoning), color_(color) {
    if (reasoning_ && color_) std::fputs(kGrey, stdout);
}

void TextPrinter::write(const std::string &s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    last_ = s.back();
}

void TextPrinter::push(int32_t id) {
    const auto &sp = tok_.specials();
    if (id == sp.eos || id == sp.think_open) return;
    if (id == sp.think_close) {
        write(decoder_.flush());
        if (reasoning_) {
            if (color_) std::fputs(kReset, stdout);
            if (last_ != '\n') write("\n");
            reasoning_ = false;
        }
        return;
    }
    write(decoder_.push(id));
}

void TextPrinter::finish() {
    write(decoder_.flush());
    if (reasoning_ && color_) std::fputs(kReset, stdout);
    if (last_ != '\n') write("\n");
    std::fflush(stdout);
}

}  // namespace ds4::cli
