#include "model_load.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

namespace ds4::tools {

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024, kMiB = 1024.0 * 1024;

std::string amount(double bytes, double unit) {
    return fmt::format("{:.1f}", bytes / unit);
}

}  // namespace

std::string upload_progress_text(uint64_t done, uint64_t total) {
    constexpr int kWidth = 20;
    const double frac = total ? std::min(1.0, double(done) / double(total)) : 1.0;
    const int filled = int(frac * kWidth);
    const bool gib = double(total) >= kGiB;
    const double unit = gib ? kGiB : kMiB;
    return fmt::format("uploading weights to the CUDA device: [{}{}] {} / {} {}",
                       std::string(filled, '#'), std::string(kWidth - filled, '.'),
                       amount(double(done), unit), amount(double(total), unit),
                       gib ? "GiB" : "MiB");
}

std::string upload_done_text(uint64_t bytes, const std::string &device, double seconds) {
    const double b = double(bytes);
    const std::string size =
        b >= kGiB ? fmt::format("{:.2f} GiB", b / kGiB) : fmt::format("{:.2f} MiB", b / kMiB);
    return fmt::format(
        "uploaded {} of weights ({} bytes) to {} in {:.1f} s{}", size, bytes, device, seconds,
        seconds >= 0.05 ? fmt::format(" ({:.2f} GiB/s)", b / kGiB / seconds) : std::string());
}

UploadMeter::UploadMeter(std::string tool, std::FILE *out, bool in_place)
    : tool_(std::move(tool)),
      out_(out),
      in_place_(in_place),
      start_(std::chrono::steady_clock::now()) {}

void UploadMeter::progress(uint64_t done, uint64_t total) {
    if (!in_place_) return;
    // A callback per tensor must not flood the terminal.
    const int permille = total ? int(std::min(done, total) * 1000 / total) : 1000;
    const auto now = std::chrono::steady_clock::now();
    if (permille == shown_permille_) return;
    if (permille < 1000 && drawn_ && now - last_ < std::chrono::milliseconds(50)) return;
    shown_permille_ = permille;
    last_ = now;
    fmt::print(out_, "\r{}: {}\033[K", tool_, upload_progress_text(done, total));
    std::fflush(out_);
    drawn_ = true;
}

void UploadMeter::done(uint64_t bytes, const std::string &device) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    fmt::print(out_, "{}{}: {}\n", drawn_ ? "\r\033[K" : "", tool_,
               upload_done_text(bytes, device, seconds));
    std::fflush(out_);
}

void UploadMeter::failed() {
    if (drawn_) fmt::print(out_, "\n");  // the bar stays, showing where it stopped
    drawn_ = false;
}

std::unique_ptr<runtime::Model> load_model(const std::string &tool, const std::string &path,
                                           runtime::ModelOptions opts) {
    if (opts.backend == runtime::Backend::Cpu) {
        opts.upload_progress = {};
        return runtime::Model::load(path, opts);
    }
    UploadMeter meter(tool, stderr, isatty(STDERR_FILENO) == 1);
    opts.upload_progress = [&](uint64_t done, uint64_t total) { meter.progress(done, total); };
    std::unique_ptr<runtime::Model> model;
    try {
        model = runtime::Model::load(path, opts);
    } catch (const Error &) {
        meter.failed();
        throw;
    }
    // Split over several devices: the bytes of every range, then which layers went where.
    const size_t n_ranges = model->layer_ranges().size();
    uint64_t bytes = 0;
    for (size_t i = 0; i < n_ranges; ++i) bytes += model->device(i)->bytes();
    const std::string where = n_ranges == 1 ? model->device()->device_name()
                              : model->tensor_split()
                                  ? fmt::format("{} parts of the model on CUDA devices", n_ranges)
                                  : fmt::format("{} ranges of layers on CUDA devices", n_ranges);
    meter.done(bytes, where);
    for (const std::string &line : model->placement_log())
        fmt::print(stderr, "{}: {}\n", tool, line);
    return model;
}

}  // namespace ds4::tools
