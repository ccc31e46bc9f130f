#include "server/kv_disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <istream>
#include <ostream>
#include <streambuf>
#include <thread>

#include "common/error.h"

namespace ds4::server {
namespace {

constexpr size_t kIoChunk = size_t(1) << 20;

uint64_t fnv1a(const void *data, size_t n, uint64_t h = 1469598103934665603ull) {
    const auto *p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

std::string errno_text() {
    return std::strerror(errno);
}

bool is_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

double mib(uint64_t b) {
    return double(b) / 1048576.0;
}

// Reads exactly n bytes at `off`; false at a short file.
// A failed read (EIO, EMFILE, ...) says nothing about the file: it is kept, not rejected.
struct ReadError : Error {
    using Error::Error;
};

bool pread_all(int fd, void *buf, size_t n, uint64_t off) {
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        const ssize_t r = ::pread(fd, p, n, off_t(off));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw ReadError("read failed: " + errno_text());
        if (r == 0) return false;
        p += r;
        n -= size_t(r);
        off += uint64_t(r);
    }
    return true;
}

void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) throw Error("write failed: " + errno_text());
        p += w;
        n -= size_t(w);
    }
}

// An ostream's buffer over a file descriptor, writing in 1 MiB pieces, that checksums every
// byte from `crc_from` on and can stop dead after `pause_after` bytes (the crash test).
class FdWriter final : public std::streambuf {
  public:
    FdWriter(int fd, uint64_t crc_from, uint64_t pause_after, std::function<void()> on_pause)
        : fd_(fd), crc_from_(crc_from), pause_after_(pause_after), on_pause_(std::move(on_pause)) {
        buf_.resize(kIoChunk);
        setp(buf_.data(), buf_.data() + buf_.size());
    }
    // Writes what is buffered; throws ds4::Error on a failed write.
    void flush_all() {
        const char *p = pbase();
        size_t n = size_t(pptr() - pbase());
        while (n > 0) {
            size_t take = n;
            if (pause_after_ && written_ < pause_after_)
                take = std::min<uint64_t>(n, pause_after_ - written_);
            // Bytes before crc_from are the header's, which has its own checksum.
            for (size_t i = 0; i < take; ++i)
                if (written_ + i >= crc_from_) {
                    crc_ = crc32c(p + i, take - i, crc_);
                    break;
                }
            write_all(fd_, p, take);
            written_ += take;
            p += take;
            n -= take;
            if (pause_after_ && written_ == pause_after_) {
                ::fsync(fd_);
                on_pause_();
                for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
            }
        }
        setp(buf_.data(), buf_.data() + buf_.size());
    }
    uint64_t written() const { return written_ + uint64_t(pptr() - pbase()); }
    uint32_t crc() const { return crc_; }
    const std::string &error() const { return error_; }

  protected:
    int_type overflow(int_type ch) override {
        if (!flush_ok()) return traits_type::eof();
        if (!traits_type::eq_int_type(ch, traits_type::eof())) {
            *pptr() = traits_type::to_char_type(ch);
            pbump(1);
        }
        return traits_type::not_eof(ch);
    }
    std::streamsize xsputn(const char *s, std::streamsize n) override {
        std::streamsize done = 0;
        while (done < n) {
            if (pptr() == epptr() && !flush_ok()) return done;
            const std::streamsize room = epptr() - pptr();
            const std::streamsize k = std::min(room, n - done);
            std::memcpy(pptr(), s + done, size_t(k));
            pbump(int(k));
            done += k;
        }
        return done;
    }
    int sync() override { return flush_ok() ? 0 : -1; }

  private:
    bool flush_ok() {
        try {
            flush_all();
            return true;
        } catch (const Error &e) {
            error_ = e.what();
            return false;
        }
    }
    int fd_;
    uint64_t crc_from_, pause_after_, written_ = 0;
    uint32_t crc_ = 0;
    std::function<void()> on_pause_;
    std::vector<char> buf_;
    std::string error_;
};

// An istream's buffer over bytes [off, off + len) of a file descriptor.
class FdReader final : public std::streambuf {
  public:
    FdReader(int fd, uint64_t off, uint64_t len) : fd_(fd), pos_(off), end_(off + len) {
        buf_.resize(kIoChunk);
        setg(buf_.data(), buf_.data(), buf_.data());
    }
    bool at_end() const { return pos_ == end_ && gptr() == egptr(); }
    // A read that failed (the stream then ended early): the reason, empty when none did.
    const std::string &read_error() const { return read_error_; }

