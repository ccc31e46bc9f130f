#include "runtime/cuda/cuda_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "backend/cpu/rope.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/hyper_connections.h"
#include "backend/cuda/indexer_ops.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/per_device.h"
#include "backend/cuda/row_finish.h"
#include "backend/cuda/token_io.h"
#include "backend/cuda/vector_ops.h"
#include "common/error.h"
#include "experts/expert_rounds.h"
#include "runtime/kv_cache_io.h"

namespace ds4::runtime::cuda_backend {
namespace {

constexpr size_t kAlign = 64;      // floats: every buffer starts 256-byte aligned
constexpr uint64_t kLinearOp = 2;  // linear's id in the step hash (replaying)
constexpr uint64_t kLinearGroupsOp = 3;
constexpr uint64_t kHcPostOp = 6;
constexpr uint64_t kAttentionCoreOp = 8;
constexpr uint64_t kMoeRoutedOp = 9;  // moe_routed's
constexpr uint64_t kBranchOp = 13;    // begin_branch, end_branch, join_branch
constexpr uint64_t kWriteOp = 14;     // write (the token states handed to a later stage)

size_t align_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

template <typename T>
cuda::DeviceBuffer device_array(size_t n) {
    return cuda::DeviceBuffer(std::max<size_t>(n, 1) * sizeof(T));
}

// The batch buffers one token needs at most (runtime/forward.cpp, attention.cpp, moe.cpp),
// counted generously: every sublayer's scratch as if both were live at once.
size_t floats_per_token(const model::HParams &hp) {
    const size_t E = hp.n_embd, HD = size_t(hp.n_head) * hp.head_dim;
    const size_t comp_w = 2 * size_t(hp.head_dim) * 2, idx_w = 2 * size_t(hp.idx_head_dim) * 2;
    const size_t FS = size_t(hp.n_ff_exp) * hp.n_expert_shared;
    size_t n = size_t(hp.n_hc) * E + hp.n_hc_mix() + 3 * E;  // forward.cpp
    n += 2 * size_t(hp.q_lora_rank) + 2 * HD + hp.head_dim + comp_w + idx_w +
         size_t(hp.n_idx_head) * (hp.idx_head_dim + 1) +
         size_t(hp.n_out_group) * hp.o_lora_rank;                  // attention.cpp
    n += hp.n_expert + size_t(hp.n_expert_used) * E + 2 * FS + E;  // moe.cpp
    return n + 24 * kAlign;                                        // alignment of ~24 buffers
}

}  // namespace

// The attention state saved by save(): a device copy of every layer's buffers, freed on its
// device.
struct CudaState final : BackendState {
    explicit CudaState(int device) : device_(device) {}
    ~CudaState() override { on_device_.arm(device_); }
    cuda::DeviceRestore on_device_;  // before the buffers: put back after they are freed
    int device_;
    std::vector<CudaOps::LayerKv> layers;
    int64_t n_past = 0;
    size_t payload = 0;  // computed by save()
    size_t payload_bytes() const override { return payload; }
};

namespace {

cuda::DeviceBuffer clone(const cuda::DeviceBuffer &b, cudaStream_t s) {
    cuda::DeviceBuffer c(b.bytes());
    if (b.bytes())
        DS4_CUDA_CHECK(cudaMemcpyAsync(c.get(), b.get(), b.bytes(), cudaMemcpyDeviceToDevice, s));
    return c;
}

void copy_into(cuda::DeviceBuffer &dst, const cuda::DeviceBuffer &src, cudaStream_t s) {
    if (dst.bytes() != src.bytes()) throw Error("restore: a snapshot of another session shape");
    if (src.bytes())
        DS4_CUDA_CHECK(
            cudaMemcpyAsync(dst.get(), src.get(), src.bytes(), cudaMemcpyDeviceToDevice, s));
}

// score rows start at -inf (an unwritten row), values at 0, as CompressorState::init.
cuda::DeviceBuffer compressor_window(size_t n, float fill) {
    std::vector<float> host(n, fill);
    cuda::DeviceBuffer b(n * sizeof(float));
    DS4_CUDA_CHECK(cudaMemcpy(b.get(), host.data(), b.bytes(), cudaMemcpyHostToDevice));
    return b;
}

}  // namespace

CudaOps::CudaOps(const DeviceModel &model, uint32_t ctx, bool f16_rows, ForwardOptions opts,
                 uint32_t max_batch, LayerRange layers)
    : m_(model),
      hp_(model.hp()),
      ctx_(ctx),
      max_batch_(max_batch),
      f16_(f16_rows),
      opts_(opts),
      layers_(layers == LayerRange{} ? LayerRange{0, model.hp().n_layer} : layers),
      device_(model.device()) {
    // Streams, events and buffers are made on the weights' device; the caller's is put back at
    // the end, or, when the constructor throws, once the members made so far are freed.
    on_device_.arm(device_);
    if (!(layers_.begin >= model.layers().begin && layers_.end <= model.layers().end))
        throw Error(
            fmt::format("internal: a session of layers [{}, {}) over weights of layers [{}, {})",
                        layers_.begin, layers_.end, model.layers().begin, model.layers().end));
    // A batch's tokens are a grid dimension of its launches (at most 65535 blocks).
    if (max_batch == 0 || max_batch > 65535)
        throw Error(fmt::format(
            "CUDA backend: a prefill chunk of {} tokens; the CUDA backend takes 1 to 65535",
            max_batch));
    DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking));
    s_ = main_;
    DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&branch_, cudaStreamNonBlocking));
    DS4_CUDA_CHECK(cudaEventCreateWithFlags(&branch_start_, cudaEventDisableTiming));
    DS4_CUDA_CHECK(cudaEventCreateWithFlags(&branch_end_, cudaEventDisableTiming));
    DS4_CUDA_CHECK(cudaEventCreateWithFlags(&mix_ready_, cudaEventDisableTiming));
    DS4_CUDA_CHECK(cudaEventCreateWithFlags(&comb_ready_, cudaEventDisableTiming));
    const model::HParams &hp = hp_;
    const uint32_t D = hp.head_dim, I = hp.idx_head_dim;

    // Attention state, allocated up front (kv_bytes() is what is used), as KvCache does: of
    // this stage's layers only (the others' stay empty).
    kv_.resize(hp.n_layer);
    // A batch stores all its KV rows before any of its tokens attends: the ring holds the window
    // and the batch (the window a token sees is then never overwritten by a later token's row).
    ring_rows_ = int64_t(hp.sliding_window) + (max_batch > 1 ? int64_t(max_batch) : 0);
    size_t max_visible = hp.sliding_window;
    uint32_t max_comp = 0;
    for (uint32_t il = layers_.begin; il < layers_.end; ++il) {
        LayerKv &L = kv_[il];
        L.raw = device_array<float>(size_t(ring_rows_) * D);
        const uint32_t r = hp.compress_ratio[il];
        if (r == 0) continue;
        if (!ratio_row_.count(r)) ratio_row_.emplace(r, ratio_row_.size());
        const uint32_t coff = hp.compressor_coff(il), cap = ctx / r + 1;
        const bool indexed = hp.attention_kind(il) == model::AttentionKind::Overlapped;
        L.comp = device_array<float>(size_t(cap) * D);
        L.comp_kv = compressor_window(size_t(coff) * r * coff * D, 0.0f);
        L.comp_score = compressor_window(size_t(coff) * r * coff * D, -INFINITY);
        if (indexed) {
            L.idx = device_array<float>(size_t(cap) * I);
            L.idx_kv = compressor_window(size_t(coff) * r * coff * I, 0.0f);
            L.idx_score = compressor_window(size_t(coff) * r * coff * I, -INFINITY);
            max_comp = std::max(max_comp, cap);
        }
        max_visible = std::max<size_t>(
            max_visible, hp.sliding_window + (indexed ? std::min(cap, hp.idx_top_k) : cap));
    }

    capacity_ = size_t(max_batch) * floats_per_token(hp) + align_up(hp.n_vocab) +
                4 * align_up(hp.n_embd) + kAlign;
    arena_ = device_array<float>(capacity_);
    tokens_ = device_array<int32_t>(max_batch);
    positions_ = device_array<int64_t>(step_words() * max_batch);
    DS4_CUDA_CHECK(cudaMallocHost(&tokens_host_, max_batch * sizeof(int32_t)));
    DS4_CUDA_CHECK(cudaMallocHost(&positions_host_, positions_.bytes()));
    // A later stage of a split model is handed its token states (write()).
    if (layers_.begin > 0) {
        handed_floats_ = size_t(max_batch) * hp.n_hc * hp.n_embd;
        DS4_CUDA_CHECK(cudaMallocHost(&handed_host_, handed_floats_ * sizeof(float)));
    }
    if (const char *g = std::getenv("DS4_CUDA_GRAPHS"); g && std::string(g) == "0")
        use_graphs_ = false;
    if (profile_.on()) use_graphs_ = false;  // events time launched kernels, not a graph's
    // A streamed layer's experts are known to the host only once its router has run: a decode
    // step is captured in segments between the layers' routers (cuda_ops.h), with no fork open
    // where one ends.
    if (model.expert_tier()) {
        if (layers_.size() != hp.n_layer)
            throw Error("SSD streaming of the routed experts with a layer split is not supported");
        for (uint32_t i = 0; i <= hp.n_layer; ++i)
            segments_.push_back(std::make_unique<DecodeGraph>());
        use_branches_ = false;
        use_side_stream_ = false;
        const size_t K = hp_.n_expert_used, n_expert = hp_.n_expert;
        DS4_CUDA_CHECK(cudaMallocHost(&ids_host_, size_t(max_batch) * K * sizeof(int32_t)));
        // At most ceil(n_expert / K) rounds (the tier holds K experts or more), each with its
        // offsets; every pair in one of them.
        rounds_ints_ = (n_expert / K + 2) * (n_expert + 1) + size_t(max_batch) * K;
        DS4_CUDA_CHECK(cudaMallocHost(&rounds_host_, rounds_ints_ * sizeof(int32_t)));
        rounds_ = device_array<int32_t>(rounds_ints_);
    }
    if (const char *f = std::getenv("DS4_CUDA_SIDE_STREAM"); f && std::string(f) == "0")
        use_side_stream_ = false;
    // DS4_CUDA_SKIP: operations left out of every one-token step, for measuring what each adds
    // to a step's time (the outputs are then wrong; a warning says so).
    if (const char *f = std::getenv("DS4_CUDA_SKIP"); f && *f) {
        std::string list = f;
        for (size_t b = 0, e; b <= list.size(); b = e + 1) {
            e = std::min(list.find(',', b), list.size());
            if (e > b) skip_.insert(list.substr(b, e - b));
        }
        fmt::print(stderr,
                   "CUDA backend: DS4_CUDA_SKIP={}: these operations are left out of every "
                   "decode step; outputs are wrong (a timing diagnostic)\n",
                   f);
    }
    // The profile's events time one stream.
    if (const char *f = std::getenv("DS4_CUDA_BRANCHES");
        (f && std::string(f) == "0") || profile_.on())
        use_branches_ = false;
    // The profile times each product on its own.
    if (const char *f = std::getenv("DS4_CUDA_DEFER");
        (f && std::string(f) == "0") || profile_.on())
        defer_ = false;

    const backend::cpu::RopeFreqs plain =
        backend::cpu::RopeFreqs::plain(hp.n_rot, hp.rope_freq_base);
    const backend::cpu::RopeFreqs yarn = backend::cpu::RopeFreqs::yarn(
        hp.n_rot, hp.compress_rope_freq_base, hp.rope_scaling_factor, double(hp.rope_orig_ctx),
        hp.yarn_beta_fast, hp.yarn_beta_slow);
    freqs_plain_ = device_array<double>(plain.f.size());
    freqs_yarn_ = device_array<double>(yarn.f.size());
    DS4_CUDA_CHECK(cudaMemcpy(freqs_plain_.get(), plain.f.data(), plain.f.size() * sizeof(double),
                              cudaMemcpyHostToDevice));
    DS4_CUDA_CHECK(cudaMemcpy(freqs_yarn_.get(), yarn.f.data(), yarn.f.size() * sizeof(double),
                              cudaMemcpyHostToDevice));
    zero_id_ = device_array<int32_t>(1);
    DS4_CUDA_CHECK(cudaMemset(zero_id_.get(), 0, sizeof(int32_t)));
    std::vector<int32_t> groups(std::max<uint32_t>(hp.n_out_group, 1));
    for (size_t g = 0; g < groups.size(); ++g) groups[g] = int32_t(g);
    group_ids_ = device_array<int32_t>(groups.size());
    DS4_CUDA_CHECK(cudaMemcpy(group_ids_.get(), groups.data(), groups.size() * sizeof(int32_t),
                              cudaMemcpyHostToDevice));

    // One token's scratch. Activations: the longest row, every selected expert's down input,
    // or the grouped output's whole input (linear_groups quantizes its groups' slices at once).
    const size_t K = hp.n_expert_used, F = hp.n_ff_exp;
    const size_t act = std::max({size_t(m_.max_k()), K * F, size_t(hp.n_head) * hp.head_dim});
    // The main line's and a branch's (begin_branch): each its own, so that the two never share
    // a buffer while they run side by side.
    for (TokenScratch &t : scratch_) {
        t.xq = device_array<int8_t>(act);
        t.xd = device_array<float>(act / 32 + 1);
        t.q8k_q = device_array<int8_t>(act);
        t.q8k_d = device_array<float>(act / 256 + 1);
        t.q8k_bsums = device_array<int16_t>(act / 16 + 1);
        t.floats = cuda::DeviceBuffer(std::max<size_t>(m_.float_scratch_bytes(), 16));
        // A group of products needs its fixed counter regions and at most each one's partial
        // sums (float_matvec_many_scratch_bytes).
        t.floats_many = cuda::DeviceBuffer(cuda::kMaxFloatProducts *
                                           (cuda::kFloatMatvecCounterBytes + t.floats.bytes()));
        // The split products' arrival counters start at zero (float_matvec.h).
        DS4_CUDA_CHECK(cudaMemset(t.floats.get(), 0, t.floats.bytes()));
        DS4_CUDA_CHECK(cudaMemset(t.floats_many.get(), 0, t.floats_many.bytes()));
    }
    // A batch's Q8_0 activations (batched products: linear with several tokens, the grouped
    // output projection's whole rows of n_head * head_dim values included).
    xq_batch_ = device_array<int8_t>(size_t(max_batch) * act);
    xd_batch_ = device_array<float>(size_t(max_batch) * act / 32 + 1);
    pending_.reserve(cuda::kMaxFloatProducts);
    flat_ = device_array<float>(size_t(hp.n_hc) * hp.n_embd);
    mixes_ = device_array<float>(hp.n_hc_mix());
    head_w_ = device_array<float>(hp.n_hc);
    // Attention of a batch: up to attend_batch_ tokens' visible rows, scores and indexer scores
    // at once, 512 or as many as 1 GiB holds (the Flash layout at a 2K context: 640 rows of 512
    // values and 64 heads' scores, 1.5 MB a token; a layer of ratio 128 at 1M sees 8,321 rows,
    // ~20 MB a token). A batch of 64 gave the attention's kernels 128 blocks, fewer than the
    // H200's 132 multiprocessors (ncu: one block each, 12% occupancy).
    const size_t row_bytes =
        (max_visible * D + max_visible * size_t(hp.n_head) + size_t(max_comp)) * sizeof(float);
    attend_batch_ = std::clamp<int64_t>(int64_t((size_t(1) << 30) / row_bytes), 1,
                                        std::min<int64_t>(max_batch, 512));
    rows_ = device_array<float>(size_t(attend_batch_) * max_visible * D);
    scores_ = device_array<float>(size_t(attend_batch_) * max_visible * hp.n_head);
    idx_scores_ = device_array<float>(size_t(attend_batch_) * max_comp);
    selected_ = device_array<int32_t>(size_t(max_batch) * hp.idx_top_k);
    topk_scratch_ = cuda::DeviceBuffer(std::max<size_t>(cuda::top_k_scratch_bytes(max_comp), 16));
    expert_ids_ = device_array<int32_t>(size_t(max_batch) * K);
    expert_w_ = device_array<float>(size_t(max_batch) * K);
    gate_ = device_array<float>(size_t(max_batch) * K * F);
    up_ = device_array<float>(size_t(max_batch) * K * F);
    if (m_.expert_tier()) {  // hits first (acquire_hits_first)
        early_ids_ = device_array<int32_t>(K);
        late_ids_ = device_array<int32_t>(K);
        gate_early_ = device_array<float>(K * F);
        up_early_ = device_array<float>(K * F);
        if (const char *f = std::getenv("DS4_CUDA_HITS_FIRST"); f && std::string(f) == "0")
            hits_first_ = false;
    }
    if (max_batch > 1) {  // prefill's scratch
        flat_batch_ = device_array<float>(size_t(max_batch) * hp.n_hc * hp.n_embd);
        mixes_batch_ = device_array<float>(size_t(max_batch) * hp.n_hc_mix());
        const auto [counters, partial] = m_.float_matmul_scratch_bytes(max_batch);
        float_batch_counters_ = cuda::DeviceBuffer(std::max<size_t>(counters, 16));
        float_batch_partial_ = cuda::DeviceBuffer(std::max<size_t>(partial, 16));
        DS4_CUDA_CHECK(cudaMemset(float_batch_counters_.get(), 0, float_batch_counters_.bytes()));
        float_batch_scratch_ = {float_batch_counters_.get(), counters, float_batch_partial_.get(),
                                partial};
        const size_t n = size_t(max_batch) * std::max<size_t>(hp.n_embd, K * F);
        q8k_batch_q_ = device_array<int8_t>(n);
        q8k_batch_d_ = device_array<float>(n / 256 + 1);
        q8k_batch_bsums_ = device_array<int16_t>(n / 16 + 1);
        expert_offsets_ = device_array<int32_t>(size_t(hp.n_expert) + 1);
        // a batch's pooled compressor rows: at most one a token
        pooled_ = device_array<float>(size_t(max_batch) * std::max(hp.head_dim, hp.idx_head_dim));
        expert_order_ = device_array<int32_t>(size_t(max_batch) * K);
    }
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    on_device_.disarm();  // constructed: the caller's device again
}

