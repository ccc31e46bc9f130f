#pragma once
// ds4-server's --trace FILE (docs/SERVER.md, Trace file): one JSON object per generation request,
// one per line (JSON Lines), appended to the file. Each record is written with a single write()
// of the whole line on a descriptor opened with O_APPEND, so the file grows by whole lines: a
// reader never sees a half record unless the process dies inside that one write (then a torn last
// line without its newline, which the next start cuts off: see the constructor). No fsync: the
// records survive a crash of the process, not of the machine.
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ds4::server {

// Every record starts with this (its first key), so a torn tail is recognisable.
inline constexpr std::string_view kTraceRecordStart = "{\"time\":\"";

class TraceFile {
  public:
    using Log = std::function<void(const std::string &)>;
    // Opens `path` for appending, creating it (mode 0644) when missing. A last line without its
    // newline that starts as a record does and is not whole JSON (a write cut short by a crash),
    // after a first line that starts as a record too, is cut off first; any other unterminated
    // last line is ended with a newline, so that records start on lines of their own; `log`
    // says so. A FIFO without a reader fails (it is opened without blocking). Throws ds4::Error
    // naming the path and the reason when the file cannot be opened (a missing directory, a
    // directory, no permission).
    TraceFile(const std::string &path, Log log);
    ~TraceFile();
    TraceFile(const TraceFile &) = delete;
    TraceFile &operator=(const TraceFile &) = delete;

    // Appends the record as one line. Never throws: a failed write is logged (once until a write
    // succeeds again) and what it wrote of the line taken back, and false returned.
    bool write(const nlohmann::ordered_json &record);

  private:
    void repair_tail();

    std::string path_;
    Log log_;
    int fd_ = -1;
    std::mutex mu_;
    bool failing_ = false;
};

}  // namespace ds4::server
