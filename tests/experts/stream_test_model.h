#pragma once
// A tiny synthetic model in the published q2 layout (routed gate/up IQ2_XXS, down Q2_K, slabs of
// 16,896 and 21,504 bytes: not multiples of a 4 KiB block, so O_DIRECT rounding is exercised),
// written once per process under the test temp folder, and the oracle: the same file opened
// resident, whose mapping gives the bytes every streamed expert must equal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "experts/expert_source.h"
#include "experts/streaming_source.h"
#include "gguf/gguf_file.h"
#include "model/hparams.h"
#include "model/synthetic_model.h"
#include "model/weights.h"
#include "tiny_session_model.h"

namespace ds4::test {

// A path under the test temp folder that no other test process uses (ctest runs several at once).
inline std::string unique_temp(const std::string &name) {
    return ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
}

// Removes a file when it goes out of scope.
struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() { std::remove(path.c_str()); }
};

inline std::string write_stream_model(const std::string &name) {
    const std::string p = unique_temp(name);
    write_made_up_model(model::shape_preset("tiny", 512), model::QuantMix::Q2, 7, p);
    return p;
}

// A model file opened and bound: the mapping (the oracle) and the weights a source is made from.
struct OpenModel {
    std::unique_ptr<gguf::File> file;
    model::HParams hp;
    model::ModelWeights weights;
    std::unique_ptr<experts::ExpertSource> resident;

    explicit OpenModel(const std::string &path)
        : file(gguf::File::open(path)),
          hp(model::HParams::from_gguf(*file)),
          weights(model::ModelWeights::bind(*file, hp)),
          resident(experts::make_resident_source(weights)) {}

    uint32_t n_layer() const { return hp.n_layer; }
    uint32_t n_expert() const { return hp.n_expert; }
};

// The tiny q2 model, shared by the tests of a process.
inline const OpenModel &stream_model() {
    static const RemoveOnExit file{write_stream_model("experts-tiny-q2.gguf")};
    static const OpenModel m(file.path);  // destroyed (unmapped) before the file is removed
    return m;
}

// "" when every byte of `got` equals the oracle's expert, else where the first difference is.
inline std::string diff_expert(const OpenModel &m, const experts::ExpertBytes &got, uint32_t layer,
                               uint32_t expert) {
    const experts::ExpertBytes want = m.resident->get(layer, expert);
    const experts::ExpertGeometry g = experts::expert_geometry(m.weights);
    const uint8_t *w[3] = {want.gate, want.up, want.down};
    const uint8_t *h[3] = {got.gate, got.up, got.down};
    const uint64_t n[3] = {g.gate, g.up, g.down};
    const char *names[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i) {
        if (!h[i]) return std::string(names[i]) + " is null";
        for (uint64_t j = 0; j < n[i]; ++j)
            if (h[i][j] != w[i][j])
                return "layer " + std::to_string(layer) + " expert " + std::to_string(expert) +
                       " " + names[i] + " byte " + std::to_string(j) + ": got " +
                       std::to_string(h[i][j]) + ", file has " + std::to_string(w[i][j]);
    }
    return "";
}

}  // namespace ds4::test
