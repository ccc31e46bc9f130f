// Loading a deepseek4 GGUF: hyper-parameters from metadata, tensor binding, and the precise error
// for each kind of foreign or damaged file. Models come from the synthetic maker and are then
// altered one defect at a time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/hparams.h"
#include "model/model_summary.h"
#include "model/requantize.h"
#include "model/synthetic_model.h"
#include "model/weights.h"
#include "quant/quant.h"

using namespace ds4;
using namespace ds4::model;

namespace {

const std::string kVocab = std::string(DS4_SOURCE_DIR) + "/models/ds4-vocab.gguf";

std::string tmp_path(const std::string &name) {
    return ::testing::TempDir() + "/" + name;
}

// The tiny shape with a 512-token vocabulary (a made-up one) keeps these files ~1 MB; the real
// vocabulary is exercised once, by EveryMixLoadsAndReportsItself's first case.
const std::string &tiny_path(QuantMix mix, bool real_vocab = false) {
    static std::map<std::pair<QuantMix, bool>, std::string> made;
    auto it = made.find({mix, real_vocab});
    if (it != made.end()) return it->second;
    std::unique_ptr<gguf::File> vocab;
    std::vector<uint8_t> mini;
    if (real_vocab) {
        vocab = gguf::File::open(kVocab);
    } else {
        gguf::Writer w;
        std::vector<std::string> tokens;
        for (int i = 0; i < 512; ++i) tokens.push_back(fmt::format("t{}", i));
        w.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
        w.set("tokenizer.ggml.tokens", gguf::Value::array_of_strings(tokens));
        mini = w.to_bytes();
        vocab = gguf::File::from_memory(mini.data(), mini.size(), "mini-vocab");
    }
    const std::string p = tmp_path(std::string("tiny-") + quant_mix_name(mix) +
                                   (real_vocab ? "-real" : "") + ".gguf");
    write_synthetic_model(shape_preset("tiny", real_vocab ? 129280 : 512), mix, 7, *vocab, p,
                          false);
    return made[{mix, real_vocab}] = p;
}

struct Mutation {
    std::function<bool(const std::string &key, gguf::Value &v)> kv;  // false drops the key
    std::function<bool(gguf::TensorInfo &t)> tensor;                 // false drops it
    std::function<void(gguf::Writer &w)> extra;
};

// Rewrites `src` with one defect and returns the loader's error message ("" if it loaded).
std::string load_error_after(const std::string &src, const Mutation &m) {
    auto f = gguf::File::open(src);
    gguf::Writer w;
    for (const auto &[key, value] : f->metadata()) {
        gguf::Value v = value;
        if (!m.kv || m.kv(key, v)) w.set(key, v);
    }
    for (const auto &t : f->tensors()) {
        gguf::TensorInfo copy = t;
        if (m.tensor && !m.tensor(copy)) continue;
        const uint64_t n = gguf::tensor_n_bytes(copy.type, copy.ne);
        std::vector<uint8_t> bytes(n, 0);
        std::memcpy(bytes.data(), t.data, std::min<uint64_t>(n, t.n_bytes));
        w.add_tensor(copy.name, copy.type, copy.ne, bytes.data(), n);
    }
    if (m.extra) m.extra(w);
    const std::string out = tmp_path("mutated.gguf");
    w.write(out);
    try {
        auto g = gguf::File::open(out);
        const HParams hp = HParams::from_gguf(*g);
        (void)ModelWeights::bind(*g, hp);
    } catch (const Error &e) {
        return e.what();
    }
    return "";
}

TEST(ModelLoading, EveryMixLoadsAndReportsItself) {
    const std::map<QuantMix, std::string> names = {{QuantMix::F32, "f32"},
                                                   {QuantMix::Q8_0, "q8_0"},
                                                   {QuantMix::Q2, "q2"},
                                                   {QuantMix::Q4, "q4"}};
    for (const auto &[mix, name] : names) {
        SCOPED_TRACE(name);
        const std::string &path = tiny_path(mix, mix == QuantMix::Q2);
        auto f = gguf::File::open(path);
        const HParams hp = HParams::from_gguf(*f);
        EXPECT_EQ(hp.n_layer, 6u);
        EXPECT_EQ(hp.compress_ratio, (std::vector<uint32_t>{0, 0, 4, 16, 4, 16}));
        EXPECT_EQ(hp.attention_kind(0), AttentionKind::Window);
        EXPECT_EQ(hp.attention_kind(2), AttentionKind::Overlapped);
        EXPECT_EQ(hp.attention_kind(3), AttentionKind::Compressed);
        EXPECT_TRUE(hp.is_hash_layer(2));
        EXPECT_FALSE(hp.is_hash_layer(3));
        const ModelWeights w = ModelWeights::bind(*f, hp);
        EXPECT_EQ(routed_quant_mix(hp, w), name);
        EXPECT_NE(w.layers[2].idx_q_b, nullptr);
        EXPECT_EQ(w.layers[3].idx_q_b, nullptr);
        EXPECT_NE(w.layers[3].comp_kv, nullptr);
        EXPECT_EQ(w.layers[1].comp_kv, nullptr);
        EXPECT_NE(w.layers[0].tid2eid, nullptr);
        EXPECT_EQ(w.layers[0].exp_probs_b, nullptr);
        EXPECT_NE(w.layers[3].exp_probs_b, nullptr);
        // The size report accounts for every byte of the data section.
        uint64_t sum = 0;
        for (const auto &t : f->tensors()) sum += t.n_bytes;
        EXPECT_EQ(bytes_by_class(hp, w).back().bytes, sum);
        const std::string report = inspect_report(path, hp, w);
        EXPECT_NE(report.find("layer  2: ratio 4 + indexer, hash-routed"), std::string::npos)
            << report;
        EXPECT_NE(report.find("layer  3: ratio 16, top-k routed"), std::string::npos) << report;
    }
}

TEST(ModelLoading, ForeignFilesGetPreciseErrors) {
    const std::string &src = tiny_path(QuantMix::Q8_0);
    struct Case {
        const char *what;
        Mutation m;
        const char *expect;
    };
    using gguf::Value;
    auto set_kv = [](std::string key, Value value) {
        return Mutation{[key, value](const std::string &k, Value &v) {
                            if (k == key) v = value;
                            return true;
                        },
                        nullptr, nullptr};
    };
    auto drop_kv = [](std::string key) {
        return Mutation{[key](const std::string &k, Value &) { return k != key; }, nullptr,
                        nullptr};
    };
    auto change_tensor = [](std::function<bool(gguf::TensorInfo &)> fn) {
        return Mutation{nullptr, std::move(fn), nullptr};
    };
    const std::vector<Case> cases = {
        {"architecture", set_kv("general.architecture", Value::string("llama")),
         "general.architecture is 'llama', expected 'deepseek4'"},
        {"missing key", drop_kv("deepseek4.expert_count"),
         "missing metadata key 'deepseek4.expert_count'"},
        {"key type", set_kv("deepseek4.block_count", Value::f32(6)),
         "metadata key 'deepseek4.block_count': f32 value where an integer is needed"},
        {"kv heads", set_kv("deepseek4.attention.head_count_kv", Value::u32(2)),
         "head_count_kv is 2, this architecture has one shared KV head"},
        {"ratios short",
         set_kv("deepseek4.attention.compress_ratios", Value::array_of_u32({0, 0, 4})),
         "deepseek4.attention.compress_ratios has 3 entries, the model has 6 layers"},
        {"ratio one",
         set_kv("deepseek4.attention.compress_ratios", Value::array_of_u32({0, 0, 4, 1, 4, 16})),
         "compress_ratios[3] = 1"},
        {"missing tensor",
         change_tensor([](gguf::TensorInfo &t) { return t.name != "blk.4.attn_kv.weight"; }),
         "missing tensor 'blk.4.attn_kv.weight' (expected shape [256, 64])"},
        {"wrong type", change_tensor([](gguf::TensorInfo &t) {
             if (t.name == "blk.1.attn_norm.weight") t.type = GgmlType::F16;
             return true;
         }),
         "tensor 'blk.1.attn_norm.weight' has type F16, expected F32"},
        {"wrong shape", change_tensor([](gguf::TensorInfo &t) {
             if (t.name == "blk.3.attn_compressor_kv.weight") t.ne = {256, 128};
             return true;
         }),
         "tensor 'blk.3.attn_compressor_kv.weight' has shape [256, 128], expected [256, 64]"},
        {"indexer on a ratio-16 layer",
         Mutation{nullptr, nullptr,
                  [](gguf::Writer &w) {
                      std::vector<float> z(8);
                      w.add_tensor("blk.3.indexer.proj.weight", GgmlType::F32, {8}, z.data(), 32);
                  }},
         "unexpected tensor 'blk.3.indexer.proj.weight'"},
        {"gate/up types differ", change_tensor([](gguf::TensorInfo &t) {
             if (t.name == "blk.5.ffn_up_exps.weight") t.type = GgmlType::F16;
             return true;
         }),
         "blk.5: routed gate (Q8_0) and up (F16) experts must have the same type"},
        {"hash table on a routed layer", set_kv("deepseek4.hash_layer_count", Value::u32(2)),
         "unexpected tensor 'blk.2.ffn_gate_tid2eid.weight'"},
        {"missing hash table", set_kv("deepseek4.hash_layer_count", Value::u32(4)),
         "missing tensor 'blk.3.ffn_gate_tid2eid.weight'"},
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.what);
        const std::string err = load_error_after(src, c.m);
        EXPECT_NE(err.find(c.expect), std::string::npos) << "error was: '" << err << "'";
    }
    EXPECT_EQ(load_error_after(src, {}), "");  // the unmodified rewrite loads
}