CudaOps::~CudaOps() {
    // Everything is freed on the session's device (the members after this body too), then the
    // caller's device is put back.
    on_device_.arm(device_);
    abort_step();
    profile_.report();
    // DS4_CUDA_GRAPH_NODES: how many kernels and copies one decode step is (the profile times
    // operations, this counts the launches they cost).
    if (std::getenv("DS4_CUDA_GRAPH_NODES") && graph_.nodes())
        fmt::print(stderr, "CUDA decode graph: {} nodes per step, {} edges ({} programmatic)\n",
                   graph_.nodes(), graph_.edges(), graph_.programmatic_edges());
    if (std::getenv("DS4_CUDA_GRAPH_NODES") && !segments_.empty() && segments_[0]->nodes()) {
        size_t nodes = 0, edges = 0;
        for (const auto &g : segments_) {
            nodes += g->nodes();
            edges += g->edges();
        }
        fmt::print(stderr,
                   "CUDA decode graph: {} segments, {} nodes per step, {} edges; the first "
                   "segment replayed {} times\n",
                   segments_.size(), nodes, edges, segments_[0]->replays());
    }
    if (tokens_host_) cudaFreeHost(tokens_host_);
    if (handed_host_) cudaFreeHost(handed_host_);
    if (ids_host_) cudaFreeHost(ids_host_);
    if (rounds_host_) cudaFreeHost(rounds_host_);
    if (positions_host_) cudaFreeHost(positions_host_);
    if (mix_ready_) cudaEventDestroy(mix_ready_);
    if (comb_ready_) cudaEventDestroy(comb_ready_);
    if (side_) cudaStreamDestroy(side_);
    if (branch_start_) cudaEventDestroy(branch_start_);
    if (branch_end_) cudaEventDestroy(branch_end_);
    if (branch_) cudaStreamDestroy(branch_);
    if (main_) cudaStreamDestroy(main_);
}

void CudaOps::join_side_stream() {
    if (!comb_pending_) return;
    comb_pending_ = false;
    DS4_CUDA_CHECK(cudaStreamWaitEvent(s_, comb_ready_, 0));
}

void CudaOps::abort_step() noexcept {
    // Called by the model order for every stage of a failed step, each on its own device.
    (void)cudaSetDevice(device_);
    // A capture's forked work must be joined before the capture can end: all of the branch's
    // (an exception may come in a branch, or while the attention core adds its compressors).
    if (in_branch_ || branch_open_) {
        (void)cudaEventRecord(branch_end_, branch_);
        (void)cudaStreamWaitEvent(main_, branch_end_, 0);
    }
    use_stream(false);
    in_branch_ = branch_open_ = join_pending_ = false;
    // What a thrown step deferred or tracked is not the next step's.
    pending_.clear();
    pending_x_ = nullptr;
    pending_sum_ = {};
    for (TokenScratch &t : scratch_) t.quantized = {};
    if (comb_pending_) {
        comb_pending_ = false;
        (void)cudaStreamWaitEvent(s_, comb_ready_, 0);
    }
    graph().abort(s_);
    drop_pending_pass();
}

bool CudaOps::graphs_ready() const {
    if (segments_.empty()) return graph_.ready();
    return std::all_of(segments_.begin(), segments_.end(), [](auto &g) { return g->ready(); });
}

void CudaOps::release_pending_pass() {
    if (!pass_pending_) return;
    pass_pending_ = false;
    m_.expert_tier()->release(s_);
}

// Drops a pass whose kernels were never launched (their segment failed): no kernel reads its
// slots, so they may go at once; never throws (it runs while an error propagates).
void CudaOps::drop_pending_pass() noexcept {
    if (!pass_pending_) return;
    pass_pending_ = false;
    try {
        m_.expert_tier()->release(s_);
    } catch (...) {  // a failing CUDA call; the pass's pins are gone already
    }
}

void CudaOps::end_segment() {
    DecodeGraph &g = graph();
    try {
        if (g.capturing())
            g.end_capture_and_launch(s_, step_hash_);
        else if (replay_)
            g.launch(s_, step_hash_);
        else
            throw Error("internal: a decode segment ends without a capture or a replay");
    } catch (...) {
        // The last pass's kernels are in the segment that did not run: another session on the
        // model must not find the pass open.
        g.abort(s_);
        drop_pending_pass();
        throw;
    }
    release_pending_pass();  // its kernels are in the segment just launched
    if (segment_ + 1 >= segments_.size())
        throw Error("internal: a decode step has more segments than layers");
    ++segment_;
    step_hash_ = 0xcbf29ce484222325ull;
}

void CudaOps::begin_segment() {
    if (!replay_) graph().begin_capture(s_);
}

bool CudaOps::skipped(const std::string &name) const {
    return batch_ == 1 && !skip_.empty() && skip_.count(name.substr(0, name.find(' '))) != 0;
}

void CudaOps::use_stream(bool branch) {
    s_ = branch ? branch_ : main_;
    sc_ = &scratch_[branch ? 1 : 0];
}

void CudaOps::leave_branch_stream() {
    DS4_CUDA_CHECK(cudaEventRecord(branch_end_, branch_));
    use_stream(false);
}

bool CudaOps::branches() const {
    return use_branches_ && batch_ == 1;
}

