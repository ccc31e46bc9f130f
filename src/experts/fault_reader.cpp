#include "experts/fault_reader.h"

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>

#include "experts/stream_file.h"

namespace ds4::experts {

FaultReader::FaultReader(int fd, FaultPlan plan) : ExpertReader(fd, 1u << 20), plan_(plan) {}

FaultReader::~FaultReader() {
    drain();
}

void FaultReader::start(uint64_t ticket, uint64_t offset, uint64_t length, uint8_t *dst) {
    // Reads complete inline, each in its caller's thread; the counters need no lock as long as
    // one thread submits, which is how the streaming source uses a reader.
    ++raw_reads_;
    if (eof_ticket_ != 0 && ticket == eof_ticket_) {
        complete(ticket, 0);
        return;
    }
    uint64_t n = length;
    if (plan_.fault != Fault::None && raw_reads_ == plan_.nth) {
        fired_ = true;
        if (plan_.fault == Fault::ReadError) {
            complete(ticket, -static_cast<int64_t>(plan_.error));
            return;
        }
        // Half, rounded down to a block when that leaves something, so that an O_DIRECT
        // continuation stays aligned.
        n = length / 2 >= kDirectAlign ? length / 2 / kDirectAlign * kDirectAlign
                                       : std::max<uint64_t>(length / 2, 1);
        if (plan_.fault == Fault::ShortThenEof) eof_ticket_ = ticket;
    }
    const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
    complete(ticket, got >= 0 ? static_cast<int64_t>(got) : -static_cast<int64_t>(errno));
}

}  // namespace ds4::experts
