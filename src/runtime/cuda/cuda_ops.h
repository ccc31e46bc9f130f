#pragma once
// The CUDA backend of the model order (runtime/ops.h): every operation is enqueued on the
// session's stream, on buffers in device memory; nothing is read back but the logits. Each
// operation is the composition of backend/cuda kernels that the CPU backend's code does, in the
// same order, so each has its CPU twin (runtime/cpu_ops.cpp) and the whole model is compared
// with the CPU in tests/cuda/test_cuda_model.cpp.
//
// A batch of one token (decode) runs as a CUDA graph captured at the first step and replayed
// after (decode_graphs.h; DS4_CUDA_GRAPHS=0 launches every kernel instead, for comparisons); a
// batch of several (prefill) runs eagerly, a launch per operation for the whole batch (the
// compressors walk its tokens in order in one launch; the indexer and attention take up to 64
// tokens a launch): the Q8_0 products read
// their weights once per 8 tokens (matmul_q8_0), the routed experts once per 8 of each expert's
// tokens (grouped on the device, expert_matmul.cuh), and the float products, hyper-connections
// and MoE glue take the batch's rows in one grid. Every token's outputs are the bits of its
// decode step. Prefill with tensor cores is still to come.
//
// With streamed routed experts (a device tier, device_expert_tier.h) the host reads each layer's
// selected ids to fill the tier before the experts' kernels: a decode step then runs as n_layer + 1
// captured segments, each from one layer's experts to the next layer's router (the first from the
// step's start, the last to its logits), replayed as the whole step is; between two segments the
// host reads the ids and the tier uploads its misses, eagerly. A pass's slots are released after
// the segment holding its kernels is launched. Branches and the side stream are off there (no
// fork may be open where a segment ends).
//
// Everything a step's kernels need that depends on its position is in the StepWords of the
// token, computed by the host, copied to the device with the tokens, and read there: so the work
// enqueued for a step is the same at every position.
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/float_matvec.h"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/per_device.h"
#include "backend/cuda/q8_k_quantize.h"
#include "backend/cuda/row_finish.h"
#include "runtime/cuda/decode_graphs.h"
#include "runtime/cuda/device_model.h"
#include "runtime/cuda/op_profile.h"
#include "runtime/ops.h"

namespace ds4::runtime::cuda_backend {

class CudaOps final : public Ops {
  public:
    // The attention state of `layers` only (default: every layer) for a stage of a split model
    // (runtime/layer_stages.h); a later stage takes its token states through write().
    CudaOps(const DeviceModel &model, uint32_t ctx, bool f16_rows, ForwardOptions opts,
            uint32_t max_batch, LayerRange layers = {});
    ~CudaOps() override;
    CudaOps(const CudaOps &) = delete;
    CudaOps &operator=(const CudaOps &) = delete;

    uint32_t ctx() const override { return ctx_; }
    int64_t n_past() const override { return n_past_; }
    bool replays_steps() const override { return use_graphs_; }
    void begin_batch(std::span<const int32_t> tokens) override;
    float *buffer(size_t n) override;
    size_t mark() const override { return top_; }
    void release(size_t mark) override { top_ = mark; }
    void end_batch() override;
    // Joins the side stream, drops a capture an exception left open and a streamed pass whose
    // kernels never ran (also at the start of every batch).
    void abort_step() noexcept override;
    void activate() override;
    // No decode graphs: a part of a tensor split reads its partial sums in the middle of a step,
    // while the other parts' steps are enqueued (overlapping captures on one thread).
    void interleaved() override { use_graphs_ = false; }

    void embed(float *X) override;
    void linear(model::Tensor w, const float *X, float *Y, int64_t m) override;
    void linear_groups(model::Tensor w, uint32_t groups, const float *X, float *Y,
                       int64_t m) override;
    void rms_norm(const float *x, model::Tensor w, float *y, int64_t m, int64_t n) override;
    void hc_pre(const HcWeights &hc, const float *X, int64_t m, float *mix, float *x_in) override;
    void hc_post(const float *mix, const float *y, int64_t m, float *X) override;
    void hc_head(const float *X, float *out) override;
    void attention_core(uint32_t il, const AttentionInputs &in, int64_t m, float *O) override;
    void moe_routed(uint32_t il, const float *XN, const float *logits, int64_t m,
                    float *slot_out) override;
    void swiglu(float *G, const float *U, int64_t m, int64_t n, float clamp) override;
    void moe_sum(const float *slot_out, const float *shared, int64_t m, float *Y) override;
    void read(const float *x, size_t n, float *host) override;
    void write(const float *host, size_t n, float *x) override;
    // A one-token step runs a branch on its own stream with its own scratch (TokenScratch),
    // joined by the first operation after join_branch() (the attention core first enqueues its
    // compressors, which read the branch's products, on the branch). DS4_CUDA_BRANCHES=0 keeps
    // every operation on the main stream, for comparisons; a batch (prefill) does too.
    void begin_branch() override;
    void end_branch() override;
    void join_branch() override;