void CudaOps::hash_op(uint64_t op, std::initializer_list<uint64_t> args) {
    // FNV-1a over the operation and its arguments (layer ids, sizes, buffer addresses).
    auto mix = [&](uint64_t v) {
        for (int i = 0; i < 8; ++i)
            step_hash_ = (step_hash_ ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    };
    mix(op);
    for (uint64_t a : args) mix(a);
}

void CudaOps::begin_branch() {
    if (!branches()) return;
    hash_op(kBranchOp, {0});
    if (replay_) return;
    settle_branch();  // a joined branch that no operation has waited for yet
    if (in_branch_ || branch_open_) throw Error("CUDA backend: a branch inside a branch");
    // The pending work is the main line's (the branch reads what it writes).
    flush_float_products();
    flush_moe_sum();
    DS4_CUDA_CHECK(cudaEventRecord(branch_start_, main_));
    DS4_CUDA_CHECK(cudaStreamWaitEvent(branch_, branch_start_, 0));
    use_stream(true);
    sc_->quantized = {};  // what it held is from an earlier step or sublayer
    in_branch_ = branch_open_ = true;
}

void CudaOps::end_branch() {
    if (!branches()) return;
    hash_op(kBranchOp, {1});
    if (replay_) return;
    if (!in_branch_) throw Error("CUDA backend: end_branch without begin_branch");
    flush_float_products();
    flush_moe_sum();
    leave_branch_stream();
    in_branch_ = false;
}

void CudaOps::join_branch() {
    if (!branches()) return;
    hash_op(kBranchOp, {2});
    if (replay_) return;
    if (in_branch_ || !branch_open_) throw Error("CUDA backend: join_branch without a branch");
    join_pending_ = true;  // settled by the next operation (attention_core: after its compressors)
}

void CudaOps::settle_branch() {
    if (!join_pending_) return;
    join_pending_ = branch_open_ = false;
    DS4_CUDA_CHECK(cudaStreamWaitEvent(main_, branch_end_, 0));
}

void CudaOps::activate() {
    DS4_CUDA_CHECK(cudaSetDevice(device_));
}

void CudaOps::begin_batch(std::span<const int32_t> tokens) {
    // The batch's operations run on this session's device (the model order runs one stage's
    // batch, begin_batch to read, before the next stage's).
    activate();
    abort_step();  // a capture an exception left open (and what the last step tracked)
    if (tokens.size() > max_batch_)
        throw Error(fmt::format("CUDA backend: a batch of {} tokens exceeds the session's {}",
                                tokens.size(), max_batch_));
    batch_ = static_cast<int64_t>(tokens.size());
    top_ = 0;
    profile_.count_tokens(batch_);
    // The staging is free: the previous batch ended in read(), which waits for the stream.
    std::copy(tokens.begin(), tokens.end(), tokens_host_);
    const int64_t W = hp_.sliding_window, top_k = hp_.idx_top_k;
    for (int64_t t = 0; t < batch_; ++t) {
        const int64_t p = n_past_ + t, first = std::max<int64_t>(0, p - W + 1),
                      n_raw = p - first + 1;
        int64_t *w = positions_host_ + t * step_words();
        w[kPos] = p;
        w[kRingSlot] = p % ring_rows_;
        const int64_t plain[4] = {first, n_raw, 0, 0};
        std::copy(plain, plain + 4, w + kPlainGather);
        w[kPlainRows] = n_raw;
        for (const auto &[r, row] : ratio_row_) {
            int64_t *rw = w + kRatioBase + row * kRatioWords;
            const int64_t count = (p + 1) / r, n_sel = std::min(count, top_k);
            rw[kCompPos] = p + 1 - r;
            rw[kPhase] = p % r;
            rw[kStoreIndex] = (p + 1) % r == 0 ? count - 1 : -1;
            rw[kCount] = count;
            const int64_t all[4] = {first, n_raw, count, 0};
            const int64_t indexed[4] = {first, n_raw, n_sel, count > top_k ? 1 : 0};
            std::copy(all, all + 4, rw + kGatherAll);
            std::copy(indexed, indexed + 4, rw + kGatherIndexed);
            rw[kRowsAll] = n_raw + count;
            rw[kRowsIndexed] = n_raw + n_sel;
        }
    }
    step_hash_ = 0xcbf29ce484222325ull;
    segment_ = 0;
    replay_ = batch_ == 1 && use_graphs_ && graphs_ready();
    if (replay_) return;  // the captured copies below run with the graph
    if (batch_ == 1 && use_graphs_) graph().begin_capture(s_);
    DS4_CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens_host_, tokens.size() * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s_));
    DS4_CUDA_CHECK(cudaMemcpyAsync(positions_.get(), positions_host_,
                                   size_t(batch_) * step_words() * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, s_));
}

bool CudaOps::replaying(uint64_t op, std::initializer_list<uint64_t> args) {
    hash_op(op, args);
    // A joined branch is waited for here, but by the attention core, which first adds its
    // compressors to the branch.
    if (op != kAttentionCoreOp) settle_branch();
    // Every other operation may read a pending product's output (linear checks its own input),
    // or the pending MoE sum's (hc_post checks it).
    if (op != kLinearOp) flush_float_products();
    if (op != kHcPostOp) flush_moe_sum();
    // linear_groups and moe_routed write only their outputs (checked there) and keep the
    // quantization of their input (attend leaves O quantized for linear_groups; the shared
    // expert's gate and up quantize the XN of moe_routed).
    if (op != kLinearOp && op != kLinearGroupsOp && op != kMoeRoutedOp) sc_->quantized = {};
    return replay_;
}

float *CudaOps::buffer(size_t n) {
    const size_t need = align_up(n);
    if (top_ + need > capacity_)
        throw Error(fmt::format("CUDA backend: batch scratch exhausted ({} of {} floats)",
                                top_ + need, capacity_));
    float *p = arena_.as<float>() + top_;
    top_ += need;
    return p;
}

void CudaOps::end_batch() {
    flush_float_products();
    flush_moe_sum();
    settle_branch();
    n_past_ += batch_;
    // The batch's layers are done with their experts: one step of the tiers' decay.
    if (DeviceExpertTier *tier = m_.expert_tier()) tier->step_done();
}

ProfileScope CudaOps::weight_scope(const char *op, model::Tensor w, double m) {
    if (!profile_.on()) return ProfileScope(profile_, s_, op);
    return ProfileScope(profile_, s_, op, double(w->n_bytes) * m, weight_role(w));
}

const double *CudaOps::freqs(uint32_t il) const {
    return hp_.compress_ratio[il] == 0 ? freqs_plain_.as<double>() : freqs_yarn_.as<double>();
}

const int64_t *CudaOps::word(int64_t t, size_t offset) const {
    return positions_.as<int64_t>() + size_t(t) * step_words() + offset;
}

const int64_t *CudaOps::ratio_word(int64_t t, uint32_t ratio, size_t offset) const {
    return word(t, kRatioBase + ratio_row_.at(ratio) * kRatioWords + offset);
}

cuda::Q8_KActivation CudaOps::q8k_scratch() const {
    return {sc_->q8k_q.as<int8_t>(), sc_->q8k_d.as<float>(), sc_->q8k_bsums.as<int16_t>()};
}

cuda::Q8_KActivation CudaOps::quantize_q8_k(const float *x, int64_t n) {
    if (size_t(n) > sc_->q8k_q.bytes())
        throw Error(fmt::format("CUDA backend: {} activations exceed the scratch of {}", n,
                                sc_->q8k_q.bytes()));
    const cuda::Q8_KActivation a = q8k_scratch();
    cuda::quantize_q8_K_activation(x, n, a, s_);
    return a;
}

cuda::Q8_KActivation CudaOps::quantize_q8_k_batch(const float *x, int64_t n) {
    if (size_t(n) > q8k_batch_q_.bytes())
        throw Error(fmt::format("CUDA backend: {} activations exceed the batch scratch of {}", n,
                                q8k_batch_q_.bytes()));
    const cuda::Q8_KActivation a{q8k_batch_q_.as<int8_t>(), q8k_batch_d_.as<float>(),
                                 q8k_batch_bsums_.as<int16_t>()};
    cuda::quantize_q8_K_activation(x, n, a, s_);
    return a;
}

void CudaOps::quantize_q8_0(const float *x, int64_t n) {
    if (sc_->quantized.x == x && sc_->quantized.n == n) return;
    if (size_t(n) > sc_->xq.bytes())
        throw Error(fmt::format("CUDA backend: {} activations exceed the scratch of {}", n,
                                sc_->xq.bytes()));
    cuda::quantize_q8_0_activation(x, n, sc_->xq.as<int8_t>(), sc_->xd.as<float>(), s_);
    sc_->quantized = {x, n};
}

void CudaOps::quantize_q8_0_batch(const float *X, int64_t m, int64_t width) {
    const size_t n = size_t(m) * size_t(width);
    if (n > xq_batch_.bytes())
        throw Error(fmt::format(
            "CUDA backend: a batch of {} x {} activations exceeds the batch scratch of {}", m,
            width, xq_batch_.bytes()));
    cuda::quantize_q8_0_activation(X, int64_t(n), xq_batch_.as<int8_t>(), xd_batch_.as<float>(),
                                   s_);
}

void CudaOps::experts_matvec(const DeviceMatrix &w, const int32_t *ids, int n_ids, const float *x,
                             bool x_per_slot, float *y, bool x_quantized) {
    const int64_t n = x_per_slot ? int64_t(n_ids) * w.k : w.k;
    if (w.q8_k_activations()) {
        const cuda::Q8_KActivation a = x_quantized ? q8k_scratch() : quantize_q8_k(x, n);
        if (w.iq2_xxs)
            cuda::matvec_iq2_xxs(w.iq2_xxs->experts(), ids, n_ids, a, y, s_, x_per_slot);
        else if (w.q2_k)
            cuda::matvec_q2_K(w.q2_k->experts(), ids, n_ids, a, y, s_, x_per_slot);
        else
            cuda::matvec_q4_K(w.q4_k->experts(), ids, n_ids, a, y, s_, x_per_slot);
    } else if (w.q8_0) {
        if (!x_quantized) quantize_q8_0(x, n);
        cuda::matvec_q8_0_experts(w.q8_0->matrix(), w.n_experts, ids, n_ids, sc_->xq.as<int8_t>(),
                                  sc_->xd.as<float>(), x_per_slot, y, s_);
    } else {
        cuda::matvec_float_experts(w.float_matrix(), ids, n_ids, x, x_per_slot, y,
                                   sc_->floats.get(), s_);
    }
}

void CudaOps::matvec(const DeviceMatrix &w, const float *x, float *y) {
    if (w.q8_0) {
        quantize_q8_0(x, w.k);
        cuda::matvec_q8_0(w.q8_0->matrix(), sc_->xq.as<int8_t>(), sc_->xd.as<float>(), y, s_);
    } else if (w.q8_k_activations()) {
        experts_matvec(w, zero_id_.as<int32_t>(), 1, x, false, y);
    } else {
        cuda::matvec_float(w.float_matrix(), x, y, sc_->floats.get(), s_);
    }
}

void CudaOps::embed(float *X) {
    if (replaying(1, {reinterpret_cast<uintptr_t>(X)})) return;
    const size_t width = size_t(hp_.n_hc) * hp_.n_embd;
    const ProfileScope scope(profile_, s_, "embed");
    for (int64_t t = 0; t < batch_; ++t)
        cuda::embed_token(m_.embedding(), m_.embedding_type(), hp_.n_vocab, hp_.n_embd,
                          tokens_.as<int32_t>() + t, int(hp_.n_hc), X + size_t(t) * width, s_);
}