TEST(Requantize, F32ToPublishedMixes) {
    const std::string &src = tiny_path(QuantMix::F32);
    auto f32 = gguf::File::open(src);
    const HParams hp = HParams::from_gguf(*f32);
    const ModelWeights w32 = ModelWeights::bind(*f32, hp);
    for (QuantMix mix : {QuantMix::Q8_0, QuantMix::Q4, QuantMix::Q2}) {
        SCOPED_TRACE(quant_mix_name(mix));
        const std::string out = tmp_path(std::string("requant-") + quant_mix_name(mix) + ".gguf");
        requantize_model(src, out, mix, false);
        auto f = gguf::File::open(out);
        const ModelWeights w = ModelWeights::bind(*f, HParams::from_gguf(*f));
        EXPECT_EQ(routed_quant_mix(hp, w), quant_mix_name(mix));
        EXPECT_EQ(w.token_embd->type, GgmlType::F16);
        EXPECT_EQ(w.layers[2].attn_q_b->type, GgmlType::Q8_0);
        EXPECT_EQ(w.layers[2].attn_norm->type, GgmlType::F32);
        EXPECT_EQ(w.layers[0].tid2eid->type, GgmlType::I32);
        EXPECT_EQ(std::memcmp(w.layers[0].tid2eid->data, w32.layers[0].tid2eid->data,
                              w32.layers[0].tid2eid->n_bytes),
                  0);
        // A routed expert row survives the round trip within the format's error (Q8_0 ~0.4%,
        // Q4_K ~7%, IQ2_XXS ~34% of the rms for Gaussian-like rows; measured in tests/quant).
        const uint64_t K = hp.n_embd;
        std::vector<float> a(K), b(K);
        quant::dequantize_row(GgmlType::F32, w32.layers[3].ffn_up_exps->data, a.data(), K);
        quant::dequantize_row(w.layers[3].ffn_up_exps->type, w.layers[3].ffn_up_exps->data,
                              b.data(), K);
        double err = 0, ref = 0;
        for (uint64_t i = 0; i < K; ++i) {
            err += (a[i] - b[i]) * double(a[i] - b[i]);
            ref += double(a[i]) * a[i];
        }
        EXPECT_LT(std::sqrt(err / ref), mix == QuantMix::Q8_0 ? 0.01
                                        : mix == QuantMix::Q4 ? 0.12
                                                              : 0.40);
    }
}