  protected:
    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        if (pos_ >= end_) return traits_type::eof();
        const size_t n = size_t(std::min<uint64_t>(buf_.size(), end_ - pos_));
        try {
            if (!pread_all(fd_, buf_.data(), n, pos_)) return traits_type::eof();
        } catch (const Error &e) {
            read_error_ = e.what();
            return traits_type::eof();
        }
        pos_ += n;
        setg(buf_.data(), buf_.data(), buf_.data() + n);
        return traits_type::to_int_type(*gptr());
    }

  private:
    int fd_;
    uint64_t pos_, end_;
    std::vector<char> buf_;
    std::string read_error_;
};

struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// Header and tokens of an open checkpoint, checked against this server's model and ctx and the
// file's size. Throws ds4::Error with the reason to reject it.
KvCheckpoint read_head(int fd, uint64_t model_id, uint32_t ctx, uint64_t *file_bytes) {
    uint8_t head[kKvHeaderBytes];
    if (!pread_all(fd, head, sizeof head, 0)) throw Error("shorter than its header");
    KvCheckpoint c;
    c.header = decode_kv_header(head);
    if (c.header.model_id != model_id)
        throw Error("written for another model (another file, weights or quantization)");
    if (c.header.ctx > ctx)
        throw Error(fmt::format("saved with a context of {} tokens, larger than --ctx {}",
                                c.header.ctx, ctx));
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw ReadError("fstat failed: " + errno_text());
    const uint64_t want = kv_file_bytes(c.header);
    if (uint64_t(st.st_size) != want)
        throw Error(fmt::format("{} bytes, its header says {} (truncated or extended)",
                                uint64_t(st.st_size), want));
    c.tokens.resize(c.header.n_tokens);
    if (!pread_all(fd, c.tokens.data(), c.tokens.size() * sizeof(int32_t), kKvHeaderBytes))
        throw Error("truncated in its tokens");
    for (size_t i = 0; i < c.tokens.size(); ++i)
        if (c.tokens[i] < 0) throw Error(fmt::format("token {} is {}", i, c.tokens[i]));
    *file_bytes = want;
    return c;
}

// The checksum over the tokens and the payload against the trailer.
void verify_body(int fd, const KvHeader &h) {
    const uint64_t total = kv_file_bytes(h);
    std::vector<char> buf(kIoChunk);
    uint32_t crc = 0;
    for (uint64_t off = kKvHeaderBytes; off < total - 4;) {
        const size_t n = size_t(std::min<uint64_t>(buf.size(), total - 4 - off));
        if (!pread_all(fd, buf.data(), n, off)) throw Error("truncated");
        crc = crc32c(buf.data(), n, crc);
        off += n;
    }
    uint32_t stored = 0;
    if (!pread_all(fd, &stored, 4, total - 4)) throw Error("truncated");
    if (stored != crc) throw Error("the checksum of the tokens and the payload does not match");
}

// "<name>.tmp.<pid>.<seq>": the pid of the writer, or 0 when the name is not of that form.
pid_t temp_writer(const std::string &name) {
    const size_t at = name.find(".tmp.");
    if (at == std::string::npos) return 0;
    const size_t from = at + 5, dot = name.find('.', from);
    const std::string digits = name.substr(from, dot == std::string::npos ? dot : dot - from);
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return 0;
    return pid_t(std::stol(digits));
}

}  // namespace

uint64_t model_identity(const gguf::File &file, std::string_view config) {
    uint64_t h = fnv1a(file.base(), size_t(std::min(file.data_offset(), file.file_size())));
    for (const gguf::TensorInfo &t : file.tensors()) {
        if (t.name.find("_exps") != std::string::npos || t.data == nullptr) continue;
        h = fnv1a(t.data, size_t(std::min<uint64_t>(t.n_bytes, 4096)), h);
    }
    return fnv1a(config.data(), config.size(), h);
}