void CudaOps::linear(model::Tensor w, const float *X, float *Y, int64_t m) {
    if (replaying(kLinearOp, {reinterpret_cast<uintptr_t>(w), reinterpret_cast<uintptr_t>(X),
                              reinterpret_cast<uintptr_t>(Y), uint64_t(m)}))
        return;
    if (!skip_.empty() && skipped(weight_role(w))) return;
    const DeviceMatrix &d = m_.matrix(w);
    if (d.raw.get() && m == 1 && defer_) {
        defer_float_product(d, X, Y);
        return;
    }
    flush_float_products();
    const ProfileScope scope = weight_scope("linear", w, double(m));
    if (d.q8_0 && m > 1) {
        // A batch: every token's row quantized at once (rows of k values: their blocks are the
        // rows' blocks), then one pass over the weights per 8 tokens, each token's outputs the
        // bits of its own matvec.
        quantize_q8_0_batch(X, m, d.k);
        cuda::matmul_q8_0(d.q8_0->matrix(), xq_batch_.as<int8_t>(), xd_batch_.as<float>(), m, Y,
                          s_);
        return;
    }
    if (d.raw.get() && m > 1) {  // a batch of float products: one launch, each row matvec's bits
        cuda::matmul_float(d.float_matrix(), X, m, Y, float_batch_scratch_, s_);
        return;
    }
    for (int64_t t = 0; t < m; ++t) matvec(d, X + t * d.k, Y + t * d.n_rows);
    // The output may overwrite the input whose quantization the scratch holds.
    forget_quantization_if_written(Y, size_t(m * d.n_rows));
}

void CudaOps::defer_float_product(const DeviceMatrix &d, const float *x, float *y) {
    // Joins the pending products where it has their input, format and row length, and writes
    // nothing they read or write (so that running it with them, later, is running it now).
    const auto overlaps = [](const float *a, int64_t na, const float *b, int64_t nb) {
        return a < b + nb && b < a + na;
    };
    bool joins = pending_x_ == x && pending_.size() < size_t(cuda::kMaxFloatProducts) &&
                 !overlaps(y, d.n_rows, x, d.k);
    for (const cuda::FloatProduct &p : pending_)
        joins =
            joins && p.w.type == d.type && p.w.k == d.k && !overlaps(y, d.n_rows, p.y, p.w.n_rows);
    if (!joins) flush_float_products();
    pending_x_ = x;
    pending_.push_back({d.float_matrix(), y});
    const float *q = sc_->quantized.x;
    if (q && overlaps(y, d.n_rows, q, sc_->quantized.n)) sc_->quantized = {};
}

void CudaOps::flush_float_products() {
    if (pending_.empty()) return;
    if (pending_.size() == 1)
        cuda::matvec_float(pending_[0].w, pending_x_, pending_[0].y, sc_->floats.get(), s_);
    else
        cuda::matvec_float_many(pending_.data(), int(pending_.size()), pending_x_,
                                sc_->floats_many.get(), sc_->floats_many.bytes(), s_);
    pending_.clear();
    pending_x_ = nullptr;
}

void CudaOps::forget_quantization_if_written(const float *y, size_t n) {
    const float *q = sc_->quantized.x;
    if (q && y < q + sc_->quantized.n && q < y + n) sc_->quantized = {};
}

void CudaOps::linear_groups(model::Tensor w, uint32_t groups, const float *X, float *Y, int64_t m) {
    if (replaying(kLinearGroupsOp,
                  {reinterpret_cast<uintptr_t>(w), groups, reinterpret_cast<uintptr_t>(X),
                   reinterpret_cast<uintptr_t>(Y), uint64_t(m)}))
        return;
    if (skipped("linear_groups")) return;
    const DeviceMatrix &d = m_.matrix(w);
    const int64_t R = d.n_rows / groups, K = d.k;
    forget_quantization_if_written(Y, size_t(m * d.n_rows));
    const ProfileScope scope = weight_scope("linear", w, double(m));
    if (d.q8_0 && m > 1) {  // a batch: as linear's, with the groups' slices
        quantize_q8_0_batch(X, m, int64_t(groups) * K);
        const cuda::Q8_0Matrix &full = d.q8_0->matrix();
        cuda::matmul_q8_0_groups(cuda::Q8_0Matrix{full.qs, full.d, R, K}, int(groups),
                                 xq_batch_.as<int8_t>(), xd_batch_.as<float>(), m, Y, s_);
        return;
    }
    for (int64_t t = 0; t < m; ++t) {
        const float *x = X + t * groups * K;
        float *y = Y + t * groups * R;
        if (d.q8_0) {
            // Q8_0 blocks of the whole row are the blocks of its slices (K is a multiple of 32).
            // The groups are the "experts" 0..groups-1 of an [groups][R][K] tensor, each with its
            // own slice of x: one launch, each output the dense product's bits.
            if (groups > group_ids_.bytes() / sizeof(int32_t))
                throw Error(fmt::format("CUDA backend: {} output groups, the model has {}", groups,
                                        hp_.n_out_group));
            quantize_q8_0(x, groups * K);
            const cuda::Q8_0Matrix &full = d.q8_0->matrix();
            const cuda::Q8_0Matrix block{full.qs, full.d, R, K};
            cuda::matvec_q8_0_experts(block, groups, group_ids_.as<int32_t>(), int(groups),
                                      sc_->xq.as<int8_t>(), sc_->xd.as<float>(), true, y, s_);
        } else if (d.raw.get()) {
            const size_t elem = d.type == GgmlType::F32 ? 4 : 2;
            for (uint32_t g = 0; g < groups; ++g) {
                const cuda::FloatMatrix block{
                    d.type, static_cast<const uint8_t *>(d.raw.get()) + g * R * K * elem, R, K};
                cuda::matvec_float(block, x + g * K, y + g * R, sc_->floats.get(), s_);
            }
        } else {
            throw Error(fmt::format("CUDA backend: no grouped product for {} weights ({})",
                                    ggml_type_name(d.type), w->name));
        }
    }
}

void CudaOps::rms_norm(const float *x, model::Tensor w, float *y, int64_t m, int64_t n) {
    if (replaying(4, {reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(w),
                      reinterpret_cast<uintptr_t>(y), uint64_t(m), uint64_t(n)}))
        return;
    if (skipped("rms_norm")) return;
    const ProfileScope scope(profile_, s_, "rms_norm");
    // One token's norm quantizes its output too: the next operations are its Q8_0 products.
    if (m == 1 && size_t(n) <= sc_->xq.bytes() &&
        cuda::rms_norm_q8_0(x, m_.vec(w), y, 1, n, hp_.rms_eps, sc_->xq.as<int8_t>(),
                            sc_->xd.as<float>(), s_)) {
        sc_->quantized = {y, n};
        return;
    }
    cuda::rms_norm(x, m_.vec(w), y, m, n, hp_.rms_eps, s_);
}

void CudaOps::hc_pre(const HcWeights &hc, const float *X, int64_t m, float *mix, float *x_in) {
    if (replaying(5,
                  {reinterpret_cast<uintptr_t>(hc.fn), reinterpret_cast<uintptr_t>(X), uint64_t(m),
                   reinterpret_cast<uintptr_t>(mix), reinterpret_cast<uintptr_t>(x_in)}))
        return;
    if (skipped("hc_pre")) return;
    const int n = int(hp_.n_hc);
    const int64_t E = hp_.n_embd, width = int64_t(n) * E, n_mix = hp_.n_hc_mix();
    const DeviceMatrix &fn = m_.matrix(hc.fn);
    if (m > 1 && fn.raw.get()) {  // a batch: each launch over every token, each token's bits
        {
            const ProfileScope scope = weight_scope("hc_pre norm+mixer", hc.fn, double(m));
            cuda::rms_norm(X, nullptr, flat_batch_.as<float>(), m, width, hp_.rms_eps, s_);
            cuda::matmul_float(fn.float_matrix(), flat_batch_.as<float>(), m,
                               mixes_batch_.as<float>(), float_batch_scratch_, s_);
        }
        const ProfileScope scope(profile_, s_, "hc_pre sinkhorn+combine");
        cuda::hc_mix_combine(mixes_batch_.as<float>(), m_.vec(hc.scale), m_.vec(hc.base), n,
                             int(hp_.sinkhorn_iters), hp_.hc_eps, mix, mix + n, mix + 2 * n, X, E,
                             x_in, s_, int(m));
        return;
    }
    for (int64_t t = 0; t < m; ++t) {
        float *mt = mix + t * n_mix;
        {
            const ProfileScope scope = weight_scope("hc_pre norm+mixer", hc.fn, 1);
            cuda::rms_norm(X + t * width, nullptr, flat_.as<float>(), 1, width, hp_.rms_eps, s_);
            matvec(fn, flat_.as<float>(), mixes_.as<float>());
        }
        const ProfileScope scope(profile_, s_, "hc_pre sinkhorn+combine");
        const float *scale = m_.vec(hc.scale), *base = m_.vec(hc.base);
        const int iters = int(hp_.sinkhorn_iters);
        if (m == 1 && use_side_stream_ && cuda::hc_mix_parts_split(n)) {
            // One token: the Sinkhorn passes (comb, first read by hc_post) on the side stream,
            // beside the sublayer; pre, post and x_in here. mixes_ is next written by the next
            // hc_pre or hc_head, after hc_post has joined the side stream.
            join_side_stream();
            DS4_CUDA_CHECK(cudaEventRecord(mix_ready_, s_));
            DS4_CUDA_CHECK(cudaStreamWaitEvent(side_, mix_ready_, 0));
            cuda::hc_mix_combine(mixes_.as<float>(), scale, base, n, iters, hp_.hc_eps, mt, mt + n,
                                 mt + 2 * n, X, E, x_in, side_, 1, cuda::HcMixParts::CombOnly);
            DS4_CUDA_CHECK(cudaEventRecord(comb_ready_, side_));
            comb_pending_ = true;
            cuda::hc_mix_combine(mixes_.as<float>(), scale, base, n, iters, hp_.hc_eps, mt, mt + n,
                                 mt + 2 * n, X, E, x_in, s_, 1, cuda::HcMixParts::WithoutComb);
            return;
        }
        cuda::hc_mix_combine(mixes_.as<float>(), scale, base, n, iters, hp_.hc_eps, mt, mt + n,
                             mt + 2 * n, X + t * width, E, x_in + t * E, s_);
    }
}

void CudaOps::hc_post(const float *mix, const float *y, int64_t m, float *X) {
    if (replaying(kHcPostOp, {reinterpret_cast<uintptr_t>(mix), reinterpret_cast<uintptr_t>(y),
                              uint64_t(m), reinterpret_cast<uintptr_t>(X)}))
        return;
    if (skipped("hc_post")) return;
    const int n = int(hp_.n_hc);
    const int64_t E = hp_.n_embd;
    join_side_stream();  // comb
    const ProfileScope scope(profile_, s_, "hc_post");
    if (pending_sum_.y == y && m == 1) {  // y is the MoE's sum: formed here (moe_sum)
        cuda::hc_post_slots(mix + n, mix + 2 * n, pending_sum_.slots, int(hp_.n_expert_used),
                            pending_sum_.shared, pending_sum_.y, n, E, X, s_);
        pending_sum_ = {};
        return;
    }
    flush_moe_sum();
    cuda::hc_post(mix + n, mix + 2 * n, y, n, E, X, s_, int(m));
}

void CudaOps::hc_head(const float *X, float *out) {
    if (replaying(7, {reinterpret_cast<uintptr_t>(X), reinterpret_cast<uintptr_t>(out)})) return;
    const int n = int(hp_.n_hc);
    const int64_t E = hp_.n_embd;
    const model::ModelWeights &w = m_.weights();
    const ProfileScope scope = weight_scope("hc_head", w.output_hc_fn, 1);
    cuda::rms_norm(X, nullptr, flat_.as<float>(), 1, n * E, hp_.rms_eps, s_);
    matvec(m_.matrix(w.output_hc_fn), flat_.as<float>(), mixes_.as<float>());
    cuda::hc_head_weights(mixes_.as<float>(), m_.vec(w.output_hc_scale), m_.vec(w.output_hc_base),
                          n, hp_.hc_eps, head_w_.as<float>(), s_);
    cuda::hc_combine(head_w_.as<float>(), X, n, E, out, s_);
}

