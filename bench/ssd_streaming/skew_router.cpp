// bench_skew_router: makes a synthetic model's routing skewed, as a trained router's is: in every
// score-routed layer, --hot experts (every 256/hot-th one, shifted per layer) get --bias added to
// their selection bias (exp_probs_b, F32), in place. Random weights otherwise route about
// uniformly, which no real model does (docs/SSD_STREAMING.md).
//   bench_skew_router MODEL.gguf [--hot 32] [--bias 1.0]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "model/hparams.h"
#include "model/weights.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: bench_skew_router MODEL.gguf [--hot N] [--bias B]\n");
        return 2;
    }
    uint32_t hot = 32;
    float bias = 1.0f;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--hot") == 0)
            hot = uint32_t(std::atoi(argv[i + 1]));
        else if (std::strcmp(argv[i], "--bias") == 0)
            bias = std::strtof(argv[i + 1], nullptr);
    }
    try {
        const std::string path = argv[1];
        auto f = ds4::gguf::File::open(path);
        const auto hp = ds4::model::HParams::from_gguf(*f);
        const auto w = ds4::model::ModelWeights::bind(*f, hp);
        const int fd = ::open(path.c_str(), O_WRONLY);
        if (fd < 0) throw ds4::Error(path + ": cannot open for writing");
        uint32_t layers = 0;
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            const ds4::model::Tensor t = w.layers[il].exp_probs_b;
            if (!t || t->type != ds4::GgmlType::F32) continue;
            std::vector<float> b(hp.n_expert);
            std::memcpy(b.data(), t->data, hp.n_expert * sizeof(float));
            const uint32_t step = hot ? std::max(1u, hp.n_expert / hot) : hp.n_expert;
            for (uint32_t k = 0; k < hot && k * step < hp.n_expert; ++k)
                b[(k * step + il) % hp.n_expert] += bias;
            const off_t off = off_t(t->data - f->base());
            if (::pwrite(fd, b.data(), b.size() * sizeof(float), off) != ssize_t(b.size() * 4))
                throw ds4::Error(path + ": write failed");
            ++layers;
        }
        ::close(fd);
        std::printf("bench_skew_router: %u layers: %u hot experts each, bias +%.3f\n", layers, hot,
                    bias);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_skew_router: %s\n", e.what());
        return 1;
    }
    return 0;
}
