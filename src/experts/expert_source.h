#pragma once
// Where the bytes of a routed expert come from. The runtime asks for (layer, expert) and gets
// pointers to the expert's gate, up and down rows; whether they live in the resident file mapping
// or in a cache fed from SSD is the source's business. This folder knows nothing about math.
#include <cstdint>
#include <memory>

namespace ds4::model {
struct ModelWeights;
}

namespace ds4::experts {

struct ExpertBytes {
    const uint8_t *gate = nullptr;  // n_ff rows of n_embd values
    const uint8_t *up = nullptr;    // n_ff rows of n_embd values
    const uint8_t *down = nullptr;  // n_embd rows of n_ff values
};

class ExpertSource {
  public:
    virtual ~ExpertSource() = default;
    // The bytes stay valid until the next call to `get` for the same layer.
    virtual ExpertBytes get(uint32_t layer, uint32_t expert) = 0;
};

// Experts read in place from the model file's mapping.
std::unique_ptr<ExpertSource> make_resident_source(const model::ModelWeights &weights);

}  // namespace ds4::experts
