// bench_cuda_matvec: achieved bandwidth of the CUDA decode matvec kernels next to a device copy,
// in one run (docs/PERFORMANCE.md, CUDA section).
//
// Method: for each weight shape of the published model, enough distinct copies of the matrix to
// fill several times the L2 (so every launch streams from HBM), one matvec per copy, all
// launches captured in one CUDA graph (decode runs as a graph, so launch gaps are not the
// kernel's); the graph is replayed `reps` times between two events. Bandwidth = weight bytes
// read / time. The copy is cudaMemcpyAsync device-to-device of a 2 GiB buffer, counted as bytes
// read + bytes written, replayed the same way, twice: by the copy engines (cudaMemcpyAsync) and
// by the multiprocessors (device_copy, 16-byte loads and stores, as the kernels move bytes); the
// ratios are against the faster. Medians of `reps` replays. Then the latency of the small
// operations of a decode step (bench_small_ops).
//
// Usage: bench_cuda_matvec [--reps N]   (exit 0 ok, 1 no device or a CUDA error, 2 bad usage)
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_copy.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/float_matvec.h"
#include "backend/cuda/host_upload.h"
#include "backend/cuda/hyper_connections.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/q2_k_matvec.h"
#include "backend/cuda/q4_k_matvec.h"
#include "backend/cuda/q8_0_matvec.h"
#include "backend/cuda/q8_k_quantize.h"
#include "backend/cuda/vector_ops.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace {

using ds4::cuda::DeviceBuffer;

struct Shape {
    const char *name;
    int64_t n_rows, k;
};

// Q8_0 matrices of one layer of DeepSeek V4 Flash (and the output head), rows x k.
constexpr Shape kShapes[] = {
    {"attn_q_a", 1024, 4096},       {"attn_kv", 512, 4096},        {"attn_q_b", 32768, 1024},
    {"attn_output_a", 8192, 4096},  {"attn_output_b", 4096, 8192}, {"ffn_gate_shexp", 2048, 4096},
    {"ffn_down_shexp", 4096, 2048}, {"output", 129280, 4096},
};

template <typename F>
double median_ms(int reps, cudaStream_t s, F &&launch) {
    cudaEvent_t a, b;
    DS4_CUDA_CHECK(cudaEventCreate(&a));
    DS4_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    launch();  // warm-up
    DS4_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < reps; ++i) {
        DS4_CUDA_CHECK(cudaEventRecord(a, s));
        launch();
        DS4_CUDA_CHECK(cudaEventRecord(b, s));
        DS4_CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        DS4_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// Captures `body` (launches on s) into a graph and returns a replay function.
template <typename F>
cudaGraphExec_t capture(cudaStream_t s, F &&body) {
    cudaGraph_t g;
    DS4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    body();
    DS4_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    DS4_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    DS4_CUDA_CHECK(cudaGraphDestroy(g));
    return exec;
}

// Replays a captured graph of `launches` matvecs over `bytes` of weights each and prints the
// table row: time per matvec, GB/s and the ratio to the copy. The graph is destroyed.
template <class Body>
void measure_row(cudaStream_t s, int reps, double copy_gbs, const char *name, int64_t rows,
                 int64_t k, double bytes, int launches, Body &&body) {
    cudaGraphExec_t g = capture(s, body);
    const double ms = median_ms(reps, s, [&] { DS4_CUDA_CHECK(cudaGraphLaunch(g, s)); });
    const double us = ms * 1e3 / launches;
    const double gbs = bytes / (us * 1e-6) / 1e9;
    fmt::print("{:<16} {:>7} {:>6} {:>9.1f} {:>10.2f} {:>9.0f} {:>8.2f}\n", name, rows, k,
               bytes / 1e6, us, gbs, gbs / copy_gbs);
    DS4_CUDA_CHECK(cudaGraphExecDestroy(g));
}

// One routed projection of one layer: 6 experts of a [256][rows][k] tensor of the published
// shape per launch, the ids on the device; consecutive launches take the next 6 experts, so 43
// launches read the whole tensor (553 MB for the IQ2_XXS gate, 704 MB for the Q2_K down), well
// past the L2.
template <class Weights, class Launch>
void bench_routed(cudaStream_t s, int reps, double copy_gbs, ds4::GgmlType type, const char *name,
                  int64_t rows, int64_t k, Launch &&launch) {
    constexpr int64_t kExperts = 256, kUsed = 6;
    const auto host = ds4::quant::random_blocks(type, kExperts * rows * k, 9);
    const Weights w(host.data(), rows, k, kExperts);
    std::vector<int32_t> ids(size_t(kExperts + kUsed));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % kExperts);
    DeviceBuffer dids(ids.size() * 4), dx(size_t(k) * 4), xq(static_cast<size_t>(k)),
        xd(size_t(k) / 256 * 4), xb(size_t(k) / 16 * 2), y(size_t(kUsed * rows) * 4);
    DS4_CUDA_CHECK(cudaMemcpy(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice));
    const auto x = ds4::quant::random_blocks(ds4::GgmlType::F32, k, 3);
    DS4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice));
    const ds4::cuda::Q8_KActivation act{xq.as<int8_t>(), xd.as<float>(), xb.as<int16_t>()};
    ds4::cuda::quantize_q8_K_activation(dx.as<float>(), k, act, s);
    const int launches = int((kExperts + kUsed - 1) / kUsed);
    const double bytes = double(kUsed) * double(ds4::quant::row_size(type, k)) * double(rows);
    measure_row(s, reps, copy_gbs, name, rows, k, bytes, launches, [&] {
        for (int j = 0; j < launches; ++j)
            launch(w, dids.as<int32_t>() + (j * kUsed) % kExperts, int(kUsed), act, y.as<float>());
    });
}

