#pragma once
// How the engine tools load a model on the backend of --backend (backend_option.h): the copy of
// the weights to the device shown on stderr (a one-line bar updated in place when stderr is a
// terminal, then always one line with the bytes and seconds), and a backend that cannot start
// told apart from a bad model file.
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "common/error.h"
#include "exit_codes.h"
#include "runtime/session.h"

namespace ds4::tools {

// The model file is good but its backend could not start (runtime::BackendUnavailable): a
// runtime failure (exit 1), where a defect of the file is bad input (exit 2): callers that turn
// the file's errors into UsageError let this one through. The message is the library's.
using BackendError = runtime::BackendUnavailable;

// Runs `open` (a load of the file at `path`): a model file's defects are bad input (UsageError,
// exit 2), whichever part of the file reveals them; a backend that cannot start (BackendError:
// no CUDA, no device) stays a runtime failure (exit 1).
template <typename F>
auto from_model_file(const std::string &path, F &&open) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw UsageError(fmt::format("model {} is a directory, not a GGUF file", path));
    try {
        return open();
    } catch (const BackendError &) {
        throw;
    } catch (const Error &e) {
        throw UsageError(e.what());
    }
}

// runtime::Model::load(path, opts) with the upload shown as said above ("<tool>: ..." lines; an
// upload_progress of `opts` is replaced). Errors of the file are the library's ds4::Error;
// an error of the backend once the file has loaded is a BackendError.
std::unique_ptr<runtime::Model> load_model(const std::string &tool, const std::string &path,
                                           runtime::ModelOptions opts);

// What load_model shows of an upload on `out`: with `in_place` (stderr is a terminal), the bar
// redrawn on one line as progress comes (when its tenth of a percent changes, at most 20 times a
// second, and at the end); the final line always.
class UploadMeter {
  public:
    UploadMeter(std::string tool, std::FILE *out, bool in_place);
    void progress(uint64_t done, uint64_t total);
    // The line of a finished upload (replacing the bar).
    void done(uint64_t bytes, const std::string &device);
    // The upload failed: the bar, if drawn, is ended with a newline so the error starts a line.
    void failed();

  private:
    std::string tool_;
    std::FILE *out_;
    bool in_place_, drawn_ = false;
    int shown_permille_ = -1;
    std::chrono::steady_clock::time_point start_, last_{};
};

// The text of the in-place bar, e.g. "uploading weights to the CUDA device: [#####...]
// 12.3 / 81.0 GiB" (MiB below 1 GiB in all).
std::string upload_progress_text(uint64_t done, uint64_t total);

// The line once the weights are on the device, e.g. "uploaded 81.03 GiB of weights
// (87012345678 bytes) to NVIDIA H200 in 14.2 s (5.71 GiB/s)".
std::string upload_done_text(uint64_t bytes, const std::string &device, double seconds);

}  // namespace ds4::tools