    std::shared_ptr<const BackendState> save() const override;
    void restore(const BackendState &state) override;
    // A rewind point: device copies of the ring and the compressor windows (the compressed rows
    // stay where they are; a later position only appends to them).
    std::shared_ptr<const BackendState> save_tail() const override;
    void rewind(const BackendState &tail) override;
    size_t kv_bytes() const override;
    // The state as the CPU backend's bytes (runtime/kv_cache_io.h): the device state copied to a
    // host KvCache and back, so that a checkpoint of either backend loads into the other.
    void write_state(std::ostream &out) const override;
    void read_state(std::istream &in, int64_t n_past) override;

    // The attention state of one layer (docs/MODEL.md 8.1), rows as f32 values (of their f16
    // rounding when the session rounds rows). How many rows are in use follows from the
    // position: n_past / ratio compressed rows, min(n_past, window) raw ones.
    struct LayerKv {
        cuda::DeviceBuffer raw;                  // ring: row of p at p % ring_rows_
        cuda::DeviceBuffer comp, idx;            // compressed rows (attention, indexer)
        cuda::DeviceBuffer comp_kv, comp_score;  // the compressor's window
        cuda::DeviceBuffer idx_kv, idx_score;    // the indexer compressor's window
        std::array<cuda::DeviceBuffer *, 7> buffers() {
            return {&raw, &comp, &idx, &comp_kv, &comp_score, &idx_kv, &idx_score};
        }
        std::array<const cuda::DeviceBuffer *, 7> buffers() const {
            return {&raw, &comp, &idx, &comp_kv, &comp_score, &idx_kv, &idx_score};
        }
    };

  private:
    // The ring rows of layer il's last min(n_past, sliding_window) positions to (or, to_ring,
    // from) `rows`, oldest first (a rewind point's copy of the window).
    void copy_window_rows(float *rows, uint32_t il, bool to_ring) const;
    // The int64 words of one token's step (begin_batch writes them): the position, the window
    // ring's slot and the visible raw rows, and per compression ratio (ratio_row_) the pooled
    // row's position and window phase, the index of the row the window completes (-1: none),
    // the compressed rows after the token, and the visible rows of a layer of that ratio.
    enum StepWord : size_t {
        kPos,
        kRingSlot,
        kPlainGather,  // {first, n_raw, 0, 0} (gather_rows_step's words)
        kPlainRows = kPlainGather + 4,
        kRatioBase
    };
    enum RatioWord : size_t {
        kCompPos,                         // p + 1 - ratio
        kPhase,                           // p % ratio
        kStoreIndex,                      // (p + 1) / ratio - 1 when (p + 1) % ratio == 0, else -1
        kCount,                           // (p + 1) / ratio
        kGatherAll,                       // {first, n_raw, count, 0}
        kGatherIndexed = kGatherAll + 4,  // {first, n_raw, min(count, top_k), count > top_k}
        kRowsAll = kGatherIndexed + 4,
        kRowsIndexed,
        kRatioWords
    };
    size_t step_words() const { return kRatioBase + ratio_row_.size() * kRatioWords; }
    const int64_t *word(int64_t t, size_t offset) const;
    const int64_t *ratio_word(int64_t t, uint32_t ratio, size_t offset) const;
    // During a replayed decode step an operation only adds itself to the step's hash; true then.
    bool replaying(uint64_t op, std::initializer_list<uint64_t> args);