cuda::RowFinish CudaOps::compressed_row(uint32_t il, bool indexer) {
    const model::LayerWeights &L = m_.weights().layers[il];
    LayerKv &st = kv_[il];
    cuda::RowFinish f;
    f.d = indexer ? hp_.idx_head_dim : hp_.head_dim;
    f.norm_w = m_.vec(indexer ? L.idx_comp_norm : L.comp_norm);
    f.eps = hp_.rms_eps;
    f.freqs = freqs(il);
    f.n_freq = hp_.n_rot / 2;
    // The per-cache rounding: FP8 on the attention row's non-rotary dims, Hadamard + FP4 on the
    // indexer's (docs/MODEL.md 4.0).
    if (opts_.qat_sim) f.rounding = indexer ? cuda::RowRounding::Indexer : cuda::RowRounding::Fp8;
    f.n_fp8 = indexer ? 0 : hp_.n_nope();
    f.table = (indexer ? st.idx : st.comp).as<float>();
    f.f16 = f16_;
    return f;
}

void CudaOps::compress(uint32_t il, bool indexer, const float *kv, const float *score, int64_t t) {
    const model::LayerWeights &L = m_.weights().layers[il];
    LayerKv &st = kv_[il];
    const uint32_t r = hp_.compress_ratio[il];
    const bool overlap = hp_.compressor_coff(il) == 2;
    const int64_t d = indexer ? hp_.idx_head_dim : hp_.head_dim;
    const int64_t W = int64_t(hp_.compressor_coff(il)) * d;
    float *state_kv = (indexer ? st.idx_kv : st.comp_kv).as<float>();
    float *state_score = (indexer ? st.idx_score : st.comp_score).as<float>();
    const int64_t *completes = ratio_word(t, r, kStoreIndex);
    const ProfileScope scope(profile_, s_, indexer ? "attn indexer compressor" : "attn compressor");
    // runtime/compressor.cpp compressor_push: the token's rows plus its phase's position bias,
    // into the window's slot of this phase; then the pooled row (pool, norm, rotation,
    // rounding, store; row_finish.h) and the window's shift, only where the token completes it
    // (the device word `completes`): one launch (compressor_step). The work enqueued is the
    // same at every position (a replayed graph), the stored rows the CPU's.
    cuda::CompressorStep c;
    c.kv = kv;
    c.score = score;
    c.ape = m_.vec(indexer ? L.idx_comp_ape : L.comp_ape);
    c.width = W;
    c.phase = ratio_word(t, r, kPhase);
    c.slot_base = overlap ? r : 0;
    c.state_kv = state_kv;
    c.state_score = state_score;
    c.shift = overlap;
    cuda::RowFinish f = compressed_row(il, indexer);
    f.state_kv = state_kv;
    f.state_score = state_score;
    f.ratio = int(r);
    f.overlap = overlap;
    f.width = W;
    f.pos = ratio_word(t, r, kCompPos);
    f.index = completes;
    cuda::compressor_step(c, f, s_);
}

void CudaOps::compress_batch(uint32_t il, bool indexer, const float *kv, const float *score,
                             int64_t m) {
    const model::LayerWeights &L = m_.weights().layers[il];
    LayerKv &st = kv_[il];
    const uint32_t r = hp_.compress_ratio[il];
    const bool overlap = hp_.compressor_coff(il) == 2;
    const int64_t d = indexer ? hp_.idx_head_dim : hp_.head_dim;
    const int64_t W = int64_t(hp_.compressor_coff(il)) * d, stride = int64_t(step_words());
    const ProfileScope scope(profile_, s_, indexer ? "attn indexer compressor" : "attn compressor");
    // Every token's push, and the pooled rows of the windows the batch completes (compress()'s
    // work token by token, in two launches).
    float *pooled = pooled_.as<float>();
    cuda::compressor_batch(kv, score, m_.vec(indexer ? L.idx_comp_ape : L.comp_ape), d, W, int(r),
                           overlap, overlap ? r : 0, ratio_word(0, r, kPhase), int(m),
                           (indexer ? st.idx_kv : st.comp_kv).as<float>(),
                           (indexer ? st.idx_score : st.comp_score).as<float>(), pooled, s_);
    // Token t completes a window where (n_past + t + 1) % r == 0: every r-th from the first.
    const int64_t first = (r - (n_past_ + 1) % r) % r;
    if (first >= m) return;
    cuda::RowFinish f = compressed_row(il, indexer);
    f.rows = pooled;
    f.n_rows = (m - 1 - first) / r + 1;
    f.pos = ratio_word(first, r, kCompPos);
    f.index = ratio_word(first, r, kStoreIndex);
    f.rows_per_token = 1;
    f.word_stride = int64_t(r) * stride;  // the completing tokens' words
    cuda::row_finish(f, s_);
}

void CudaOps::attention_core(uint32_t il, const AttentionInputs &in, int64_t m, float *O) {
    if (replaying(kAttentionCoreOp, {il, reinterpret_cast<uintptr_t>(in.q),
                                     reinterpret_cast<uintptr_t>(O), uint64_t(m)}))
        return;
    if (skipped("attention_core")) return;
    const uint32_t r = hp_.compress_ratio[il];
    // Every token's query heads and KV row at once: the ring holds the batch's rows beside the
    // window each token sees (ring_rows_).
    finish_q_kv(il, in, m);
    // Then the compressors (each token pools into the window its predecessors left: one
    // launch walks the batch's tokens in order).
    size_t gather = kPlainGather, n_rows = kPlainRows;
    if (r != 0) {
        const bool indexed = hp_.attention_kind(il) == model::AttentionKind::Overlapped;
        const size_t base = kRatioBase + ratio_row_.at(r) * kRatioWords;
        gather = base + (indexed ? kGatherIndexed : kGatherAll);
        n_rows = base + (indexed ? kRowsIndexed : kRowsAll);
    }
    if (join_pending_) {
        // The compressors read the branch's products (runtime/attention.cpp): on the branch.
        use_stream(true);
        compress_tokens(il, in, m);
        leave_branch_stream();
        settle_branch();
    } else {
        compress_tokens(il, in, m);
    }
    // Then the indexer's selection and attention over the visible rows, for as many tokens at
    // once as the scratch holds (a token's scores and selection only see the rows pooled up to
    // it: its count word).
    for (int64_t t0 = 0; t0 < m; t0 += attend_batch_) {
        const int64_t n = std::min<int64_t>(attend_batch_, m - t0);
        select_rows(il, in, t0, n);
        attend(il, in.q, t0, n, gather, n_rows, O);
    }
}

void CudaOps::finish_q_kv(uint32_t il, const AttentionInputs &in, int64_t m) {
    const model::HParams &hp = hp_;
    const model::LayerWeights &L = m_.weights().layers[il];
    const int64_t H = hp.n_head, D = hp.head_dim;
    const ProfileScope scope(profile_, s_, "attn q/kv norm+rope+store");
    // Each head of q: rmsnorm and RoPE at its token's position, in place (row_finish.h).
    cuda::RowFinish fq;
    fq.d = D;
    fq.n_rows = m * H;
    fq.rows = fq.out = in.q;
    fq.eps = hp.rms_eps;
    fq.freqs = freqs(il);
    fq.n_freq = hp.n_rot / 2;
    fq.pos = word(0, kPos);
    fq.rows_per_token = H;
    fq.word_stride = int64_t(step_words());
    // Each token's KV row: rmsnorm, RoPE, FP8 on the non-rotary dims, into its ring slot (the
    // same launch as the heads).
    cuda::RowFinish fkv = fq;
    fkv.n_rows = m;
    fkv.rows = in.kv;
    fkv.out = nullptr;
    fkv.norm_w = m_.vec(L.attn_kv_a_norm);
    if (opts_.qat_sim) fkv.rounding = cuda::RowRounding::Fp8;
    fkv.n_fp8 = hp.n_nope();
    fkv.table = kv_[il].raw.as<float>();
    fkv.index = word(0, kRingSlot);
    fkv.rows_per_token = 1;
    fkv.f16 = f16_;
    cuda::row_finish_pair(fq, fkv, s_);
}

void CudaOps::compress_tokens(uint32_t il, const AttentionInputs &in, int64_t m) {
    const model::HParams &hp = hp_;
    if (hp.compress_ratio[il] == 0) return;
    const bool indexed = hp.attention_kind(il) == model::AttentionKind::Overlapped;
    if (m > 1) {
        compress_batch(il, false, in.comp_kv, in.comp_score, m);
        if (indexed) compress_batch(il, true, in.idx_kv, in.idx_score, m);
        return;
    }
    compress(il, false, in.comp_kv, in.comp_score, 0);
    if (indexed) compress(il, true, in.idx_kv, in.idx_score, 0);
}

void CudaOps::select_rows(uint32_t il, const AttentionInputs &in, int64_t t0, int64_t n) {
    const model::HParams &hp = hp_;
    const uint32_t r = hp.compress_ratio[il];
    if (r == 0 || hp.attention_kind(il) != model::AttentionKind::Overlapped) return;
    const int64_t cap = int64_t(ctx_ / r + 1);
    if (cap <= int64_t(hp.idx_top_k)) return;  // the indexer cannot select: every row is seen
    if (!in.idx_q) return;  // no token of the batch selects (runtime/attention.cpp)
    // runtime/indexer.cpp indexer_select, used where count > top_k; token t's ids at
    // selected_ + t top_k.
    std::optional<ProfileScope> scope;
    scope.emplace(profile_, s_, "attn indexer scores");
    const int64_t I = hp.idx_head_dim, IH = hp.n_idx_head, stride = int64_t(step_words());
    float *iq = in.idx_q + t0 * IH * I;
    cuda::RowFinish fi;  // RoPE and the indexer's rounding, in place
    fi.d = I;
    fi.n_rows = n * IH;
    fi.rows = fi.out = iq;
    fi.norm = false;
    fi.freqs = freqs(il);
    fi.n_freq = hp.n_rot / 2;
    fi.pos = word(t0, kPos);
    fi.rows_per_token = IH;
    fi.word_stride = stride;
    if (opts_.qat_sim) fi.rounding = cuda::RowRounding::Indexer;
    cuda::row_finish(fi, s_);
    const float wscale = static_cast<float>(1.0 / std::sqrt(double(I) * IH));
    const int64_t *count = ratio_word(t0, r, kCount);
    const cuda::IndexerTokens tokens{int(n), stride};
    cuda::indexer_scores(iq, in.idx_w + t0 * IH, wscale, kv_[il].idx.as<float>(), cap, int(IH),
                         int(I), idx_scores_.as<float>(), s_, count, tokens);
    scope.reset();
    const ProfileScope topk_scope(profile_, s_, "attn indexer top-k");
    cuda::top_k_ascending(idx_scores_.as<float>(), cap, hp.idx_top_k,
                          selected_.as<int32_t>() + t0 * hp.idx_top_k, topk_scratch_.get(), s_,
                          count, tokens);
}

