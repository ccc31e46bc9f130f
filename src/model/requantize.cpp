#include "model/requantize.h"

#include <fmt/format.h>

#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/hparams.h"
#include "model/tensor_layout.h"
#include "model/weights.h"
#include "quant/quant.h"

namespace ds4::model {

void requantize_model(const std::string &in_path, const std::string &out_path, QuantMix mix,
                      bool progress, int n_threads) {
    auto in = gguf::File::open(in_path);
    backend::cpu::ThreadPool pool(n_threads);
    const HParams hp = HParams::from_gguf(*in);
    ModelWeights w = ModelWeights::bind(*in, hp);
    gguf::Writer out;
    for (const auto &[key, value] : in->metadata())
        if (key != "general.alignment") out.set(key, value);
    for_each_tensor(hp, &w, [&](const TensorSpec &spec, const gguf::TensorInfo **slot) {
        const gguf::TensorInfo *t = *slot;
        if (!t) return;  // an optional tensor the file does not have
        const GgmlType type = mix_tensor_type(spec.role, mix);
        if (type != t->type && !quant::kernels(type).quantize_row)
            throw Error(fmt::format(
                "{}: no {} quantizer in this build (needed for tensor '{}' of the {} mix)",
                out_path, ggml_type_name(type), t->name, quant_mix_name(mix)));
        const uint64_t row = t->ne[0];
        if (row % ggml_type_info(type).block_elems != 0)
            throw Error(
                fmt::format("tensor '{}': rows of {} values cannot be stored as {} (blocks of {})",
                            t->name, row, ggml_type_name(type), ggml_type_info(type).block_elems));
        out.add_tensor_lazy(
            t->name, type, t->ne, [t, type, row, progress, &pool](uint8_t *dst, size_t n_bytes) {
                const int64_t n_rows = static_cast<int64_t>(t->n_elements / row);
                if (type == t->type) {
                    std::copy(t->data, t->data + n_bytes, dst);
                    return;
                }
                const size_t src_row = t->row_bytes(), dst_row = ggml_row_bytes(type, row);
                // Each thread quantizes whole rows; the first failing row (lowest index) is
                // reported once every thread is done.
                std::mutex failure_mutex;
                int64_t failed_row = n_rows;
                std::string failure;
                pool.parallel_for(n_rows, 1, [&](int64_t begin, int64_t end, int) {
                    std::vector<float> buf(row);
                    for (int64_t r = begin; r < end; ++r) {
                        quant::dequantize_row(t->type, t->data + r * src_row, buf.data(),
                                              static_cast<int64_t>(row));
                        try {
                            quant::quantize_row(type, buf.data(), dst + r * dst_row,
                                                static_cast<int64_t>(row));
                        } catch (const Error &e) {
                            const std::lock_guard<std::mutex> lock(failure_mutex);
                            if (r < failed_row) {
                                failed_row = r;
                                failure = e.what();
                            }
                            return;
                        }
                    }
                });
                if (failed_row < n_rows)
                    throw Error(
                        fmt::format("tensor '{}', row {}: {}", t->name, failed_row, failure));
                if (progress && n_bytes >= (16u << 20))
                    fmt::print(stderr, "quantize: {} -> {}\n", t->name, ggml_type_name(type));
            });
    });
    out.write(out_path);
}

}  // namespace ds4::model
