#pragma once
// The `ds4 --inspect` report: dimensions, layer schedule, bytes by tensor class (the classes of
// docs/MODEL.md 11.1) and the routed-expert quant mix.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/hparams.h"
#include "model/weights.h"

namespace ds4::model {

struct ClassBytes {
    std::string name;
    uint64_t bytes = 0;
    uint64_t params = 0;
};

// Tensor bytes grouped by class, in the order of docs/MODEL.md 11.1; the last entry is the total.
std::vector<ClassBytes> bytes_by_class(const HParams &hp, const ModelWeights &w);

// One line per layer kind run, e.g. "0-1 window, hash-routed".
std::string layer_schedule(const HParams &hp);

std::string inspect_report(const std::string &path, const HParams &hp, const ModelWeights &w);

}  // namespace ds4::model