void CudaOps::attend(uint32_t il, const float *Q, int64_t t0, int64_t n, size_t gather_word,
                     size_t rows_word, float *O) {
    const model::HParams &hp = hp_;
    const model::LayerWeights &L = m_.weights().layers[il];
    const int64_t H = hp.n_head, D = hp.head_dim;
    const uint32_t r = hp.compress_ratio[il];
    const bool indexed = hp.attention_kind(il) == model::AttentionKind::Overlapped;
    const int64_t cap = r ? int64_t(ctx_ / r + 1) : 0;
    const int64_t max_rows =
        hp.sliding_window + (r ? (indexed ? std::min<int64_t>(cap, hp.idx_top_k) : cap) : 0);
    const float scale = static_cast<float>(1.0 / std::sqrt(double(D)));
    const int64_t stride = int64_t(step_words());
    // Visible rows of each token: the raw window (oldest first), then the compressed rows. One
    // token reads them where they are (the ring and the compressed rows); a batch's are gathered.
    float *rows = rows_.as<float>();
    const int32_t *selected = selected_.as<int32_t>() + t0 * hp.idx_top_k;
    const cuda::VisibleRows in_place{kv_[il].raw.as<float>(), ring_rows_, kv_[il].comp.as<float>(),
                                     selected, word(t0, gather_word)};
    const cuda::VisibleRows *visible = batch_ == 1 && n == 1 ? &in_place : nullptr;
    if (!visible) {
        const ProfileScope scope(profile_, s_, "attn gather");
        cuda::gather_rows_step(kv_[il].raw.as<float>(), ring_rows_, kv_[il].comp.as<float>(),
                               selected, word(t0, gather_word), max_rows, D, rows, s_, int(n),
                               stride, hp.idx_top_k);
    }
    const cuda::AttentionTokens tokens{int(n), stride};
    const float *q = Q + t0 * H * D;
    float *o = O + t0 * H * D;
    {
        const ProfileScope scope(profile_, s_, "attn scores");
        cuda::attention_scores(q, rows, max_rows, H, D, scores_.as<float>(), s_,
                               word(t0, rows_word), tokens, visible);
    }
    const ProfileScope scope(profile_, s_, "attn mix+rope");
    // One token's heads are also rotated back and quantized for the grouped output projection in
    // the mix's launch (the step's last write of O; linear_groups finds them in the scratch).
    if (batch_ == 1 && size_t(H * D) <= sc_->xq.bytes() && D % 32 == 0) {
        const cuda::MixRopeQ8_0 rope_q8_0{freqs(il), hp.n_rot / 2, word(t0, kPos),
                                          sc_->xq.as<int8_t>(), sc_->xd.as<float>()};
        cuda::attention_mix(scores_.as<float>(), rows, max_rows, m_.vec(L.attn_sinks), scale, H, D,
                            o, s_, word(t0, rows_word), tokens, visible, &rope_q8_0);
        sc_->quantized = {o, H * D};
        return;
    }
    cuda::attention_mix(scores_.as<float>(), rows, max_rows, m_.vec(L.attn_sinks), scale, H, D, o,
                        s_, word(t0, rows_word), tokens, visible);
    cuda::rope_tail(o, H, D, freqs(il), hp.n_rot / 2, word(t0, kPos), true, s_, int(n), stride);
}

cuda::RouteDeviceParams CudaOps::route_params(uint32_t il, int64_t t) const {
    const model::LayerWeights &L = m_.weights().layers[il];
    cuda::RouteDeviceParams p;
    p.n_expert = hp_.n_expert;
    p.n_used = hp_.n_expert_used;
    p.bias = m_.vec(L.exp_probs_b);
    p.normalize = hp_.expert_weights_norm;
    p.scale = hp_.expert_weights_scale;
    if (L.tid2eid) {
        p.hash_table = m_.table(L.tid2eid);
        p.token = tokens_.as<int32_t>() + t;
        p.hash_rows = static_cast<int64_t>(L.tid2eid->dim(1));
    }
    return p;
}

namespace {

// Releases a device tier's pass when the operation that acquired it ends, however it ends.
class TierPass {
  public:
    TierPass(DeviceExpertTier &tier, cudaStream_t s) : tier_(tier), s_(s) {}
    ~TierPass() {
        try {
            tier_.release(s_);
        } catch (...) {  // a failing CUDA call; the pass's pins are gone already
        }
    }
    TierPass(const TierPass &) = delete;
    TierPass &operator=(const TierPass &) = delete;

  private:
    DeviceExpertTier &tier_;
    cudaStream_t s_;
};

}  // namespace

std::span<const int32_t> CudaOps::read_ids(const int32_t *ids, int64_t n) {
    DS4_CUDA_CHECK(
        cudaMemcpyAsync(ids_host_, ids, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, s_));
    DS4_CUDA_CHECK(cudaStreamSynchronize(s_));
    return {ids_host_, size_t(n)};
}

void CudaOps::acquire_hits_first(uint32_t il, const int32_t *ids, const float *x,
                                 const float *weights, float *slot_out) {
    DeviceExpertTier &tier = *m_.expert_tier();
    const int K = int(hp_.n_expert_used);
    std::vector<uint8_t> hit;
    const bool early = hits_first_ && K <= 32;
    const std::vector<uint32_t> experts = acquire_selected(il, ids, K, early ? &hit : nullptr);
    uint32_t mask = 0;  // the slots whose expert is in a slot already
    if (early)
        for (int i = 0; i < K; ++i) {
            const auto at =
                std::lower_bound(experts.begin(), experts.end(), uint32_t(ids_host_[i]));
            if (hit[size_t(at - experts.begin())]) mask |= 1u << i;
        }
    // Hits and misses both: the hits' launch now, the misses' after the uploads (else one
    // launch after them takes every slot).
    const uint32_t all = K == 32 ? ~0u : (1u << K) - 1;
    const bool split = mask != 0 && mask != all;
    int32_t *early_ids = early_ids_.as<int32_t>(), *late_ids = late_ids_.as<int32_t>();
    if (K <= 32)
        cuda::split_ids(ids, K, split ? mask : 0, early_ids, late_ids, s_);
    else  // more than split_ids takes (never hits first): the later launch takes them all
        DS4_CUDA_CHECK(cudaMemcpyAsync(late_ids, ids, size_t(K) * sizeof(int32_t),
                                       cudaMemcpyDeviceToDevice, s_));
    if (split) {
        // Into their own buffers and scratch (a branch's, unused with a tier: branches are off),
        // so that the later launch finds the router's quantized input as it left it. The gate
        // and up of the left-out slots, and their SwiGLU, are not read: the down product leaves
        // them out too.
        TokenScratch *main = sc_;
        sc_ = &scratch_[1];
        try {
            routed_experts(il, early_ids, x, false, weights, gate_early_.as<float>(),
                           up_early_.as<float>(), slot_out);
        } catch (...) {
            sc_ = main;
            throw;
        }
        sc_ = main;
    }
    tier.wait_uploads(s_);
}

std::vector<uint32_t> CudaOps::acquire_selected(uint32_t il, const int32_t *ids, int64_t n,
                                                std::vector<uint8_t> *hit) {
    std::vector<uint32_t> experts;
    for (const int32_t id : read_ids(ids, n)) {
        if (id < 0 || uint32_t(id) >= hp_.n_expert)
            throw Error(
                fmt::format("CUDA backend: the router of layer {} chose expert {}", il, id));
        experts.push_back(uint32_t(id));
    }
    std::sort(experts.begin(), experts.end());
    experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
    const ProfileScope scope(profile_, s_, "moe expert tier");
    m_.expert_tier()->acquire(il, experts, s_, hit);
    return experts;
}

void CudaOps::moe_routed(uint32_t il, const float *XN, const float *logits, int64_t m,
                         float *slot_out) {
    const bool replay = replaying(
        kMoeRoutedOp, {il, reinterpret_cast<uintptr_t>(XN), reinterpret_cast<uintptr_t>(logits),
                       uint64_t(m), reinterpret_cast<uintptr_t>(slot_out)});
    // A streamed decode step in segments: the router's kernel ends one (replayed or captured),
    // the tier's work runs between, the experts' kernels start the next.
    const bool segmented = !segments_.empty() && use_graphs_ && batch_ == 1 && m == 1;
    if (replay && !segmented) return;
    if (!replay && !segmented && skipped("moe_routed")) return;  // a segment ends in it
    if (!replay) {
        // The slots may overwrite the input whose quantization the scratch holds.
        forget_quantization_if_written(slot_out, size_t(m) * hp_.n_expert_used * hp_.n_embd);
        // So may the products into its own scratch.
        forget_quantization_if_written(gate_.as<float>(), gate_.bytes() / sizeof(float));
        forget_quantization_if_written(up_.as<float>(), up_.bytes() / sizeof(float));
    }
    const model::HParams &hp = hp_;
    const model::LayerWeights &L = m_.weights().layers[il];
    const int K = int(hp.n_expert_used);
    const int64_t E = hp.n_embd;
    const DeviceMatrix &gate = m_.matrix(L.ffn_gate_exps), &up = m_.matrix(L.ffn_up_exps),
                       &down = m_.matrix(L.ffn_down_exps);
    if (m > 1 && gate.q8_k_activations() && up.q8_k_activations() && down.q8_k_activations() &&
        gate.k == up.k) {
        moe_routed_grouped(il, XN, logits, m, slot_out);
        return;
    }
    for (int64_t t = 0; t < m; ++t) {
        int32_t *ids = expert_ids_.as<int32_t>() + t * K;
        float *weights = expert_w_.as<float>() + t * K;
        const cuda::RouteDeviceParams p = route_params(il, t);
        auto scope = std::make_optional<ProfileScope>(profile_, s_, "moe route");
        const float *x = XN + t * E;
        // Q8_K experts: the router's launch quantizes their input too.
        const bool x_quantized =
            gate.q8_k_activations() && gate.k == E && size_t(E) <= sc_->q8k_q.bytes();
        if (replay) {  // the router's kernel is in the segment that end_segment launches
        } else if (x_quantized) {
            cuda::route_experts_q8_K(logits + t * hp.n_expert, p, ids, weights, x, E, q8k_scratch(),
                                     s_);
        } else {
            cuda::route_experts(logits + t * hp.n_expert, p, ids, weights, s_);
        }
        scope.reset();
        std::optional<TierPass> pass;
        // Streamed, the kernels below take late_ids_ (the same buffer every step, as a captured
        // segment needs): every selected id, or the misses' where the hits ran first.
        const int32_t *run_ids = ids;
        if (segmented) {
            end_segment();
            pass_pending_ = true;  // released once the next segment, with its kernels, is launched
            try {
                acquire_hits_first(il, ids, x, weights, slot_out + t * K * E);
                begin_segment();
            } catch (...) {
                drop_pending_pass();
                throw;
            }
            if (replay) return;  // the experts' kernels are in the next segment's graph
            run_ids = late_ids_.as<int32_t>();
        } else if (DeviceExpertTier *tier = m_.expert_tier()) {
            pass.emplace(*tier, s_);
            acquire_hits_first(il, ids, x, weights, slot_out + t * K * E);
            run_ids = late_ids_.as<int32_t>();
        }
        routed_experts(il, run_ids, x, x_quantized, weights, gate_.as<float>(), up_.as<float>(),
                       slot_out + t * K * E);
    }
}