    // y = W x for one row: the activation quantized as W's format needs, then the product.
    void matvec(const DeviceMatrix &w, const float *x, float *y);
    // Rows of n_ids experts (ids on the device): x one row for all, or one per slot.
    // x_quantized: the scratch already holds x in w's activation format (the previous product
    // quantized the same x); only float weights then read x.
    void experts_matvec(const DeviceMatrix &w, const int32_t *ids, int n_ids, const float *x,
                        bool x_per_slot, float *y, bool x_quantized = false);
    // The one-token Q8_K scratch (what quantize_q8_k fills).
    cuda::Q8_KActivation q8k_scratch() const;
    // Quantizes n values of x (several rows back to back: their blocks are the rows' blocks).
    cuda::Q8_KActivation quantize_q8_k(const float *x, int64_t n);
    // The same into the batch scratch (a chunk's rows).
    cuda::Q8_KActivation quantize_q8_k_batch(const float *x, int64_t n);
    // The router's parameters for layer il, its hash table read at token t of the batch (and,
    // routing several tokens at once, the ones after it).
    cuda::RouteDeviceParams route_params(uint32_t il, int64_t t) const;
    // moe_routed for a batch whose routed experts take Q8_K activations: the pairs grouped by
    // expert on the device, each expert's weights read once per tile of its pairs.
    void moe_routed_grouped(uint32_t il, const float *XN, const float *logits, int64_t m,
                            float *slot_out);
    // A routed tensor's product over the grouped pairs (IQ2_XXS, Q2_K or Q4_K weights).
    void grouped_product(const DeviceMatrix &w, const cuda::ExpertGroups &groups,
                         const cuda::Q8_KActivation &x, float *y);
    // Streaming (DeviceModel::expert_tier): the n expert ids at `ids` (device) copied to the
    // host, which waits for s_ (valid until the next call).
    std::span<const int32_t> read_ids(const int32_t *ids, int64_t n);
    // The layer's distinct experts among those n ids (increasing) acquired in the device tier;
    // with hit, as DeviceExpertTier::acquire's (s_ not yet waiting for the uploads).
    std::vector<uint32_t> acquire_selected(uint32_t il, const int32_t *ids, int64_t n,
                                           std::vector<uint8_t> *hit = nullptr);
    // One token's streamed pass, hits first: the selected experts acquired; where some hit and
    // some miss, the hits' experts run at once (routed_experts on early_ids_, into gate_early_,
    // up_early_ and the branch scratch, their outputs into slot_out) while the misses upload;
    // then s_ waits for the uploads, and late_ids_ holds what the pass's later launch takes (the
    // misses' ids, else all). DS4_CUDA_HITS_FIRST=0: one launch after the uploads, always.
    void acquire_hits_first(uint32_t il, const int32_t *ids, const float *x, const float *weights,
                            float *slot_out);
    // One token's routed experts on `ids` (K of them; a negative id leaves its slot out): gate
    // and up into gate_out and up_out, the SwiGLU with the route weights, down into slot_out.
    // x_quantized: the Q8_K scratch holds x already (the router's launch quantized it).
    void routed_experts(uint32_t il, const int32_t *ids, const float *x, bool x_quantized,
                        const float *weights, float *gate_out, float *up_out, float *slot_out);
    // The routed products of a batch's pairs in `groups` (gate and up of every token's input,
    // SwiGLU with the routing weights, down into slot_out), the resident path's whole batch or
    // one streamed round; `tokens` is the token count the profile charges (the round's share).
    void grouped_pairs(uint32_t il, const float *XN, const cuda::ExpertGroups &groups,
                       double tokens, float *slot_out);
    // moe_routed_grouped for streamed experts, given the pairs' ids read back: the chunk's
    // pairs in rounds of experts that fit the device tier (experts/expert_rounds.h), each
    // round's experts acquired, its pairs run through grouped_pairs, and released.
    void moe_routed_rounds(uint32_t il, const float *XN, std::span<const int32_t> ids, int64_t m,
                           float *slot_out);
    // Skipped where the scratch already holds x's n values (sc_->quantized says whose).
    void quantize_q8_0(const float *x, int64_t n);
    // One token's float product y = W x (m == 1), deferred: consecutive products of one x run
    // as one launch (matvec_float_many) when the next operation comes (every operation but a
    // joining product flushes them first), each output the bits of its own launch.
    void defer_float_product(const DeviceMatrix &d, const float *x, float *y);
    void flush_float_products();
    // A one-token moe_sum is deferred the same way, and formed by the hc_post that reads it in
    // its own launch (hc_post_slots); any other operation launches it first.
    void flush_moe_sum();
    // An operation writes y[0..n): the scratch no longer holds its input's values if y overlaps.
    void forget_quantization_if_written(const float *y, size_t n);
    // A batch's m rows of `width` values, into the batch scratch (rows of whole Q8_0 blocks).
    void quantize_q8_0_batch(const float *X, int64_t m, int64_t width);
    // A pooled compressor row: push, and when the window completes, pool, norm, rotate, round
    // and append. Returns whether a row was appended.
    void compress(uint32_t il, bool indexer, const float *kv, const float *score, int64_t t);
    // The same for the m tokens of a batch (m rows of kv and score): their pushes in order in
    // one launch, then the rows of the windows they complete in one more.
    void compress_batch(uint32_t il, bool indexer, const float *kv, const float *score, int64_t m);
    // What a compressed row's chain has whatever its source: norm, rotation, rounding, table.
    cuda::RowFinish compressed_row(uint32_t il, bool indexer);
    const double *freqs(uint32_t il) const;
    // attention_core's steps: the batch's query heads and KV rows (norm, rotation, rounding,
    // ring store); the batch's compressors; the indexer's selection of tokens t0..t0+n-1 and their
    // attention over their visible rows (gather, scores, mix, inverse rotation), the gather and
    // row-count words at those offsets of each token's StepWords.
    void finish_q_kv(uint32_t il, const AttentionInputs &in, int64_t m);
    void compress_tokens(uint32_t il, const AttentionInputs &in, int64_t m);
    void select_rows(uint32_t il, const AttentionInputs &in, int64_t t0, int64_t n);
    void attend(uint32_t il, const float *Q, int64_t t0, int64_t n, size_t gather_word,
                size_t rows_word, float *O);
    // A profile scope (op_profile.h) named after w's role and format, reading its bytes m times.
    ProfileScope weight_scope(const char *op, model::Tensor w, double m);
    // The main stream waits for the side stream's pending work (hc_pre's Sinkhorn passes).
    void join_side_stream();
    // The main stream waits for a joined branch's work (join_branch), once.
    void settle_branch();
    // Whether begin_branch runs a branch on its own stream (a one-token step).
    bool branches() const;
    // Operations go to the branch's stream and scratch, or the main line's.
    void use_stream(bool branch);
    // Back to the main line, branch_end_ marking the branch's work so far.
    void leave_branch_stream();
    // Whether DS4_CUDA_SKIP names the operation (or, for a product, its weight's role: the
    // tensor name without its layer and suffix, e.g. attn_q_b), in a one-token step.
    bool skipped(const std::string &name) const;
    std::set<std::string> skip_;
    // Adds an operation and its arguments to the step's hash.
    void hash_op(uint64_t op, std::initializer_list<uint64_t> args);