// The prefill form of a routed projection (expert_matmul.cuh): a 256-token chunk's 1536 (token,
// slot) pairs grouped by expert, spread (every expert ~6 pairs, one tile) or skewed (all tokens
// on the same 6 experts, 32 tiles each). Per launch: the grouping and one grouped product; GB/s
// counts the selected experts' weights once.
template <class Weights, class Launch>
void bench_grouped(cudaStream_t s, int reps, double copy_gbs, ds4::GgmlType type, const char *name,
                   int64_t rows, int64_t k, bool x_per_pair, Launch &&launch) {
    constexpr int kExperts = 256, kUsed = 6, kTokens = 256, kPairs = kTokens * kUsed;
    const auto host = ds4::quant::random_blocks(type, int64_t(kExperts) * rows * k, 9);
    const Weights w(host.data(), rows, k, kExperts);
    const int64_t n_x = x_per_pair ? kPairs : kTokens;
    DeviceBuffer dx(size_t(n_x * k) * 4), xq(size_t(n_x * k)), xd(size_t(n_x * k / 256) * 4),
        xb(size_t(n_x * k / 16) * 2), y(size_t(kPairs * rows) * 4), dids(kPairs * 4),
        offsets((kExperts + 1) * 4), order(kPairs * 4);
    const auto x = ds4::quant::random_blocks(ds4::GgmlType::F32, n_x * k, 3);
    DS4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice));
    const ds4::cuda::Q8_KActivation act{xq.as<int8_t>(), xd.as<float>(), xb.as<int16_t>()};
    ds4::cuda::quantize_q8_K_activation(dx.as<float>(), n_x * k, act, s);
    for (const bool skewed : {false, true}) {
        std::vector<int32_t> ids(kPairs);
        for (int p = 0; p < kPairs; ++p)
            ids[size_t(p)] = skewed ? p % kUsed : int32_t((int64_t(p) * 37) % kExperts);
        DS4_CUDA_CHECK(cudaMemcpy(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice));
        const ds4::cuda::ExpertGroups g{offsets.as<int32_t>(), order.as<int32_t>(), kExperts,
                                        x_per_pair ? 1 : kUsed, kTokens};
        const int used = skewed ? kUsed : kExperts;
        const double bytes = double(used) * double(ds4::quant::row_size(type, k)) * double(rows);
        const std::string label = std::string(name) + (skewed ? " skewed" : " spread");
        measure_row(s, reps, copy_gbs, label.c_str(), rows, k, bytes, 1, [&] {
            ds4::cuda::group_by_expert(dids.as<int32_t>(), kPairs, kExperts, offsets.as<int32_t>(),
                                       order.as<int32_t>(), s);
            launch(w, g, act, y.as<float>());
        });
    }
}

