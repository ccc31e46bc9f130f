#pragma once
// A decode step as one CUDA graph: the operations of the first one-token step are captured from
// the session's stream, and every later step replays that graph with one launch, so the GPU is
// not left waiting between the ~80 kernels of each layer for the host to launch the next.
//
// Replay is exact because a decode step's work does not depend on its position: the kernels
// read the position and what follows from it (ring slot, row counts, whether a window completes
// or the indexer selects) from device words that the host writes into pinned memory before each
// launch, and a captured copy moves to the device (runtime/cuda/cuda_ops.h, StepWords). The
// operations of a replayed step only check that the step is the captured one (a hash of every
// operation and its buffers): a difference is an internal error, never a silent wrong answer.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::runtime::cuda_backend {

class DecodeGraph {
  public:
    DecodeGraph() = default;
    DecodeGraph(const DecodeGraph &) = delete;
    DecodeGraph &operator=(const DecodeGraph &) = delete;
    ~DecodeGraph();

    bool ready() const { return exec_ != nullptr; }
    bool capturing() const { return capturing_; }
    // Starts capturing the work enqueued on `stream`.
    void begin_capture(cudaStream_t stream);
    // Ends the capture, keeps the graph with the step's hash, and runs it.
    void end_capture_and_launch(cudaStream_t stream, uint64_t step_hash);
    // Runs the kept graph; throws when `step_hash` is not the captured step's.
    void launch(cudaStream_t stream, uint64_t step_hash);
    // Drops a capture left open by an exception.
    void abort(cudaStream_t stream);
    // The captured step's node count (kernels and copies; 0 before a capture), its edges, and
    // how many of those are programmatic (a kernel launched with PDL after a kernel: the
    // dependent may be scheduled before its predecessor ends; launch.cuh).
    size_t nodes() const { return nodes_; }
    size_t edges() const { return edges_; }
    size_t programmatic_edges() const { return programmatic_edges_; }
    long replays() const { return replays_; }  // launches of the kept graph since its capture

  private:
    void count_edges(cudaGraph_t graph);

    cudaGraphExec_t exec_ = nullptr;
    uint64_t hash_ = 0;
    size_t nodes_ = 0, edges_ = 0, programmatic_edges_ = 0;
    long replays_ = 0;
    bool capturing_ = false;
};

}  // namespace ds4::runtime::cuda_backend