    // Keeps the session's device current while the members below are freed (declared first,
    // destroyed last), then puts back the caller's.
    cuda::DeviceRestore on_device_;
    const DeviceModel &m_;
    const model::HParams &hp_;
    const uint32_t ctx_, max_batch_;
    const bool f16_;
    const ForwardOptions opts_;
    const LayerRange layers_;  // the layers whose attention state this session holds
    const int device_;         // the CUDA device of its weights, where it runs
    // s_: the stream operations enqueue on: main_, or branch_ between begin_branch() and
    // end_branch() (branch_start_ and branch_end_ order the two).
    cudaStream_t s_ = nullptr, main_ = nullptr, branch_ = nullptr;
    cudaEvent_t branch_start_ = nullptr, branch_end_ = nullptr;
    bool use_branches_ = true, in_branch_ = false, branch_open_ = false, join_pending_ = false;
    // A decode step forks hc_pre's Sinkhorn passes onto side_ (mix_ready_: the mixer outputs are
    // written; comb_ready_: comb is) and hc_post joins it back; DS4_CUDA_SIDE_STREAM=0 keeps
    // them on s_, for comparisons.
    cudaStream_t side_ = nullptr;
    cudaEvent_t mix_ready_ = nullptr, comb_ready_ = nullptr;
    bool use_side_stream_ = true, comb_pending_ = false;
    int64_t n_past_ = 0, batch_ = 0;
    // Whose values the one-token Q8_0 scratch (xq, xd) holds: set by the quantization (or by
    // rms_norm, which quantizes its output in the same launch), kept across linear operations
    // on that input (attention q_a and kv, the shared expert's gate and up), begin_branch,
    // linear_groups and moe_routed (these write only their outputs, which clear it where they
    // overlap), and cleared by every other operation; also set by the SwiGLUs and the
    // attention's last rotation of O, which quantize their outputs in the same launch.
    struct QuantizedInput {
        const float *x = nullptr;
        int64_t n = 0;
    };
    // One token's scratch: Q8_0 and Q8_K activations, the float products' split sums and
    // arrival counters, and which input the Q8_0 activations hold. scratch_[0] is the main
    // line's, scratch_[1] a branch's; sc_ is that of the stream s_.
    struct TokenScratch {
        cuda::DeviceBuffer xq, xd, q8k_q, q8k_d, q8k_bsums, floats, floats_many;
        QuantizedInput quantized;
    };
    std::array<TokenScratch, 2> scratch_;
    TokenScratch *sc_ = &scratch_[0];
    std::vector<LayerKv> kv_;
    int64_t ring_rows_ = 0;     // rows of each layer's raw ring: the window, plus max_batch
    int64_t attend_batch_ = 1;  // tokens attend() takes at once

