#include "token_display.h"

#include <fmt/format.h>

#include "tokenizer/utf8.h"

namespace ds4::test {

std::string display_token(std::string_view bytes) {
    const bool utf8 = tokenizer::utf8_is_valid(bytes);
    std::string out = "'";
    for (char ch : bytes) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c == '\'' || c == '\\')
            out += fmt::format("\\{}", ch);
        else if (c < 0x20 || c == 0x7f || (!utf8 && c >= 0x80))
            out += fmt::format("\\x{:02x}", c);
        else
            out += ch;
    }
    return out + "'";
}

}  // namespace ds4::test
