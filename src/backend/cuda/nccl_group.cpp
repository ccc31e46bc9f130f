#include "backend/cuda/nccl_group.h"

#include <fmt/format.h>
#include <nccl.h>

#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

void check_nccl(ncclResult_t r, const char *call) {
    if (r != ncclSuccess)
        throw Error(fmt::format("NCCL: {} failed: {}", call, ncclGetErrorString(r)));
}

ncclComm_t comm(void *c) {
    return static_cast<ncclComm_t>(c);
}

}  // namespace

NcclGroup::NcclGroup(std::vector<int> devices) : devices_(std::move(devices)) {
    if (devices_.empty()) throw Error("NCCL: a group needs at least one device");
    int n = 0;
    DS4_CUDA_CHECK(cudaGetDeviceCount(&n));
    for (size_t i = 0; i < devices_.size(); ++i) {
        const int d = devices_[i];
        if (d < 0 || d >= n)
            throw Error(fmt::format("NCCL: CUDA device {} does not exist ({} found)", d, n));
        for (size_t j = 0; j < i; ++j)
            if (devices_[j] == d)
                throw Error(fmt::format("NCCL: CUDA device {} is in the group twice", d));
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // 0: keep a value the caller set
    std::vector<ncclComm_t> comms(devices_.size());
    check_nccl(ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), devices_.data()),
               "ncclCommInitAll");
    for (ncclComm_t c : comms) comms_.push_back(c);
}

NcclGroup::~NcclGroup() {
    for (void *c : comms_) ncclCommDestroy(comm(c));
}

void NcclGroup::all_reduce_sum(const std::vector<float *> &buffers, size_t count,
                               const std::vector<cudaStream_t> &streams) {
    if (buffers.size() != size() || streams.size() != size())
        throw Error(fmt::format("NCCL: all_reduce_sum over {} ranks got {} buffers and {} streams",
                                size(), buffers.size(), streams.size()));
    // One process drives every rank: the calls are grouped so that none waits for the others.
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (size_t r = 0; r < size(); ++r) {
        const ncclResult_t res = ncclAllReduce(buffers[r], buffers[r], count, ncclFloat, ncclSum,
                                               comm(comms_[r]), streams[r]);
        if (res != ncclSuccess) {
            ncclGroupEnd();
            check_nccl(res, "ncclAllReduce");
        }
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

std::string NcclGroup::library_version() {
    int v = 0;
    check_nccl(ncclGetVersion(&v), "ncclGetVersion");
    // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on
    return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

}  // namespace ds4::cuda
