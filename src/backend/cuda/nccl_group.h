#pragma once
// Several GPUs of one process joined by NCCL, the collective library of the CUDA ecosystem: one
// communicator per device (ncclCommInitAll), and the one collective the split model needs, a
// sum of every GPU's buffer into every GPU's buffer (docs/MULTI_GPU.md). Built as its own
// library (ds4nccl) so that the single-GPU binaries do not need libnccl at run time.
//
// NVLink multicast (NVLS) is never used: when NCCL_NVLS_ENABLE is unset it is set to 0 before
// the first communicator is made (a program using multicast can take a shared host's GPUs out of
// service; a value the caller set is kept). That setenv changes the process's environment: make
// groups before starting threads that read it, and before anything else initialises NCCL.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ds4::cuda {

class NcclGroup {
  public:
    // Communicators for these CUDA devices (ranks in this order). Throws ds4::Error naming the
    // NCCL call and its message, or naming a device that does not exist or is listed twice.
    explicit NcclGroup(std::vector<int> devices);
    ~NcclGroup();
    NcclGroup(const NcclGroup &) = delete;
    NcclGroup &operator=(const NcclGroup &) = delete;

    size_t size() const { return devices_.size(); }
    int device(size_t rank) const { return devices_.at(rank); }

    // buffers[r] (count floats on device(r)) becomes the sum over ranks of every buffers[r], on
    // streams[r]; returns once enqueued. One rank: the buffer is left as it is.
    void all_reduce_sum(const std::vector<float *> &buffers, size_t count,
                        const std::vector<cudaStream_t> &streams);

    // "2.27.7": the NCCL library this process runs with.
    static std::string library_version();

  private:
    std::vector<int> devices_;
    std::vector<void *> comms_;  // ncclComm_t, kept opaque here
};

}  // namespace ds4::cuda
