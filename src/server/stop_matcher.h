#pragma once
// Stop sequences over a stream of text pieces (docs/SERVER.md, Stop sequences). push() returns
// the text that can be shown now: everything up to the earliest stop sequence once one appears
// (then stopped() is true and nothing more is returned), else everything except the longest
// tail that may still turn out to be the start of a stop sequence, which is held until the next
// piece resolves it. A sequence split across pieces is therefore found, and a stream never shows
// bytes that a later stop would have cut.
#include <string>
#include <string_view>
#include <vector>

namespace ds4::server {

class StopMatcher {
  public:
    explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

    std::string push(std::string_view text);
    // What is still held, at the end of the stream (nothing once stopped).
    std::string finish();
    bool stopped() const { return stopped_; }
    // The stop sequence found (the first listed of those that start earliest), once stopped.
    const std::string &matched() const { return matched_; }

  private:
    std::vector<std::string> stops_;
    std::string held_, matched_;
    bool stopped_ = false;
};

}  // namespace ds4::server