void CudaOps::routed_experts(uint32_t il, const int32_t *ids, const float *x, bool x_quantized,
                             const float *weights, float *gate_out, float *up_out,
                             float *slot_out) {
    const model::HParams &hp = hp_;
    const model::LayerWeights &L = m_.weights().layers[il];
    const int K = int(hp.n_expert_used);
    const int64_t E = hp.n_embd, F = hp.n_ff_exp;
    const DeviceMatrix &gate = m_.matrix(L.ffn_gate_exps), &up = m_.matrix(L.ffn_up_exps),
                       &down = m_.matrix(L.ffn_down_exps);
    std::optional<ProfileScope> scope;
    // K of the layer's experts: K / n_expert of each tensor's bytes.
    const double share = double(K) / double(hp.n_expert);
    scope.emplace(weight_scope("moe gate+up", L.ffn_gate_exps, 2 * share));
    // The same activation in the same format: quantized once, for both (float experts
    // read x itself); IQ2_XXS and Q4_K pairs of one shape in one launch.
    const bool same_format = gate.type == up.type && gate.k == up.k;
    if (same_format && gate.n_rows == up.n_rows &&
        ((gate.iq2_xxs && up.iq2_xxs) || (gate.q4_k && up.q4_k))) {
        const cuda::Q8_KActivation a = x_quantized ? q8k_scratch() : quantize_q8_k(x, gate.k);
        if (gate.iq2_xxs)
            cuda::matvec_iq2_xxs_pair(gate.iq2_xxs->experts(), up.iq2_xxs->experts(), ids, K, a,
                                      gate_out, up_out, s_);
        else
            cuda::matvec_q4_K_pair(gate.q4_k->experts(), up.q4_k->experts(), ids, K, a, gate_out,
                                   up_out, s_);
    } else {
        experts_matvec(gate, ids, K, x, false, gate_out, x_quantized);
        experts_matvec(up, ids, K, x, false, up_out,
                       same_format || (x_quantized && up.q8_k_activations() && up.k == E));
    }
    scope.reset();
    scope.emplace(profile_, s_, "moe swiglu");
    // ds4 weights W2's input by the route weight (docs/MODEL.md 4.6). The down product's
    // activation is quantized in the same launch where its format allows.
    float *h = gate_out;
    const float c = hp.swiglu_clamp[il];
    bool quantized = false;
    if (down.q8_k_activations() && size_t(K * F) <= sc_->q8k_q.bytes())
        quantized = cuda::swiglu_slots_q8_K(h, up_out, K, F, c, weights, h, q8k_scratch(), s_);
    else if (down.q8_0 && size_t(K * F) <= sc_->xq.bytes() &&
             cuda::swiglu_slots_q8_0(h, up_out, K, F, c, weights, h, sc_->xq.as<int8_t>(),
                                     sc_->xd.as<float>(), s_)) {
        quantized = true;
        sc_->quantized = {h, K * F};
    }
    if (!quantized) cuda::swiglu_slots(h, up_out, K, F, c, weights, h, s_);
    scope.reset();
    scope.emplace(weight_scope("moe down", L.ffn_down_exps, share));
    experts_matvec(down, ids, K, h, true, slot_out, quantized);
}

void CudaOps::grouped_product(const DeviceMatrix &w, const cuda::ExpertGroups &groups,
                              const cuda::Q8_KActivation &x, float *y) {
    if (w.iq2_xxs)
        cuda::matmul_iq2_xxs_grouped(w.iq2_xxs->experts(), groups, x, y, s_);
    else if (w.q2_k)
        cuda::matmul_q2_K_grouped(w.q2_k->experts(), groups, x, y, s_);
    else
        cuda::matmul_q4_K_grouped(w.q4_k->experts(), groups, x, y, s_);
}

void CudaOps::moe_routed_grouped(uint32_t il, const float *XN, const float *logits, int64_t m,
                                 float *slot_out) {
    const model::HParams &hp = hp_;
    const int K = int(hp.n_expert_used);
    const int64_t pairs = m * K;
    int32_t *ids = expert_ids_.as<int32_t>();
    {
        const ProfileScope scope(profile_, s_, "moe route");
        cuda::route_experts(logits, route_params(il, 0), ids, expert_w_.as<float>(), s_, int(m));
        if (!m_.expert_tier())
            cuda::group_by_expert(ids, int(pairs), int(hp.n_expert), expert_offsets_.as<int32_t>(),
                                  expert_order_.as<int32_t>(), s_);
    }
    if (m_.expert_tier()) {  // streamed: the host groups the pairs in rounds
        moe_routed_rounds(il, XN, read_ids(ids, pairs), m, slot_out);
        return;
    }
    const cuda::ExpertGroups groups{expert_offsets_.as<int32_t>(), expert_order_.as<int32_t>(),
                                    int(hp.n_expert), K, int(m)};
    grouped_pairs(il, XN, groups, double(m), slot_out);
}

void CudaOps::grouped_pairs(uint32_t il, const float *XN, const cuda::ExpertGroups &groups,
                            double tokens, float *slot_out) {
    const model::HParams &hp = hp_;
    const model::LayerWeights &L = m_.weights().layers[il];
    const int64_t m = groups.n_tokens, pairs = m * hp.n_expert_used;
    const int64_t E = hp.n_embd, F = hp.n_ff_exp;
    const DeviceMatrix &gate = m_.matrix(L.ffn_gate_exps), &up = m_.matrix(L.ffn_up_exps),
                       &down = m_.matrix(L.ffn_down_exps);
    if (up.type != gate.type) throw Error("CUDA backend: routed gate and up of two formats");
    // The profile's bytes are those the token-by-token products of `tokens` tokens would read
    // (K experts a token); grouped, each selected expert's weights are read once per 8 of its
    // pairs.
    const double share = double(hp.n_expert_used) / double(hp.n_expert) * tokens;
    {
        const ProfileScope scope = weight_scope("moe gate+up", L.ffn_gate_exps, 2 * share);
        // One quantization of every token's input for both products (as moe_routed_cpu).
        const cuda::Q8_KActivation x = quantize_q8_k_batch(XN, m * E);
        grouped_product(gate, groups, x, gate_.as<float>());
        grouped_product(up, groups, x, up_.as<float>());
    }
    {
        const ProfileScope scope(profile_, s_, "moe swiglu");
        cuda::swiglu_slots(gate_.as<float>(), up_.as<float>(), int(pairs), F, hp.swiglu_clamp[il],
                           expert_w_.as<float>(), gate_.as<float>(), s_);
    }
    const ProfileScope scope = weight_scope("moe down", L.ffn_down_exps, share);
    cuda::ExpertGroups down_groups = groups;
    down_groups.x_div = 1;  // each pair's own SwiGLU row
    grouped_product(down, down_groups, quantize_q8_k_batch(gate_.as<float>(), pairs * F), slot_out);
}

void CudaOps::moe_routed_rounds(uint32_t il, const float *XN, std::span<const int32_t> ids,
                                int64_t m, float *slot_out) {
    const model::HParams &hp = hp_;
    const int64_t pairs = int64_t(ids.size());
    DeviceExpertTier &tier = *m_.expert_tier();
    // The host groups the pairs' ids (read_ids waited for s_, so the last call's copy of
    // rounds_host_ is done before it is rewritten) in rounds the tier holds.
    const std::vector<experts::ExpertRound> rounds =
        experts::expert_rounds(ids, hp.n_expert, tier.n_slots());
    std::vector<size_t> at;  // each round's offsets, then its order, in rounds_host_
    size_t used = 0;
    for (const experts::ExpertRound &r : rounds) {
        if (used + r.offsets.size() + r.order.size() > rounds_ints_)
            throw Error("CUDA backend: a chunk's expert rounds overflow their scratch");
        at.push_back(used);
        std::copy(r.offsets.begin(), r.offsets.end(), rounds_host_ + used);
        used += r.offsets.size();
        std::copy(r.order.begin(), r.order.end(), rounds_host_ + used);
        used += r.order.size();
    }
    DS4_CUDA_CHECK(cudaMemcpyAsync(rounds_.get(), rounds_host_, used * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s_));
    // Each round is the resident path's sequence over all pairs but with only the round's
    // groups filled: every pair of the round gets its bits; the SwiGLU and the down input's
    // quantization also pass over the other pairs' rows, which no product of this round reads
    // (a later round rewrites them first; an earlier one has written its outputs already).
    for (size_t r = 0; r < rounds.size(); ++r) {
        const int32_t *offsets = rounds_.as<int32_t>() + at[r];
        const cuda::ExpertGroups groups{offsets, offsets + rounds[r].offsets.size(),
                                        int(hp.n_expert), int(hp.n_expert_used), int(m)};
        tier.acquire(il, rounds[r].experts, s_);
        const TierPass pass(tier, s_);
        grouped_pairs(il, XN, groups, double(m) * double(rounds[r].order.size()) / double(pairs),
                      slot_out);
    }
}

void CudaOps::swiglu(float *G, const float *U, int64_t m, int64_t n, float clamp) {
    if (replaying(10, {reinterpret_cast<uintptr_t>(G), reinterpret_cast<uintptr_t>(U), uint64_t(m),
                       uint64_t(n)}))
        return;
    if (skipped("swiglu")) return;
    const ProfileScope scope(profile_, s_, "swiglu");
    // One token's SwiGLU quantizes its output too: the next operation is the shared expert's
    // down product (Q8_0 in the published files).
    if (m == 1 && size_t(n) <= sc_->xq.bytes() &&
        cuda::swiglu_slots_q8_0(G, U, 1, n, clamp, nullptr, G, sc_->xq.as<int8_t>(),
                                sc_->xd.as<float>(), s_)) {
        sc_->quantized = {G, n};
        return;
    }
    cuda::swiglu_slots(G, U, int(m), n, clamp, nullptr, G, s_);
}

void CudaOps::moe_sum(const float *slot_out, const float *shared, int64_t m, float *Y) {
    if (replaying(11, {reinterpret_cast<uintptr_t>(slot_out), reinterpret_cast<uintptr_t>(shared),
                       uint64_t(m), reinterpret_cast<uintptr_t>(Y)}))
        return;
    if (skipped("moe_sum")) return;
    if (m == 1 && defer_) {  // formed by the hc_post that reads it, if one does
        pending_sum_ = {slot_out, shared, Y};
        return;
    }
    const int K = int(hp_.n_expert_used);
    const int64_t E = hp_.n_embd;
    const ProfileScope scope(profile_, s_, "moe_sum");
    cuda::sum_slots(slot_out, K, E, shared, Y, s_, int(m));
}

void CudaOps::flush_moe_sum() {
    if (!pending_sum_.y) return;
    const PendingSum p = pending_sum_;
    pending_sum_ = {};
    cuda::sum_slots(p.slots, int(hp_.n_expert_used), hp_.n_embd, p.shared, p.y, s_);
}

void CudaOps::write(const float *host, size_t n, float *x) {
    if (n > handed_floats_) {
        // A later stage's staging is made with the session (its write is inside a captured
        // step); a part of a tensor split writes its sums after a read, which ends the capture.
        if (capturing())
            throw Error(
                fmt::format("internal: {} floats written during a capture into a staging "
                            "of {}",
                            n, handed_floats_));
        if (handed_host_) DS4_CUDA_CHECK(cudaFreeHost(handed_host_));
        handed_host_ = nullptr;
        handed_floats_ = 0;
        DS4_CUDA_CHECK(cudaMallocHost(&handed_host_, n * sizeof(float)));
        handed_floats_ = n;
    }
    // As the tokens in begin_batch: the staging is free (the previous write's copy is done: a
    // read(), which waits for the stream, came between), and a replayed step's captured copy
    // reads it.
    std::copy(host, host + n, handed_host_);
    if (replaying(kWriteOp, {reinterpret_cast<uintptr_t>(x), n})) return;
    DS4_CUDA_CHECK(cudaMemcpyAsync(x, handed_host_, n * sizeof(float), cudaMemcpyHostToDevice, s_));
}

void CudaOps::read(const float *x, size_t n, float *host) {
    replaying(12, {reinterpret_cast<uintptr_t>(x), n});
    join_side_stream();
    DecodeGraph &g = graph();
    if (!segments_.empty() && (g.capturing() || replay_) && segment_ + 1 != segments_.size())
        throw Error("internal: a decode step ended before its last segment");
    if (g.capturing())
        g.end_capture_and_launch(s_, step_hash_);
    else if (replay_)
        g.launch(s_, step_hash_);
    release_pending_pass();
    replay_ = false;
    DS4_CUDA_CHECK(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, s_));
    DS4_CUDA_CHECK(cudaStreamSynchronize(s_));
    profile_.collect();
}

