#include "backend_option.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "cli_app.h"
#include "common/error.h"
#include "exit_codes.h"
#include "runtime/session.h"

namespace ds4::tools {

runtime::Backend BackendFlags::backend() const {
    // Every flag given, as written, with the backend it names.
    std::vector<std::pair<std::string, runtime::Backend>> named;
    if (cpu) named.emplace_back("--cpu", runtime::Backend::Cpu);
    if (cuda) named.emplace_back("--cuda", runtime::Backend::Cuda);
    if (!gpus.empty()) named.emplace_back("--gpus", runtime::Backend::Cuda);
    if (!name.empty()) {
        try {
            named.emplace_back("--backend " + name, runtime::parse_backend(name));
        } catch (const Error &) {  // the parser's check refuses it first; kept for direct use
            throw UsageError(
                fmt::format("--backend: must be cpu or cuda, got {}", quoted_arg(name)));
        }
    }
    for (const auto &[flag, b] : named)
        if (b != named.front().second)
            throw UsageError(fmt::format("{} and {} name different backends; give one",
                                         named.front().first, flag));
    return named.empty() ? runtime::Backend::Cpu : named.front().second;
}

namespace {

// "0,1" -> {0, 1}: numbers 0..max separated by commas.
std::vector<uint32_t> number_list(const std::string &flag, const std::string &text, uint32_t max,
                                  const char *example) {
    std::vector<uint32_t> out;
    for (size_t b = 0; b <= text.size();) {
        const size_t e = std::min(text.find(',', b), text.size());
        const std::string item = text.substr(b, e - b);
        const bool digits = !item.empty() && item.size() <= 10 &&
                            item.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || std::stoull(item) > max)
            throw UsageError(
                fmt::format("{}: expected numbers of 0 to {} separated by commas, "
                            "like {}; got {}",
                            flag, max, example, quoted_arg(text)));
        out.push_back(uint32_t(std::stoull(item)));
        b = e + 1;
    }
    return out;
}

}  // namespace

LayerPlacement BackendFlags::placement() const {
    LayerPlacement p;
    if (!gpus.empty())
        for (uint32_t g : number_list("--gpus", gpus, runtime::kMaxCudaOrdinal, "0,1"))
            p.gpus.push_back(int(g));
    if (!layer_split.empty()) {
        p.layer_starts = number_list("--layer-split", layer_split, 1u << 20, "21");
        for (size_t i = 0; i < p.layer_starts.size(); ++i)
            if (p.layer_starts[i] == 0 || (i > 0 && p.layer_starts[i] <= p.layer_starts[i - 1]))
                throw UsageError(fmt::format(
                    "--layer-split: the first layers of the second range on, ascending and above "
                    "0; got {}",
                    quoted_arg(layer_split)));
    }
    if (split == "tensors") {
        p.split = runtime::GpuSplit::Tensors;
        if (p.gpus.size() < 2)
            throw UsageError("--split tensors: name two or more GPUs with --gpus");
        if (!p.layer_starts.empty())
            throw UsageError("--split tensors and --layer-split: give one");
    }
    return p;
}

void add_backend_options(CLI::App &app, BackendFlags &flags) {
    app.add_option("--backend", flags.name, "Backend: cpu (the default) or cuda")
        ->check(CLI::Validator(
            [](std::string &s) -> std::string {
                if (s == runtime::backend_name(runtime::Backend::Cpu) ||
                    s == runtime::backend_name(runtime::Backend::Cuda))
                    return "";
                return fmt::format("must be cpu or cuda, got {}", quoted_arg(s));
            },
            "cpu|cuda"));
    app.add_flag("--cuda", flags.cuda,
                 "CUDA backend (= --backend cuda): the weights are copied to the first CUDA "
                 "device; exits 1 when this build has no CUDA backend or no device answers");
    app.add_flag("--cpu", flags.cpu, "CPU backend (= --backend cpu, the default)");
    app.add_option("--gpus", flags.gpus,
                   "CUDA devices to split the model over, e.g. 0,1 (implies --cuda). With "
                   "--split layers (the default) each holds a range of whole layers and their "
                   "attention state, the token states pass from one to the next (a model larger "
                   "than one GPU; not faster than one GPU that holds it all); the ranges are "
                   "planned so that the largest device share for the context is smallest, unless "
                   "--layer-split gives them. A device may be named twice. Not with "
                   "--ssd-streaming")
        ->type_name("LIST");
    app.add_option("--split", flags.split,
                   "How --gpus share the model: layers (the default: each GPU a range of whole "
                   "layers, for a model larger than one GPU) or tensors (every GPU its heads, "
                   "expert hidden columns and vocabulary rows of every layer and a copy of the "
                   "attention state, each sublayer's partial outputs added; for speed once the "
                   "sums run on the devices, see docs/MULTI_GPU.md)")
        ->check(CLI::IsMember({"layers", "tensors"}));
    app.add_option("--layer-split", flags.layer_split,
                   "Where the ranges of layers of --gpus start, e.g. 21 (layers 0-20 and 21-): "
                   "one number per device after the first. On the CPU backend the ranges run one "
                   "after the other with the same results (a check of the hand-over)")
        ->type_name("LIST");
}

}  // namespace ds4::tools
