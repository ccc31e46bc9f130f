#pragma once
// One exception type for the whole engine. Messages name the object at fault (file, key,
// tensor) and what was expected; each layer that catches one may add its own context.
#include <stdexcept>
#include <string>

namespace ds4 {

class Error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

}  // namespace ds4