KvDiskCache::KvDiskCache(KvDiskOptions opts, uint64_t model_id, uint32_t ctx, Log log)
    : opts_(std::move(opts)), model_id_(model_id), ctx_(ctx), log_(std::move(log)) {
    if (opts_.dir.empty()) throw Error("the disk KV cache needs a directory");
    while (opts_.dir.size() > 1 && opts_.dir.back() == '/') opts_.dir.pop_back();
    // mkdir -p, the last one private to this user.
    const std::filesystem::path dir(opts_.dir);
    std::error_code ec;
    if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
    if (::mkdir(opts_.dir.c_str(), 0700) != 0 && errno != EEXIST)
        throw Error(fmt::format("cannot create {}: {}", opts_.dir, errno_text()));
    dir_fd_ = ::open(opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd_ < 0) throw Error(fmt::format("cannot open {}: {}", opts_.dir, errno_text()));
    if (::access(opts_.dir.c_str(), W_OK | X_OK) != 0)
        throw Error(fmt::format("{} is not writable: {}", opts_.dir, errno_text()));
    if (const char *p = std::getenv("DS4_KV_DISK_TEST_PAUSE_AFTER_BYTES"))
        pause_after_bytes_ = std::strtoull(p, nullptr, 10);
    index();
}

KvDiskCache::~KvDiskCache() {
    if (dir_fd_ >= 0) ::close(dir_fd_);
}

void KvDiskCache::index() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto &de : std::filesystem::directory_iterator(opts_.dir, ec))
        if (de.is_regular_file(ec)) names.push_back(de.path().filename().string());
    std::sort(names.begin(), names.end());
    std::lock_guard lock(mu_);
    for (const std::string &name : names) {
        if (const pid_t pid = temp_writer(name)) {
            // A temp file is a write that never reached its rename: remove it once its writer
            // is gone (a crash, kill -9). A live writer's is left alone.
            // This process has written nothing yet, so a temp file with its pid is a previous
            // process's (in a container the server is often pid 1 every time).
            if (pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH)) {
                ::unlink(path(name).c_str());
                log_(fmt::format("removed the unfinished write {} (its writer, pid {}, is gone)",
                                 name, pid));
            }
            continue;
        }
        if (!name.ends_with(".kv")) continue;  // not ours: left alone
        Fd f(::open(path(name).c_str(), O_RDONLY | O_CLOEXEC));
        if (f.fd < 0) continue;
        try {
            uint64_t bytes = 0;
            KvCheckpoint c = read_head(f.fd, model_id_, ctx_, &bytes);
            struct stat st {};
            ::fstat(f.fd, &st);
            entries_.push_back({name, std::move(c.tokens), bytes,
                                int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
        } catch (const ReadError &e) {
            log_(fmt::format("skipped {}: {} (kept)", name, e.what()));
        } catch (const Error &e) {
            reject_locked(name, e.what());
        }
    }
    uint64_t total = 0;
    for (const Entry &e : entries_) total += e.bytes;
    log_(fmt::format("{}: {} checkpoint{}, {:.1f} MiB of a {:.1f} MiB budget", opts_.dir,
                     entries_.size(), entries_.size() == 1 ? "" : "s", mib(total),
                     mib(opts_.budget_bytes)));
    evict_locked("");
}

void KvDiskCache::reject_locked(const std::string &name, const std::string &why) {
    ::unlink(path(name).c_str());
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [&](const Entry &e) { return e.name == name; }),
                   entries_.end());
    log_(fmt::format("rejected {}: {} (deleted)", name, why));
}

void KvDiskCache::evict_locked(const std::string &keep) {
    uint64_t total = 0;
    for (const Entry &e : entries_) total += e.bytes;
    while (total > opts_.budget_bytes && !entries_.empty()) {
        // The least recently used, never the file just written (store refuses one that alone is
        // over the budget).
        auto victim = entries_.end();
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
            if (it->name == keep && entries_.size() > 1) continue;
            if (victim == entries_.end() || it->last_used < victim->last_used) victim = it;
        }
        ::unlink(path(victim->name).c_str());
        log_(fmt::format("evicted {} ({} tokens, {:.2f} MiB) to stay under {:.1f} MiB",
                         victim->name, victim->tokens.size(), mib(victim->bytes),
                         mib(opts_.budget_bytes)));
        total -= victim->bytes;
        entries_.erase(victim);
    }
}

void KvDiskCache::touch_locked(Entry &e) {
    e.last_used = now_ns();
    ::utimensat(dir_fd_, e.name.c_str(), nullptr, 0);  // now: the order survives a restart
}

