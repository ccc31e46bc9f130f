#include "speed_line.h"

#include <fmt/format.h>

namespace ds4::tools {

std::string speed_line(const runtime::GenerateStats &st) {
    return fmt::format(
        "ds4: prefill: {} tokens, {:.3f} s, {:.2f} t/s; generation: {} tokens, {:.3f} s, {:.2f} "
        "t/s; stopped: {}\n",
        st.prompt_tokens, st.prefill_seconds, st.prefill_tps(), st.generated, st.generation_seconds,
        st.generation_tps(), runtime::stop_reason_name(st.stop));
}

}  // namespace ds4::tools
