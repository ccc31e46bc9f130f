#pragma once
// The operations of the model order: what a backend implements so that runtime/forward.cpp,
// attention.cpp and moe.cpp state the order of DeepSeek V4 (docs/MODEL.md 4.8) once for every
// backend. Buffers are float arrays in the backend's memory (host memory on the CPU, device
// memory on CUDA): the model order passes them from one operation to the next and never reads
// them, so a backend may run each operation at once (the CPU) or enqueue it (CUDA).
//
// A batch is n tokens at consecutive positions; buffers hold n rows, row-major. One Ops object
// serves one session and owns that session's attention state (docs/MODEL.md 8.1).
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <span>

#include "common/error.h"
#include "model/weights.h"

namespace ds4::runtime {

// A backend's copy of a session's attention state (saved and restored by the session).
class BackendState {
  public:
    virtual ~BackendState() = default;
    // The bytes a serialised copy needs: the rows and compressor windows in use.
    virtual size_t payload_bytes() const = 0;
};

// One hyper-connection site: the mixer matrix, its 3 scales and its base (docs/MODEL.md 4.2).
struct HcWeights {
    model::Tensor fn, scale, base;
};

// The per-token inputs of a layer's attention core, each n rows: the projections of the batch.
// The core rotates and rounds q, idx_q and idx_w in place.
struct AttentionInputs {
    float *q = nullptr;         // n x n_head x head_dim, before the per-head norm and RoPE
    const float *kv = nullptr;  // n x head_dim, before its norm
    const float *comp_kv = nullptr, *comp_score = nullptr;  // n x width (compressed layers)
    const float *idx_kv = nullptr, *idx_score = nullptr;    // n x width (overlapped layers)
    // n x n_idx_head x idx_head_dim and n x n_idx_head (overlapped layers), or both null where
    // no token of the batch selects (each sees at most top_k compressed rows).
    float *idx_q = nullptr;
    float *idx_w = nullptr;
};

class Ops {
  public:
    virtual ~Ops() = default;

    // Positions the attention state can hold, and how many it holds.
    virtual uint32_t ctx() const = 0;
    virtual int64_t n_past() const = 0;
    // Whether one captured step of one token is replayed at every position (CUDA decode graphs):
    // the work a one-token step enqueues must then not depend on its position.
    virtual bool replays_steps() const { return false; }

    // Starts a batch of tokens at positions n_past().., releasing the previous batch's buffers.
    // Ids are validated by the caller.
    virtual void begin_batch(std::span<const int32_t> tokens) = 0;
    // n floats for the current batch; what they hold before an operation writes them is
    // unspecified (the model order writes every buffer before reading it).
    virtual float *buffer(size_t n) = 0;
    // Buffers taken after mark() are given back by release(mark): a sublayer's scratch.
    virtual size_t mark() const = 0;
    virtual void release(size_t mark) = 0;
    // The batch's positions are now in the attention state.
    virtual void end_batch() = 0;
    // A step threw: let go at once of what it holds that another session of the model may need
    // (a streamed pass's device slots, an open graph capture). Never throws.
    virtual void abort_step() noexcept {}
    // The operations that follow, up to another backend's, are this one's: a backend on one of
    // several devices makes its device current (the parts of a tensor split take turns within a
    // step; runtime/forward.cpp).
    virtual void activate() {}
    // The model order interleaves this backend's steps with other backends' (the parts of a
    // tensor split): a backend that would capture a step to replay it runs its operations as
    // they come instead.
    virtual void interleaved() {}