std::vector<KvDiskCache::SavePoint> KvDiskCache::save_points(size_t cached, size_t len) const {
    std::vector<SavePoint> out;
    const size_t align = opts_.boundary_align_tokens, min = opts_.min_tokens;
    if (opts_.continued_interval_tokens > 0) {
        const size_t step = align ? (opts_.continued_interval_tokens + align - 1) / align * align
                                  : opts_.continued_interval_tokens;
        for (size_t at = (cached / step + 1) * step; at <= len; at += step)
            if (at >= min) out.push_back({at, KvSaveReason::KV_SAVE_CONTINUED});
    }
    if (cached == 0 && opts_.cold_max_tokens > 0 && len >= min && len <= opts_.cold_max_tokens) {
        // The prompt's last tokens (a chat template's tail, which the next turn usually
        // changes) are left out, then the point is aligned down; the whole prompt when that
        // falls below the minimum.
        const size_t trim = opts_.boundary_trim_tokens, kept = len > trim ? len - trim : 0;
        size_t at = align ? kept / align * align : kept;
        if (at < min) at = len;
        auto same =
            std::find_if(out.begin(), out.end(), [&](const SavePoint &p) { return p.at == at; });
        if (same != out.end())
            same->reason = KvSaveReason::KV_SAVE_COLD;
        else
            out.push_back({at, KvSaveReason::KV_SAVE_COLD});
    }
    std::sort(out.begin(), out.end(),
              [](const SavePoint &a, const SavePoint &b) { return a.at < b.at; });
    return out;
}

bool KvDiskCache::continued_point(size_t n) const {
    const size_t align = opts_.boundary_align_tokens;
    if (opts_.continued_interval_tokens == 0 || n < opts_.min_tokens) return false;
    const size_t step = align ? (opts_.continued_interval_tokens + align - 1) / align * align
                              : opts_.continued_interval_tokens;
    return n % step == 0;
}

KvDiskCache::Loaded KvDiskCache::load(std::span<const int32_t> prompt, size_t longer_than,
                                      runtime::Session &session) {
    using clock = std::chrono::steady_clock;
    struct Candidate {
        std::string name;
        std::vector<int32_t> tokens;
    };
    std::vector<Candidate> cands;
    {
        std::lock_guard lock(mu_);
        for (const Entry &e : entries_)
            if (e.tokens.size() > longer_than && e.tokens.size() >= opts_.min_tokens &&
                is_prefix(e.tokens, prompt))
                cands.push_back({e.name, e.tokens});
    }
    std::sort(cands.begin(), cands.end(), [](const Candidate &a, const Candidate &b) {
        return a.tokens.size() > b.tokens.size();
    });
    for (const Candidate &c : cands) {
        const auto t0 = clock::now();
        Fd f(::open(path(c.name).c_str(), O_RDONLY | O_CLOEXEC));
        if (f.fd < 0) {
            const int err = errno;
            std::lock_guard lock(mu_);
            if (err == ENOENT) {  // evicted meanwhile (another slot's store): forget it
                entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                              [&](const Entry &e) { return e.name == c.name; }),
                               entries_.end());
            } else {
                log_(fmt::format("could not open {}: {} (kept)", c.name, std::strerror(err)));
            }
            continue;
        }
        bool read = false;
        // A failure that says the file is bad deletes it; one that does not (a failed read, no
        // memory) keeps it for a later request.
        auto failed = [&](const std::string &why, bool bad) -> bool {
            std::lock_guard lock(mu_);
            if (bad)
                reject_locked(c.name, why);
            else
                log_(fmt::format("could not load {}: {} (kept)", c.name, why));
            return read;
        };
        try {
            uint64_t bytes = 0;
            const KvCheckpoint head = read_head(f.fd, model_id_, ctx_, &bytes);
            if (head.tokens != c.tokens) throw Error("its tokens changed since it was indexed");
            verify_body(f.fd, head.header);
            FdReader buf(f.fd, kKvHeaderBytes + 4 * uint64_t(head.tokens.size()),
                         head.header.payload_bytes);
            std::istream in(&buf);
            try {
                session.read_state(in);
            } catch (const Error &) {
                if (!buf.read_error().empty()) throw ReadError(buf.read_error());
                throw;
            }
            read = true;
            if (!buf.at_end()) throw Error("bytes left after the session state");
            if (session.tokens() != head.tokens)
                throw Error("the session state holds other tokens than the header");
        } catch (const ReadError &e) {
            if (failed(e.what(), false)) return {0, true};
            continue;
        } catch (const Error &e) {
            if (failed(e.what(), true)) return {0, true};
            continue;
        } catch (const std::exception &e) {
            if (failed(e.what(), false)) return {0, true};
            continue;
        }
        std::lock_guard lock(mu_);
        for (Entry &e : entries_)
            if (e.name == c.name) touch_locked(e);
        log_(fmt::format("loaded {} tokens from {} ({:.3f} s)", c.tokens.size(), c.name,
                         std::chrono::duration<double>(clock::now() - t0).count()));
        return {c.tokens.size(), true};
    }
    return {};
}