    cuda::DeviceBuffer arena_;  // the batch's buffers, bump-allocated (floats)
    size_t capacity_ = 0, top_ = 0;
    cuda::DeviceBuffer tokens_;  // int32 [max_batch]
    // Pinned host staging of the batch's tokens and positions: a captured copy reads it when the
    // graph runs.
    int32_t *tokens_host_ = nullptr;
    // Pinned staging of the token states handed to a later stage (write()), and its size.
    float *handed_host_ = nullptr;
    size_t handed_floats_ = 0;
    int64_t *positions_host_ = nullptr;
    DecodeGraph graph_;
    // Streamed: the segments of a decode step (see the top), the one being captured or replayed,
    // and whether a tier pass waits for its release (after its kernels' segment is launched).
    std::vector<std::unique_ptr<DecodeGraph>> segments_;
    size_t segment_ = 0;
    bool pass_pending_ = false;
    DecodeGraph &graph() { return segments_.empty() ? graph_ : *segments_[segment_]; }
    bool graphs_ready() const;
    bool capturing() const {
        return segments_.empty() ? graph_.capturing() : segments_[segment_]->capturing();
    }
    // At a streamed layer's router: the segment so far is launched (its capture ended, or its
    // graph replayed) and the last pass released; the next segment starts after the tier's work.
    void end_segment();
    void begin_segment();
    void release_pending_pass();
    void drop_pending_pass() noexcept;
    OpProfile profile_;
    bool use_graphs_ = true, replay_ = false;
    uint64_t step_hash_ = 0;
    cuda::DeviceBuffer positions_;                 // int64 [max_batch][step_words()]
    std::map<uint32_t, size_t> ratio_row_;         // compression ratio -> its index in StepWords
    cuda::DeviceBuffer freqs_plain_, freqs_yarn_;  // double [n_rot / 2]
    cuda::DeviceBuffer zero_id_;    // int32 0: a dense product through an expert kernel
    cuda::DeviceBuffer group_ids_;  // int32 0..n_out_group-1: a grouped product as experts
    // The deferred float products of one input (defer_float_product) and MoE sum (flush_moe_sum);
    // DS4_CUDA_DEFER=0 runs each at once, for comparisons.
    std::vector<cuda::FloatProduct> pending_;
    const float *pending_x_ = nullptr;
    bool defer_ = true;
    struct PendingSum {
        const float *slots = nullptr, *shared = nullptr;
        float *y = nullptr;
    } pending_sum_;
    cuda::DeviceBuffer xq_batch_, xd_batch_;
    cuda::DeviceBuffer flat_, mixes_, head_w_;
    cuda::DeviceBuffer rows_, scores_, idx_scores_, selected_, topk_scratch_;
    cuda::DeviceBuffer expert_ids_, expert_w_, gate_, up_;
    // Streamed: a hits-first pass's two sets of ids and the first launch's products.
    cuda::DeviceBuffer early_ids_, late_ids_, gate_early_, up_early_;
    bool hits_first_ = true;
    // scratch of a batch's operations (prefill): the HC mixers' inputs and outputs, the float
    // products' split sums, the Q8_K activations of every token (or pair), the grouping of the
    // routed pairs by expert
    cuda::DeviceBuffer flat_batch_, mixes_batch_, float_batch_counters_, float_batch_partial_;
    cuda::FloatMatmulScratch float_batch_scratch_;
    cuda::DeviceBuffer q8k_batch_q_, q8k_batch_d_, q8k_batch_bsums_;
    cuda::DeviceBuffer expert_offsets_, expert_order_, pooled_;
    // Streaming: the selected ids read back (pinned), and the rounds' groupings of a chunk on
    // their way to the device (pinned) and there.
    int32_t *ids_host_ = nullptr, *rounds_host_ = nullptr;
    cuda::DeviceBuffer rounds_;
    size_t rounds_ints_ = 0;
};

}  // namespace ds4::runtime::cuda_backend