// F16 matrices of one layer: the hyper-connection mixer (24 rows of 16384), the router, a
// ratio-4 compressor projection, the indexer's q_b. As for Q8_0, enough copies to pass the L2.
void bench_float(cudaStream_t s, int reps, double copy_gbs, size_t min_total) {
    struct FloatShape {
        const char *name;
        int64_t n_rows, k;
    };
    constexpr FloatShape kFloatShapes[] = {{"hc_attn_fn f16", 24, 16384},
                                           {"ffn_gate_inp f16", 256, 4096},
                                           {"compressor f16", 1024, 4096},
                                           {"indexer_q_b f16", 8192, 1024}};
    for (const FloatShape &sh : kFloatShapes) {
        const size_t bytes = size_t(sh.n_rows * sh.k) * 2;
        const int copies = int(std::max<size_t>(1, (min_total + bytes - 1) / bytes));
        const auto host = ds4::quant::random_blocks(ds4::GgmlType::F16, sh.n_rows * sh.k, 5);
        std::vector<DeviceBuffer> mats;
        for (int c = 0; c < copies; ++c) {
            mats.emplace_back(bytes);
            DS4_CUDA_CHECK(
                cudaMemcpy(mats.back().get(), host.data(), bytes, cudaMemcpyHostToDevice));
        }
        const auto x = ds4::quant::random_blocks(ds4::GgmlType::F32, sh.k, 3);
        const ds4::cuda::FloatMatrix probe{ds4::GgmlType::F16, nullptr, sh.n_rows, sh.k};
        DeviceBuffer dx(size_t(sh.k) * 4), y(size_t(sh.n_rows) * 4),
            scratch(std::max<size_t>(8, ds4::cuda::float_matvec_scratch_bytes(probe)));
        DS4_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));  // the arrival counters
        DS4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice));
        measure_row(s, reps, copy_gbs, sh.name, sh.n_rows, sh.k, double(bytes), copies, [&] {
            for (const auto &m : mats)
                ds4::cuda::matvec_float({ds4::GgmlType::F16, m.get(), sh.n_rows, sh.k},
                                        dx.as<float>(), y.as<float>(), scratch.get(), s);
        });
    }
}