// A value a quantizer refuses (IQ2_XXS: NaN) names its tensor and row, whichever thread met it,
// and leaves no output file.
TEST(Requantize, NonFiniteWeightNamesTensorAndRow) {
    const std::string &src = tiny_path(QuantMix::F32);
    uint64_t nan_at = 0, row_values = 0;
    {
        auto f = gguf::File::open(src);
        const gguf::TensorInfo *t = f->find_tensor("blk.3.ffn_up_exps.weight");
        ASSERT_NE(t, nullptr);
        row_values = t->ne[0];
        nan_at = f->data_offset() + t->offset + sizeof(float) * (5 * row_values + 7);  // row 5
    }
    std::ifstream in(src, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(&bytes[nan_at], &nan, sizeof(nan));
    const std::string bad = tmp_path("requant-nan-f32.gguf"), out = tmp_path("requant-nan-q2.gguf");
    std::ofstream(bad, std::ios::binary) << bytes;
    std::remove(out.c_str());
    for (int threads : {1, 2, 3}) {
        try {
            requantize_model(bad, out, QuantMix::Q2, false, threads);
            ADD_FAILURE() << "a NaN weight was quantized to IQ2_XXS";
        } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find("tensor 'blk.3.ffn_up_exps.weight', row 5"),
                      std::string::npos)
                << e.what();
        }
        EXPECT_FALSE(std::filesystem::exists(out)) << threads << " threads";
    }
}

TEST(ModelLoading, ShapeJsonOverridesTiny) {
    const HParams h =
        shape_from_json(R"({"n_layer": 3, "compress_ratio": [0, 4, 8], "n_expert": 16})", 100);
    EXPECT_EQ(h.n_layer, 3u);
    EXPECT_EQ(h.n_expert, 16u);
    EXPECT_EQ(h.compress_ratio, (std::vector<uint32_t>{0, 4, 8}));
    EXPECT_THROW(shape_from_json(R"({"n_layers": 3})", 100), Error);
    EXPECT_THROW(shape_from_json("[1]", 100), Error);
    EXPECT_THROW(shape_from_json("{", 100), Error);
    EXPECT_THROW(parse_quant_mix("q3"), Error);
}

}  // namespace