    // X (n x n_hc x n_embd): every stream of every token starts as its embedding.
    virtual void embed(float *X) = 0;
    // Y = X W^T over m rows (W: rows = ne[1], row length = ne[0]), activations rounded as the
    // weight's format requires.
    virtual void linear(model::Tensor w, const float *X, float *Y, int64_t m) = 0;
    // The grouped projection: W's rows split into `groups` equal blocks, block g applied to the
    // g-th slice of each input row (row length groups x ne[0]) into the g-th slice of Y's row.
    virtual void linear_groups(model::Tensor w, uint32_t groups, const float *X, float *Y,
                               int64_t m) = 0;
    // y = rms_norm(x) * w over m rows of n (w: an F32 vector, or null for none).
    virtual void rms_norm(const float *x, model::Tensor w, float *y, int64_t m, int64_t n) = 0;
    // Hyper-connections: the mixes of m token states X (each n_hc_mix floats: pre, post, comb)
    // and the sublayer inputs x_in = sum_h pre[h] X[h]; then X'[j] = post[j] y + sum_i C[i][j]
    // X[i]; and the output head's reduction of one token's streams (X: n_hc x n_embd) to n_embd.
    virtual void hc_pre(const HcWeights &hc, const float *X, int64_t m, float *mix,
                        float *x_in) = 0;
    virtual void hc_post(const float *mix, const float *y, int64_t m, float *X) = 0;
    virtual void hc_head(const float *X, float *out) = 0;
    // Per token, in position order: the KV rows appended (window, compressors, indexer), the
    // rows the token sees selected, attention over them. O: n x n_head x head_dim.
    virtual void attention_core(uint32_t il, const AttentionInputs &in, int64_t m, float *O) = 0;
    // The routed experts of layer il from the router logits (m x n_expert): each token's
    // selected experts' outputs, weighted, one slot each (m x n_expert_used x n_embd).
    virtual void moe_routed(uint32_t il, const float *XN, const float *logits, int64_t m,
                            float *slot_out) = 0;
    // G = silu(min(G, c)) * clamp(U, -c, c) in place, m rows of n (no clamp for c <= 1e-6).
    virtual void swiglu(float *G, const float *U, int64_t m, int64_t n, float clamp) = 0;
    // Y[t] = slot_out[t][0] + ... + slot_out[t][K-1] + shared[t], in selection order.
    virtual void moe_sum(const float *slot_out, const float *shared, int64_t m, float *Y) = 0;
    // Copies n floats of a buffer to host memory (waits for the work that writes them).
    virtual void read(const float *x, size_t n, float *host) = 0;
    // Copies n floats of host memory into a buffer of the current batch: the token states handed
    // over from the stage that ran the layers before this one's (runtime/layer_stages.h). The
    // host memory may be reused once write returns.
    virtual void write(const float *host, size_t n, float *x) = 0;

    // Independent work, stated by the model order (a backend may run it beside the main line;
    // the defaults run every operation in order, as the CPU does): the operations between
    // begin_branch() and end_branch() read only what was written before begin_branch() or by
    // the branch itself, and the operations after end_branch() neither read nor write what the
    // branch writes, nor write what it reads, until join_branch(). One branch at a time, ended
    // and joined within the sublayer that began it.
    virtual void begin_branch() {}
    virtual void end_branch() {}
    virtual void join_branch() {}

    virtual std::shared_ptr<const BackendState> save() const = 0;
    virtual void restore(const BackendState &state) = 0;
    // A rewind point (Session::rewind): the attention state but the compressed and indexer rows.
    // Those rows are only appended (row i is written once, by the position that completes its
    // window, from positions before it: docs/MODEL.md 8.1), so a later state of the same token
    // history still holds every row of the positions before the point, and rewind(point) gives
    // the state the point was taken in: the raw window and the compressors' windows restored,
    // n_past set back, the rows after its count left to be overwritten. The defaults copy the
    // whole state.
    virtual std::shared_ptr<const BackendState> save_tail() const { return save(); }
    virtual void rewind(const BackendState &tail) { restore(tail); }
    virtual size_t kv_bytes() const = 0;

    // The attention state as bytes (Session::write_state, the server's disk KV cache), and back.
    // read_state validates every count and shape against this session (a state saved with a
    // smaller ctx fits) and that it holds exactly n_past positions, and throws ds4::Error on any
    // mismatch or short read, leaving the state as it was. The format is the backend's own; the
    // defaults throw, so a backend without them serves without disk checkpoints.
    virtual void write_state(std::ostream &) const {
        throw Error("saving a session's state to bytes is not supported by this backend");
    }
    virtual void read_state(std::istream &, int64_t /*n_past*/) {
        throw Error("loading a session's state from bytes is not supported by this backend");
    }
};

}  // namespace ds4::runtime
