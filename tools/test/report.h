#pragma once
// ds4-test's output: one line per check (PASS / FAIL / SKIP, the mode, what was checked), notes
// that are not checks (lines starting with "#"), and the closing "N passed, N failed, N skipped".
// Lines are flushed as they are written, so a slow mode shows its progress.
#include <string_view>

namespace ds4::test {

class Report {
  public:
    void pass(std::string_view mode, std::string_view what);
    void fail(std::string_view mode, std::string_view what);
    // A check that could not run here; `what` says why. Never counted as passed.
    void skip(std::string_view mode, std::string_view what);
    void note(std::string_view mode, std::string_view text);
    void check(bool ok, std::string_view mode, std::string_view what) {
        ok ? pass(mode, what) : fail(mode, what);
    }

    int passed() const { return passed_; }
    int failed() const { return failed_; }
    int skipped() const { return skipped_; }
    void print_summary() const;

  private:
    int passed_ = 0, failed_ = 0, skipped_ = 0;
};

}  // namespace ds4::test
