#include "exit_codes.h"

namespace ds4::tools {

std::string exit_code_footer() {
    return "Exit status: 0 ok, 1 runtime failure (e.g. out of memory, a failed write or check), "
           "2 bad arguments, environment or input file, 130 interrupted (Ctrl-C).\n";
}

}  // namespace ds4::tools