// The prefill form of the dense Q8_0 projections: one product of a 2048-token chunk per shape
// (matmul_q8_0: int8 tensor cores from 32 tokens, and the 8-token-per-block kernel on 31 tokens
// for comparison), in TOPS (2 x rows x k x tokens per second) and microseconds per token.
void bench_q8_0_batch(cudaStream_t s, int reps) {
    fmt::print(
        "\nprefill: dense Q8_0 products of a chunk\n{:<16} {:>7} {:>6} {:>7} {:>10} {:>8} {:>9}\n",
        "matrix", "rows", "k", "tokens", "us/call", "TOPS", "us/token");
    for (const Shape &sh : kShapes) {
        if (std::strcmp(sh.name, "output") == 0) continue;  // the head sees one token per chunk
        const auto host = ds4::quant::random_blocks(ds4::GgmlType::Q8_0, sh.n_rows * sh.k, 7);
        const ds4::cuda::Q8_0Weights w(host.data(), sh.n_rows, sh.k);
        for (const int64_t m : {int64_t(2048), int64_t(31)}) {
            const auto x = ds4::quant::random_blocks(ds4::GgmlType::F32, m * sh.k, 3);
            DeviceBuffer dx(size_t(m * sh.k) * 4), xq(size_t(m * sh.k)),
                xd(size_t(m * sh.k / 32) * 4), y(size_t(m * sh.n_rows) * 4);
            DS4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice));
            ds4::cuda::quantize_q8_0_activation(dx.as<float>(), m * sh.k, xq.as<int8_t>(),
                                                xd.as<float>(), s);
            cudaGraphExec_t g = capture(s, [&] {
                ds4::cuda::matmul_q8_0(w.matrix(), xq.as<int8_t>(), xd.as<float>(), m,
                                       y.as<float>(), s);
            });
            const double us =
                median_ms(reps, s, [&] { DS4_CUDA_CHECK(cudaGraphLaunch(g, s)); }) * 1e3;
            const double tops =
                2.0 * double(sh.n_rows) * double(sh.k) * double(m) / (us * 1e-6) / 1e12;
            fmt::print("{:<16} {:>7} {:>6} {:>7} {:>10.1f} {:>8.1f} {:>9.3f}\n", sh.name, sh.n_rows,
                       sh.k, m, us, tops, us / double(m));
            DS4_CUDA_CHECK(cudaGraphExecDestroy(g));
        }
    }
}

// The small operations of a decode step, which move little and cost their latency: each row is a
// chain of 43 dependent launches (one per layer, as in a step) on L2-resident data, replayed as a
// graph; us per launch. Attention at the row counts of a 2K context's layers (the window of 128
// plus 64 or 16 compressed rows) and of an indexed layer at full selection (128 + 512).
void bench_small_ops(cudaStream_t s, int reps) {
    constexpr int kLayers = 43, kHeads = 64, kDim = 512, kStreams = 4;
    constexpr int64_t kEmbd = 4096;
    const auto rnd = [](int64_t n, uint64_t seed) {
        const auto v = ds4::quant::random_blocks(ds4::GgmlType::F32, n, seed);
        DeviceBuffer d(v.size());
        DS4_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size(), cudaMemcpyHostToDevice));
        return d;
    };
    fmt::print("\n{:<34} {:>10}\n", "small operation (43 chained launches)", "us/launch");
    auto row = [&](const std::string &name, auto &&one) {
        cudaGraphExec_t g = capture(s, [&] {
            for (int l = 0; l < kLayers; ++l) one();
        });
        const double ms = median_ms(reps, s, [&] { DS4_CUDA_CHECK(cudaGraphLaunch(g, s)); });
        fmt::print("{:<34} {:>10.2f}\n", name, ms * 1e3 / kLayers);
        DS4_CUDA_CHECK(cudaGraphExecDestroy(g));
    };
    const DeviceBuffer q = rnd(kHeads * kDim, 11), rows = rnd(640 * kDim, 12),
                       sinks = rnd(kHeads, 13), X = rnd(kStreams * kEmbd, 14),
                       w = rnd(kStreams * kEmbd, 15), mt = rnd(24, 16), sc = rnd(3, 17),
                       base = rnd(24, 18);
    DeviceBuffer scores(size_t(640) * kHeads * 4), o(size_t(kHeads) * kDim * 4),
        y(size_t(kStreams) * kEmbd * 4), mix(24 * 4), x(size_t(kEmbd) * 4);
    for (const int64_t n : {int64_t(144), int64_t(192), int64_t(640)}) {
        row(fmt::format("attention scores, {} rows", n), [&] {
            ds4::cuda::attention_scores(q.as<float>(), rows.as<float>(), n, kHeads, kDim,
                                        scores.as<float>(), s);
        });
        row(fmt::format("attention mix, {} rows", n), [&] {
            ds4::cuda::attention_mix(scores.as<float>(), rows.as<float>(), n, sinks.as<float>(),
                                     0.04f, kHeads, kDim, o.as<float>(), s);
        });
    }
    row("hc_mix_combine, 4 streams of 4096", [&] {
        float *m = mix.as<float>();
        ds4::cuda::hc_mix_combine(mt.as<float>(), sc.as<float>(), base.as<float>(), kStreams, 20,
                                  1e-6f, m, m + kStreams, m + 2 * kStreams, X.as<float>(), kEmbd,
                                  x.as<float>(), s);
    });
    row("rms_norm, 16384", [&] {
        ds4::cuda::rms_norm(X.as<float>(), nullptr, y.as<float>(), 1, kStreams * kEmbd, 1e-6f, s);
    });
    row("rms_norm, 4096", [&] {
        ds4::cuda::rms_norm(X.as<float>(), w.as<float>(), y.as<float>(), 1, kEmbd, 1e-6f, s);
    });
    // The device tier's repack of a missed expert's part (IQ2_XXS gate of the Flash layout:
    // 32768 blocks of 66 bytes, the 64 bytes after the scale into plane a).
    constexpr int64_t kPartBlocks = 32768;
    const DeviceBuffer part = rnd(kPartBlocks * 66 / 4, 19);
    DeviceBuffer plane_a(size_t(kPartBlocks) * 64), plane_b(size_t(kPartBlocks) * 2);
    row("split_blocks, 2.16 MB IQ2_XXS part", [&] {
        ds4::cuda::split_blocks_async(part.get(), kPartBlocks, 66, 2, 64, plane_a.get(),
                                      plane_b.get(), s);
    });
}

