// cpu_profile.h is header-only; this file keeps the header compiled on its own.
#include "runtime/cpu_profile.h"
