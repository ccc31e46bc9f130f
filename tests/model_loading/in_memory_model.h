#pragma once
// A model's tensor table without its bytes: every tensor of the layout (model/tensor_layout.h)
// for the given hyper-parameters, typed as published and the routed experts as asked, so that
// byte counts of the full Flash layout are checked without an 86 GB file.
#include <deque>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/hparams.h"
#include "model/tensor_layout.h"
#include "model/weights.h"

namespace ds4::test {

struct InMemoryModel {
    model::HParams hp;
    std::deque<gguf::TensorInfo> infos;  // stable addresses
    model::ModelWeights w;
};

inline void build_in_memory(InMemoryModel &m, const model::HParams &hp, GgmlType gate_up,
                            GgmlType down) {
    using namespace model;
    m.hp = hp;
    m.w.layers.resize(m.hp.n_layer);
    for_each_tensor(m.hp, &m.w, [&](const TensorSpec &s, const gguf::TensorInfo **slot) {
        if (s.role == TensorRole::RouterBias && m.hp.is_hash_layer(static_cast<uint32_t>(s.layer)))
            return;
        GgmlType type = role_published_type(s.role);
        if (s.role == TensorRole::RoutedGateUp) type = gate_up;
        if (s.role == TensorRole::RoutedDown) type = down;
        gguf::TensorInfo t;
        t.name = s.name;
        t.ne = s.ne;
        t.type = type;
        t.n_elements = 1;
        for (auto d : s.ne) t.n_elements *= d;
        t.n_bytes = gguf::tensor_n_bytes(type, s.ne);
        m.infos.push_back(t);
        *slot = &m.infos.back();
    });
}

}  // namespace ds4::test
