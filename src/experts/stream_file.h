#pragma once
// The model file opened a second time, for the streaming reads: with O_DIRECT when the file
// system allows it, so the page cache neither hides the disk's speed nor holds a second copy of
// the experts; else buffered, with a notice that says so.
#include <cstdint>
#include <string>

namespace ds4::experts {

// O_DIRECT offsets, lengths and buffers are multiples of this. 4096 is a multiple of every
// logical block size in common use (512, 4096).
constexpr uint64_t kDirectAlign = 4096;

class StreamFile {
  public:
    // Throws ds4::Error naming the path when the file cannot be opened at all.
    StreamFile(const std::string &path, bool want_direct);
    ~StreamFile();
    StreamFile(const StreamFile &) = delete;
    StreamFile &operator=(const StreamFile &) = delete;

    int fd() const { return fd_; }
    bool direct() const { return direct_; }
    uint64_t size() const;  // the size now (fstat), to notice a truncation before reading
    const std::string &path() const { return path_; }
    const std::string &notice() const { return notice_; }  // why O_DIRECT is off, or ""
    // Whether the file's size or modification time differ from when it was opened: bytes
    // written into it in place (a file replaced by a rename keeps the opened inode and its bytes).
    bool changed() const;

  private:
    struct Stamp {
        uint64_t size = 0;
        int64_t mtime_s = 0, mtime_ns = 0;
        bool operator!=(const Stamp &o) const {
            return size != o.size || mtime_s != o.mtime_s || mtime_ns != o.mtime_ns;
        }
    };
    Stamp stamp() const;

    std::string path_;
    Stamp opened_;
    int fd_ = -1;
    bool direct_ = false;
    std::string notice_;
};

}  // namespace ds4::experts
