#include "startup_line.h"

#include <fmt/format.h>

#include <filesystem>

#include "model/weights.h"
#include "quant/quant.h"

namespace ds4::tools {

namespace {

// "cpu", or "cuda (NVIDIA H200)": the backend, and the device the weights are on; with the layers
// in ranges over several, "cuda (2 ranges of layers: NVIDIA H200, NVIDIA H200)".
std::string backend_text(runtime::Model &model) {
    std::string text = runtime::backend_name(model.backend());
    if (!model.device()) return text;
    const size_t n = model.layer_ranges().size();
    std::string names;
    for (size_t i = 0; i < n; ++i) {
        std::string name = model.device(i)->device_name().substr(0, 60);
        for (char &c : name)
            if (static_cast<unsigned char>(c) < 0x20) c = ' ';
        names += (i ? ", " : "") + name;
    }
    if (n == 1) return text + fmt::format(" ({})", names);
    return text + fmt::format(" ({} {}: {})", n,
                              model.tensor_split() ? "parts split by tensors" : "ranges of layers",
                              names);
}

}  // namespace

std::string startup_line(const std::string &tool, const std::string &path, runtime::Model &model) {
    const auto &hp = model.hparams();
    // The name comes from the file: shortened and without control bytes, it stays one line.
    std::string name = model.file().get_string_or("general.name", "").substr(0, 60);
    for (char &c : name)
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    const double size = double(model.file().file_size());
    const std::string size_text = size >= 1024.0 * 1024 * 1024
                                      ? fmt::format("{:.2f} GiB", size / (1024.0 * 1024 * 1024))
                                      : fmt::format("{:.2f} MiB", size / (1024.0 * 1024));
    return fmt::format(
        "{}: model {}{} ({}), routed experts {}, {} layers, context length {}, {} threads, SIMD "
        "{}, backend {}\n",
        tool, std::filesystem::path(path).filename().string(),
        name.empty() ? "" : fmt::format(" \"{}\"", name), size_text,
        ds4::model::routed_quant_mix(hp, model.weights()), hp.n_layer,
        hp.context_length ? std::to_string(hp.context_length) : std::string("unknown"),
        model.pool().n_threads(), quant::simd_level_name(quant::detected_simd_level()),
        backend_text(model));
}

}  // namespace ds4::tools