std::shared_ptr<const BackendState> CudaOps::save() const {
    const cuda::DeviceScope scope(device_);
    if (capturing()) throw Error("CUDA backend: save() during a step");
    // The state is copied on the main stream; a step that threw may have left branch work.
    DS4_CUDA_CHECK(cudaStreamSynchronize(branch_));
    auto st = std::make_shared<CudaState>(device_);
    st->n_past = n_past_;
    // As serialised: the rows in use at 2 or 4 bytes a value, the compressor windows as f32.
    const size_t elem = f16_ ? 2 : 4;
    const size_t raw_rows = size_t(std::min<int64_t>(n_past_, hp_.sliding_window));
    st->payload = 2 * layers_.size() * sizeof(uint32_t);  // its own layers' counts
    for (uint32_t il = 0; il < kv_.size(); ++il) {
        const LayerKv &l = kv_[il];
        const uint32_t r = hp_.compress_ratio[il];
        const bool held = layers_.contains(il);  // another stage's layer is empty here
        const size_t comp_rows = r && held ? size_t(n_past_) / r : 0;
        const size_t idx_rows = l.idx.bytes() ? comp_rows : 0;
        st->payload += ((held ? raw_rows : 0) + comp_rows) * hp_.head_dim * elem +
                       idx_rows * hp_.idx_head_dim * elem + l.comp_kv.bytes() +
                       l.comp_score.bytes() + l.idx_kv.bytes() + l.idx_score.bytes();
        LayerKv &copy = st->layers.emplace_back();
        const auto from = l.buffers();
        const auto to = copy.buffers();
        for (size_t i = 0; i < from.size(); ++i) *to[i] = clone(*from[i], main_);
    }
    DS4_CUDA_CHECK(cudaStreamSynchronize(main_));
    return st;
}

void CudaOps::restore(const BackendState &state) {
    const cuda::DeviceScope scope(device_);
    abort_step();
    const auto *st = dynamic_cast<const CudaState *>(&state);
    if (st == nullptr || st->layers.size() != kv_.size())
        throw Error("restore: a snapshot of another backend or model");
    for (size_t il = 0; il < kv_.size(); ++il) {
        const auto from = st->layers[il].buffers();
        const auto to = kv_[il].buffers();
        for (size_t i = 0; i < from.size(); ++i) copy_into(*to[i], *from[i], main_);
    }
    n_past_ = st->n_past;
    DS4_CUDA_CHECK(cudaStreamSynchronize(main_));
}

namespace {

// The compressor windows of a layer, which a rewind point copies whole.
template <class Layer>  // CudaOps::LayerKv, const or not
auto window_buffers(Layer &l) {
    return std::array{&l.comp_kv, &l.comp_score, &l.idx_kv, &l.idx_score};
}

}  // namespace

// A rewind point: per layer the ring's rows of the last min(n_past, sliding_window) positions,
// oldest first (all a later token can see of the window), in `raw`, and the compressor windows.
struct CudaTail final : BackendState {
    explicit CudaTail(int device) : device_(device) {}
    ~CudaTail() override { on_device_.arm(device_); }
    cuda::DeviceRestore on_device_;  // before the buffers: put back after they are freed
    int device_;
    std::vector<CudaOps::LayerKv> layers;  // comp and idx left empty
    int64_t n_past = 0;
    size_t payload = 0;
    size_t payload_bytes() const override { return payload; }
};

void CudaOps::copy_window_rows(float *rows, uint32_t il, bool to_ring) const {
    // Positions first..n_past_-1 sit at slots p % ring_rows_: at most two contiguous runs.
    const int64_t D = hp_.head_dim, first = std::max<int64_t>(0, n_past_ - hp_.sliding_window);
    float *ring = kv_[il].raw.as<float>();
    for (int64_t p = first; p < n_past_;) {
        const int64_t slot = p % ring_rows_, n = std::min(n_past_ - p, ring_rows_ - slot);
        float *r = ring + slot * D, *t = rows + (p - first) * D;
        DS4_CUDA_CHECK(cudaMemcpyAsync(to_ring ? r : t, to_ring ? t : r, size_t(n * D) * 4,
                                       cudaMemcpyDeviceToDevice, main_));
        p += n;
    }
}

std::shared_ptr<const BackendState> CudaOps::save_tail() const {
    const cuda::DeviceScope scope(device_);
    if (capturing()) throw Error("CUDA backend: save_tail() during a step");
    // The state is copied on the main stream; a step that threw may have left branch work.
    DS4_CUDA_CHECK(cudaStreamSynchronize(branch_));
    auto t = std::make_shared<CudaTail>(device_);
    t->n_past = n_past_;
    const size_t window = size_t(hp_.sliding_window) * hp_.head_dim;
    for (uint32_t il = 0; il < kv_.size(); ++il) {
        LayerKv &copy = t->layers.emplace_back();
        if (!layers_.contains(il)) continue;  // another stage's layer
        copy.raw = device_array<float>(window);
        copy_window_rows(copy.raw.as<float>(), il, false);
        t->payload += window * sizeof(float);
        const auto src = window_buffers(kv_[il]);
        const auto dst = window_buffers(copy);
        for (size_t i = 0; i < src.size(); ++i) {
            *dst[i] = clone(*src[i], main_);
            t->payload += src[i]->bytes();
        }
    }
    DS4_CUDA_CHECK(cudaStreamSynchronize(main_));
    return t;
}

void CudaOps::rewind(const BackendState &tail) {
    const cuda::DeviceScope scope(device_);
    abort_step();
    const auto *t = dynamic_cast<const CudaTail *>(&tail);
    if (t == nullptr || t->layers.size() != kv_.size())
        throw Error("rewind: a rewind point of another backend or model");
    if (t->n_past > n_past_) throw Error("rewind: a point after the current position");
    n_past_ = t->n_past;
    for (uint32_t il = layers_.begin; il < layers_.end; ++il) {
        copy_window_rows(t->layers[il].raw.as<float>(), il, true);
        const auto src = window_buffers(t->layers[il]);
        const auto dst = window_buffers(kv_[il]);
        for (size_t i = 0; i < src.size(); ++i) copy_into(*dst[i], *src[i], main_);
    }
    DS4_CUDA_CHECK(cudaStreamSynchronize(main_));
}

namespace {

void download(const void *device, void *host, size_t bytes, cudaStream_t s) {
    if (bytes) DS4_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s));
}

void upload(const void *host, void *device, size_t bytes, cudaStream_t s) {
    if (bytes) DS4_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s));
}

// A compressor window's device buffers and its host twin have one layout, rows x width.
void check_window(const cuda::DeviceBuffer &b, const std::vector<float> &host) {
    if (b.bytes() != host.size() * sizeof(float))
        throw Error("internal: a CUDA compressor window of another shape than the CPU's");
}

}  // namespace

void CudaOps::write_state(std::ostream &out) const {
    const cuda::DeviceScope scope(device_);
    if (capturing()) throw Error("CUDA backend: write_state() during a step");
    // The state is copied on the main stream; a step that threw may have left branch work.
    DS4_CUDA_CHECK(cudaStreamSynchronize(branch_));
    const int64_t D = hp_.head_dim, I = hp_.idx_head_dim, W = hp_.sliding_window;
    const int64_t first = std::max<int64_t>(0, n_past_ - W);
    KvCache c(hp_, ctx_, f16_, layers_);
    c.n_past = n_past_;
    cuda::DeviceBuffer window = device_array<float>(size_t(W * D));
    std::vector<float> raw(size_t((n_past_ - first) * D)), comp, idx;
    for (uint32_t il = layers_.begin; il < layers_.end; ++il) {
        const LayerKv &k = kv_[il];
        LayerState &L = c.layers[il];
        copy_window_rows(window.as<float>(), il, false);
        download(window.get(), raw.data(), raw.size() * sizeof(float), main_);
        const uint32_t r = hp_.compress_ratio[il];
        const int64_t rows = r ? n_past_ / r : 0;
        comp.resize(size_t(rows * D));
        idx.resize(k.idx.bytes() ? size_t(rows * I) : 0);
        download(k.comp.get(), comp.data(), comp.size() * sizeof(float), main_);
        download(k.idx.get(), idx.data(), idx.size() * sizeof(float), main_);
        if (r) {
            check_window(k.comp_kv, L.comp_state.kv);
            download(k.comp_kv.get(), L.comp_state.kv.data(), k.comp_kv.bytes(), main_);
            download(k.comp_score.get(), L.comp_state.score.data(), k.comp_score.bytes(), main_);
            check_window(k.idx_kv, L.idx_state.kv);
            download(k.idx_kv.get(), L.idx_state.kv.data(), k.idx_kv.bytes(), main_);
            download(k.idx_score.get(), L.idx_state.score.data(), k.idx_score.bytes(), main_);
        }
        DS4_CUDA_CHECK(cudaStreamSynchronize(main_));
        // The raw ring of the CPU: position p at slot p % W (f16 rows hold f16 values already).
        for (int64_t p = first; p < n_past_; ++p) L.raw.set(size_t(p % W), &raw[(p - first) * D]);
        for (int64_t i = 0; i < rows; ++i) L.comp.push(&comp[i * D]);
        if (!idx.empty())
            for (int64_t i = 0; i < rows; ++i) L.idx.push(&idx[i * I]);
    }
    write_kv_cache(out, c);
}

void CudaOps::read_state(std::istream &in, int64_t n_past) {
    const cuda::DeviceScope scope(device_);
    // Everything is read and checked before the device state changes.
    const KvCache c = read_kv_cache(in, hp_, ctx_, f16_, n_past, layers_);
    abort_step();
    const int64_t D = hp_.head_dim, I = hp_.idx_head_dim, W = hp_.sliding_window;
    n_past_ = n_past;
    const int64_t first = std::max<int64_t>(0, n_past_ - W);
    cuda::DeviceBuffer window = device_array<float>(size_t(W * D));
    std::vector<float> raw(size_t((n_past_ - first) * D)), rows;
    for (uint32_t il = layers_.begin; il < layers_.end; ++il) {
        LayerKv &k = kv_[il];
        const LayerState &L = c.layers[il];
        for (int64_t p = first; p < n_past_; ++p) L.raw.get(size_t(p % W), &raw[(p - first) * D]);
        upload(raw.data(), window.get(), raw.size() * sizeof(float), s_);
        copy_window_rows(window.as<float>(), il, true);
        auto put_rows = [&](const RowStore &from, cuda::DeviceBuffer &to, int64_t width) {
            rows.resize(from.size() * size_t(width));
            for (size_t i = 0; i < from.size(); ++i) from.get(i, &rows[i * size_t(width)]);
            upload(rows.data(), to.get(), rows.size() * sizeof(float), s_);
            DS4_CUDA_CHECK(cudaStreamSynchronize(s_));  // `rows` is reused
        };
        put_rows(L.comp, k.comp, D);
        put_rows(L.idx, k.idx, I);
        if (hp_.compress_ratio[il]) {
            check_window(k.comp_kv, L.comp_state.kv);
            upload(L.comp_state.kv.data(), k.comp_kv.get(), k.comp_kv.bytes(), s_);
            upload(L.comp_state.score.data(), k.comp_score.get(), k.comp_score.bytes(), s_);
            check_window(k.idx_kv, L.idx_state.kv);
            upload(L.idx_state.kv.data(), k.idx_kv.get(), k.idx_kv.bytes(), s_);
            upload(L.idx_state.score.data(), k.idx_score.get(), k.idx_score.bytes(), s_);
        }
        DS4_CUDA_CHECK(cudaStreamSynchronize(s_));  // `raw` is reused
    }
}

size_t CudaOps::kv_bytes() const {
    size_t b = 0;
    for (const LayerKv &l : kv_)
        for (const cuda::DeviceBuffer *buf : l.buffers()) b += buf->bytes();
    return b;
}

}  // namespace ds4::runtime::cuda_backend