int run(int reps) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::fprintf(stderr, "bench_cuda_matvec: no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop{};
    DS4_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    fmt::print("device: {} ({} SMs, L2 {} MiB)\n", prop.name, prop.multiProcessorCount,
               prop.l2CacheSize >> 20);
    cudaStream_t s;
    DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    const size_t copy_bytes = size_t(2) << 30;
    DeviceBuffer src(copy_bytes), dst(copy_bytes);
    DS4_CUDA_CHECK(cudaMemset(src.get(), 1, copy_bytes));
    auto ce_graph = capture(s, [&] {
        DS4_CUDA_CHECK(
            cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
    });
    auto sm_graph =
        capture(s, [&] { ds4::cuda::device_copy(dst.get(), src.get(), copy_bytes, s); });
    const double ce_ms = median_ms(reps, s, [&] { DS4_CUDA_CHECK(cudaGraphLaunch(ce_graph, s)); });
    const double sm_ms = median_ms(reps, s, [&] { DS4_CUDA_CHECK(cudaGraphLaunch(sm_graph, s)); });
    const double ce_gbs = 2.0 * copy_bytes / (ce_ms * 1e-3) / 1e9;
    const double sm_gbs = 2.0 * copy_bytes / (sm_ms * 1e-3) / 1e9;
    const double copy_gbs = std::max(ce_gbs, sm_gbs);
    fmt::print(
        "device copy (read + write of {} GiB): copy engines {:.0f} GB/s, kernel {:.0f} GB/s\n\n",
        copy_bytes >> 30, ce_gbs, sm_gbs);
    fmt::print("{:<16} {:>7} {:>6} {:>9} {:>10} {:>9} {:>8}\n", "matrix", "rows", "k", "MB",
               "us/matvec", "GB/s", "of copy");

    const size_t min_total = size_t(prop.l2CacheSize) * 16;
    for (const Shape &sh : kShapes) {
        const size_t bytes = ds4::quant::row_size(ds4::GgmlType::Q8_0, sh.k) * size_t(sh.n_rows);
        const int copies = int(std::max<size_t>(1, (min_total + bytes - 1) / bytes));
        const auto host = ds4::quant::random_blocks(ds4::GgmlType::Q8_0, sh.n_rows * sh.k, 7);
        std::vector<ds4::cuda::Q8_0Weights> mats;
        mats.reserve(size_t(copies));
        for (int c = 0; c < copies; ++c) mats.emplace_back(host.data(), sh.n_rows, sh.k);
        const auto x = ds4::quant::random_blocks(ds4::GgmlType::F32, sh.k, 3);
        DeviceBuffer dx(size_t(sh.k) * 4), xq(size_t(sh.k)), xd(size_t(sh.k / 32) * 4),
            y(size_t(sh.n_rows) * 4);
        DS4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice));
        ds4::cuda::quantize_q8_0_activation(dx.as<float>(), sh.k, xq.as<int8_t>(), xd.as<float>(),
                                            s);
        measure_row(s, reps, copy_gbs, sh.name, sh.n_rows, sh.k, double(bytes), copies, [&] {
            for (const auto &m : mats)
                ds4::cuda::matvec_q8_0(m.matrix(), xq.as<int8_t>(), xd.as<float>(), y.as<float>(),
                                       s);
        });
    }
    bench_float(s, reps, copy_gbs, min_total);
    bench_routed<ds4::cuda::Iq2xxsWeights>(
        s, reps, copy_gbs, ds4::GgmlType::IQ2_XXS, "routed iq2_xxs x6", 2048, 4096,
        [&](const auto &w, const int32_t *ids, int n, const auto &act, float *y) {
            ds4::cuda::matvec_iq2_xxs(w.experts(), ids, n, act, y, s);
        });
    bench_routed<ds4::cuda::Q2KWeights>(
        s, reps, copy_gbs, ds4::GgmlType::Q2_K, "routed q2_k x6", 4096, 2048,
        [&](const auto &w, const int32_t *ids, int n, const auto &act, float *y) {
            ds4::cuda::matvec_q2_K(w.experts(), ids, n, act, y, s);
        });
    bench_routed<ds4::cuda::Q4KWeights>(
        s, reps, copy_gbs, ds4::GgmlType::Q4_K, "routed q4_k x6", 2048, 4096,
        [&](const auto &w, const int32_t *ids, int n, const auto &act, float *y) {
            ds4::cuda::matvec_q4_K(w.experts(), ids, n, act, y, s);
        });
    fmt::print("\nprefill: a 256-token chunk's routed pairs grouped by expert\n");
    bench_grouped<ds4::cuda::Iq2xxsWeights>(
        s, reps, copy_gbs, ds4::GgmlType::IQ2_XXS, "grouped iq2_xxs", 2048, 4096, false,
        [&](const auto &w, const auto &g, const auto &act, float *y) {
            ds4::cuda::matmul_iq2_xxs_grouped(w.experts(), g, act, y, s);
        });
    bench_grouped<ds4::cuda::Q2KWeights>(
        s, reps, copy_gbs, ds4::GgmlType::Q2_K, "grouped q2_k", 4096, 2048, true,
        [&](const auto &w, const auto &g, const auto &act, float *y) {
            ds4::cuda::matmul_q2_K_grouped(w.experts(), g, act, y, s);
        });
    bench_q8_0_batch(s, reps);
    bench_small_ops(s, reps);
    DS4_CUDA_CHECK(cudaGraphExecDestroy(ce_graph));
    DS4_CUDA_CHECK(cudaGraphExecDestroy(sm_graph));
    DS4_CUDA_CHECK(cudaStreamDestroy(s));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    int reps = 20;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = std::atoi(argv[++i]);
        } else if (std::strcmp(argv[i], "--help") == 0) {
            std::puts(
                "usage: bench_cuda_matvec [--reps N]\n"
                "Bandwidth of the CUDA decode matvecs per model shape next to a device copy,\n"
                "then the latency of a decode step's small operations.\n"
                "exit codes: 0 ok, 1 no device or CUDA error, 2 bad usage");
            return 0;
        } else {
            std::fprintf(stderr, "bench_cuda_matvec: unknown argument %s (--help)\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1) {
        std::fprintf(stderr, "bench_cuda_matvec: --reps must be at least 1\n");
        return 2;
    }
    try {
        return run(reps);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_cuda_matvec: %s\n", e.what());
        return 1;
    }
}
