#include "version.h"

namespace ds4::tools {

const char *version_string() {
    return "ds4cpp " DS4_VERSION;
}

}  // namespace ds4::tools
