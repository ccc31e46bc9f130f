#pragma once
// A reader for tests that misbehaves once, on purpose: the Nth raw read (counted from 1 over the
// reader's life) fails with an errno, returns half its bytes and then end of file (a truncated
// file), or returns half its bytes once (a short read the base class must continue). Every other
// read is a plain pread done inline, so a test is deterministic.
#include <cerrno>
#include <cstdint>
#include <memory>

#include "experts/expert_reader.h"

namespace ds4::experts {

enum class Fault {
    None,
    ReadError,     // the read fails with FaultPlan::error
    ShortThenEof,  // half the bytes, then end of file for the rest of that read
    ShortOnce,     // half the bytes; the continuation reads the rest normally
};

struct FaultPlan {
    Fault fault = Fault::None;
    uint64_t nth = 1;  // which raw read misbehaves
    int error = EIO;
};

class FaultReader : public ExpertReader {
  public:
    FaultReader(int fd, FaultPlan plan);
    ~FaultReader() override;
    const char *name() const override { return "fault injection"; }
    uint64_t raw_reads() const { return raw_reads_; }
    bool fired() const { return fired_; }

  protected:
    void start(uint64_t ticket, uint64_t offset, uint64_t length, uint8_t *dst) override;

  private:
    const FaultPlan plan_;
    uint64_t raw_reads_ = 0;
    bool fired_ = false;
    uint64_t eof_ticket_ = 0;  // ShortThenEof: the ticket that now sees end of file
};

}  // namespace ds4::experts