bool KvDiskCache::store(const runtime::Session &session, KvSaveReason reason) {
    using clock = std::chrono::steady_clock;
    const std::vector<int32_t> &tokens = session.tokens();
    if (tokens.size() < opts_.min_tokens || tokens.empty()) return false;
    const std::string name =
        fmt::format("{:016x}.kv", fnv1a(tokens.data(), tokens.size() * sizeof(int32_t)));
    std::string tmp;
    {
        std::lock_guard lock(mu_);
        for (Entry &e : entries_)
            if (e.tokens == tokens) {
                touch_locked(e);
                return false;
            }
        tmp = fmt::format("{}.tmp.{}.{}", name, ::getpid(), ++seq_);
    }
    const auto t0 = clock::now();
    const std::string tmp_path = path(tmp);
    try {
        Fd f(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        if (f.fd < 0) throw Error(fmt::format("cannot create {}: {}", tmp, errno_text()));
        // The header last, once the payload's size is known: a zero placeholder first.
        FdWriter w(f.fd, kKvHeaderBytes, pause_after_bytes_, [&] {
            log_(fmt::format("test pause after {} bytes of {}", pause_after_bytes_, tmp));
        });
        std::ostream out(&w);
        const uint8_t zeros[kKvHeaderBytes] = {};
        out.write(reinterpret_cast<const char *>(zeros), sizeof zeros);
        out.write(reinterpret_cast<const char *>(tokens.data()),
                  std::streamsize(tokens.size() * sizeof(int32_t)));
        session.write_state(out);
        if (!out) throw Error(w.error().empty() ? "write failed" : w.error());
        const uint64_t payload = w.written() - kKvHeaderBytes - 4 * uint64_t(tokens.size());
        w.flush_all();
        const uint32_t crc = w.crc();
        out.write(reinterpret_cast<const char *>(&crc), 4);
        w.flush_all();
        KvHeader h{.reason = uint32_t(reason),
                   .model_id = model_id_,
                   .ctx = session.ctx(),
                   .n_tokens = uint32_t(tokens.size()),
                   .payload_bytes = payload,
                   .created = uint64_t(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count())};
        const auto head = encode_kv_header(h);
        if (::pwrite(f.fd, head.data(), head.size(), 0) != ssize_t(head.size()))
            throw Error("write failed: " + errno_text());
        if (::fsync(f.fd) != 0) throw Error("fsync failed: " + errno_text());
        const uint64_t bytes = kv_file_bytes(h);
        // Kept, it would evict every other checkpoint and then itself.
        if (bytes > opts_.budget_bytes)
            throw Error(fmt::format("{:.2f} MiB is more than the whole budget of {:.1f} MiB",
                                    mib(bytes), mib(opts_.budget_bytes)));
        if (::rename(tmp_path.c_str(), path(name).c_str()) != 0)
            throw Error("rename failed: " + errno_text());
        if (::fsync(dir_fd_) != 0)  // the rename itself is durable
            log_(fmt::format("fsync of {} failed: {}", opts_.dir, errno_text()));
        std::lock_guard lock(mu_);
        entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                      [&](const Entry &e) { return e.name == name; }),
                       entries_.end());
        entries_.push_back({name, tokens, bytes, now_ns()});
        log_(fmt::format("stored {} tokens ({}) in {}, {:.2f} MiB ({:.3f} s)", tokens.size(),
                         kv_save_reason_name(uint32_t(reason)), name, mib(bytes),
                         std::chrono::duration<double>(clock::now() - t0).count()));
        evict_locked(name);
        return true;
    } catch (const std::exception &e) {
        ::unlink(tmp_path.c_str());
        log_(fmt::format("could not store {} tokens: {}", tokens.size(), e.what()));
        return false;
    }
}

size_t KvDiskCache::files() const {
    std::lock_guard lock(mu_);
    return entries_.size();
}

uint64_t KvDiskCache::bytes() const {
    std::lock_guard lock(mu_);
    uint64_t b = 0;
    for (const Entry &e : entries_) b += e.bytes;
    return b;
}

}  // namespace ds4::server
