// SSD streaming through the session API (runtime/expert_streaming.h): a streaming model's logits
// must be the resident model's, bit for bit (memcmp), for a prefill in several chunks and 64
// greedy decode steps, at every budget from the floor to every expert, cold and preloaded, with 1
// and 2 threads, io_uring and the pread pool. Two models: a tiny one in the published q2 expert
// types with 32 experts per layer, and one with the Flash widths (6.75 MiB experts) but 3 layers
// and 16 experts. Also: the load refuses the floor and the CUDA backend, the popularity file is
// written and read back, and loading never reads a routed expert through the mapping.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

std::string temp_path(const std::string &name) {
    return ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
}

struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() { std::filesystem::remove_all(path); }
};

std::string write_model(const std::string &name, const model::HParams &hp) {
    gguf::Writer w;
    std::vector<std::string> tokens;
    for (uint32_t i = 0; i < hp.n_vocab; ++i) tokens.push_back("tok" + std::to_string(i * 7));
    w.set("tokenizer.ggml.tokens", gguf::Value::array_of_strings(tokens));
    const auto bytes = w.to_bytes();
    auto vocab = gguf::File::from_memory(bytes.data(), bytes.size());
    const std::string p = temp_path(name);
    model::write_synthetic_model(hp, model::QuantMix::Q2, 5, *vocab, p, false);
    return p;
}

// Tiny widths, 32 experts per layer (4 used): 192 routed experts of 55,296 bytes, whose slabs are
// not 4 KiB multiples (O_DIRECT rounding).
const std::string &tiny_q2() {
    static const RemoveOnExit f{[] {
        model::HParams hp = model::shape_preset("tiny", 512);
        hp.n_expert = 32;
        hp.n_expert_used = 4;
        return write_model("stream-tiny-q2.gguf", hp);
    }()};
    return f.path;
}

// The Flash widths (experts of 6.75 MiB, gate/up 2048 x 4096 IQ2_XXS, down 4096 x 2048 Q2_K),
// 3 layers (one hash-routed, ratios 0, 4, 128) and 16 experts, 6 used.
const std::string &flash_q2() {
    static const RemoveOnExit f{[] {
        model::HParams hp = model::shape_preset("flash", 512);
        hp.n_layer = 3;
        hp.n_hash_layer = 1;
        hp.n_expert = 16;
        hp.compress_ratio = {0, 4, 128};
        hp.swiglu_clamp.assign(3, 10.0f);
        return write_model("stream-flash3-q2.gguf", hp);
    }()};
    return f.path;
}

std::vector<int32_t> made_up_prompt(size_t n) {
    std::vector<int32_t> t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 5) % 512));
    return t;
}

struct Workload {
    size_t prompt = 40;
    uint32_t chunk = 16;
    uint32_t decode = 64;
};

struct Trace {
    std::vector<std::vector<float>> logits;  // after each prefill chunk, then each decode step
    std::vector<int32_t> decoded;
};

Trace run_trace(Model &m, const Workload &w, const std::vector<int32_t> *forced) {
    const auto p = made_up_prompt(w.prompt);
    Session s(m, {.ctx = uint32_t(w.prompt + w.decode + 1), .chunk = w.chunk});
    Trace t;
    for (size_t i = 0; i < p.size(); i += w.chunk)
        t.logits.push_back(
            s.eval(std::span(p).subspan(i, std::min<size_t>(w.chunk, p.size() - i))));
    for (uint32_t k = 0; k < w.decode; ++k) {
        const int32_t id = forced ? (*forced)[k] : argmax(s.logits());
        t.decoded.push_back(id);
        t.logits.push_back(s.eval(std::span(&id, 1)));
    }
    return t;
}

// "" when every step's logits are byte-identical, else the first step and index that differ.
std::string first_difference(const Trace &got, const Trace &want) {
    if (got.logits.size() != want.logits.size()) return "different step counts";
    for (size_t i = 0; i < want.logits.size(); ++i) {
        const auto &a = got.logits[i], &b = want.logits[i];
        if (a.size() != b.size()) return "step " + std::to_string(i) + ": sizes differ";
        if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) continue;
        for (size_t j = 0; j < a.size(); ++j)
            if (std::memcmp(&a[j], &b[j], sizeof(float)) != 0)
                return "step " + std::to_string(i) + " logit " + std::to_string(j) + ": " +
                       std::to_string(a[j]) + " vs resident " + std::to_string(b[j]);
    }
    return "";
}

StreamingModelOptions streaming(uint64_t budget, bool preload, experts::ReaderKind reader) {
    StreamingModelOptions o;
    o.enabled = true;
    o.budget.experts = budget;
    o.preload = preload;
    o.reader.kind = reader;
    return o;
}

std::vector<uint64_t> budgets(const model::HParams &hp) {
    const uint64_t floor = hp.n_expert_used, total = uint64_t(hp.n_layer) * hp.n_expert;
    std::vector<uint64_t> b = {floor,     2 * floor, std::max(floor, total / 10),
                               total / 4, total / 2, total};
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    return b;
}

// Resident traces per (model, threads), computed once.
const Trace &resident_trace(const std::string &path, int threads, const Workload &w) {
    static std::map<std::pair<std::string, int>, Trace> done;
    auto it = done.find({path, threads});
    if (it == done.end()) {
        auto m = Model::load(path, {.n_threads = threads});
        it = done.emplace(std::make_pair(path, threads), run_trace(*m, w, nullptr)).first;
    }
    return it->second;
}

struct Case {
    int threads;
    experts::ReaderKind reader;
    bool preload;
};

void PrintTo(const Case &c, std::ostream *os) {
    *os << c.threads << " threads, " << (c.reader == experts::ReaderKind::Pool ? "pool" : "auto")
        << (c.preload ? ", preloaded" : ", cold");
}

class TinyStreaming : public ::testing::TestWithParam<Case> {};

TEST_P(TinyStreaming, LogitsBitIdenticalToResidentAtEveryBudget) {
    const Case c = GetParam();
    const Workload w;
    const Trace &want = resident_trace(tiny_q2(), c.threads, w);
    ASSERT_EQ(want.logits.size(), 3u + w.decode);  // 40 tokens in chunks of 16, 64 steps
    const model::HParams hp = Model::load(tiny_q2(), {.n_threads = 1})->hparams();
    for (const uint64_t b : budgets(hp)) {
        SCOPED_TRACE("budget " + std::to_string(b) + " experts");
        auto m = Model::load(
            tiny_q2(), {.n_threads = c.threads, .streaming = streaming(b, c.preload, c.reader)});
        const Trace got = run_trace(*m, w, &want.decoded);
        EXPECT_EQ(first_difference(got, want), "");
        const experts::ExpertStats st = m->streaming()->source().stats();
        EXPECT_EQ(st.entries, b);
        EXPECT_EQ(st.hits + st.misses, st.gets);
        EXPECT_GT(st.gets, 0u);
        if (b < uint64_t(hp.n_layer) * hp.n_expert && !c.preload) {
            EXPECT_GT(st.misses, b);  // a small cache must have evicted and read again
        }
        if (c.preload) {
            EXPECT_EQ(st.preloaded, b);
        } else {
            EXPECT_EQ(st.preloaded, 0u);
        }
        if (c.reader == experts::ReaderKind::Pool) {
            EXPECT_STREQ(st.reader, "pread pool");
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Matrix, TinyStreaming,
                         ::testing::Values(Case{1, experts::ReaderKind::Pool, false},
                                           Case{1, experts::ReaderKind::Pool, true},
                                           Case{1, experts::ReaderKind::Auto, false},
                                           Case{1, experts::ReaderKind::Auto, true},
                                           Case{2, experts::ReaderKind::Pool, false},
                                           Case{2, experts::ReaderKind::Pool, true},
                                           Case{2, experts::ReaderKind::Auto, false},
                                           Case{2, experts::ReaderKind::Auto, true}),
                         [](const auto &info) {
                             const Case &c = info.param;
                             return std::string("t") + std::to_string(c.threads) +
                                    (c.reader == experts::ReaderKind::Pool ? "_pool" : "_uring") +
                                    (c.preload ? "_preloaded" : "_cold");
                         });

TEST(StreamingSession, BufferedReadsAreBitIdenticalToo) {
    const Workload w;
    const Trace &want = resident_trace(tiny_q2(), 2, w);
    StreamingModelOptions o = streaming(4, false, experts::ReaderKind::Pool);
    o.direct_io = false;
    auto m = Model::load(tiny_q2(), {.n_threads = 2, .streaming = o});
    EXPECT_FALSE(m->streaming()->source().stats().direct_io);
    EXPECT_EQ(first_difference(run_trace(*m, w, &want.decoded), want), "");
}

// A prefill chunk as long as the prompt: the chunk's union of experts per layer is far above the
// floor's budget, and the source serves it a few experts at a time.
TEST(StreamingSession, OneLongChunkAtTheFloor) {
    const Workload w{.prompt = 40, .chunk = 40, .decode = 8};
    auto r = Model::load(tiny_q2(), {.n_threads = 2});
    const Trace want = run_trace(*r, w, nullptr);
    auto m = Model::load(
        tiny_q2(), {.n_threads = 2, .streaming = streaming(4, false, experts::ReaderKind::Auto)});
    EXPECT_EQ(first_difference(run_trace(*m, w, &want.decoded), want), "");
}

TEST(StreamingSession, FlashWidthsBitIdenticalAtEveryBudget) {
    const Workload w{.prompt = 20, .chunk = 8, .decode = 64};
    const Trace &want = resident_trace(flash_q2(), 2, w);
    const model::HParams hp = Model::load(flash_q2(), {.n_threads = 1})->hparams();
    ASSERT_EQ(hp.n_embd, 4096u);
    for (const uint64_t b : budgets(hp)) {
        SCOPED_TRACE("budget " + std::to_string(b) + " experts");
        auto m = Model::load(
            flash_q2(),
            {.n_threads = 2, .streaming = streaming(b, false, experts::ReaderKind::Auto)});
        EXPECT_EQ(first_difference(run_trace(*m, w, &want.decoded), want), "");
        const experts::ExpertStats st = m->streaming()->source().stats();
        EXPECT_EQ(st.expert_bytes, 7077888u);  // 6.75 MiB, as the published q2
    }
}

TEST(StreamingSession, BudgetBelowTheFloorIsRefusedWithTheFloor) {
    try {
        (void)Model::load(tiny_q2(), {.streaming = streaming(3, false, experts::ReaderKind::Auto)});
        FAIL() << "a budget of 3 experts was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("below the floor of 4 experts"), std::string::npos)
            << e.what();
    }
}

// The device tier of the CUDA backend (tests/cuda/test_cuda_streaming.cpp runs it): a count below
// its floor is the caller's mistake, refused with the file's errors before any upload (so also
// in a build or on a machine without CUDA), not a backend failure.
TEST(StreamingSession, CudaDeviceTierBelowTheFloorIsRefusedBeforeTheUpload) {
    ModelOptions mo{.backend = Backend::Cuda};
    mo.streaming = streaming(8, false, experts::ReaderKind::Auto);
    mo.streaming.device.experts = 3;
    try {
        (void)Model::load(tiny_q2(), mo);
        FAIL() << "a device tier of 3 experts was accepted";
    } catch (const BackendUnavailable &e) {
        FAIL() << "refused as a backend failure: " << e.what();
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("device tier of 3 experts is below the floor of 4"),
                  std::string::npos)
            << e.what();
    }
}

TEST(StreamingSession, AutoBudgetIsMemoryMinusResidentMinusMargin) {
    StreamingModelOptions o;
    o.enabled = true;
    o.mem_available = uint64_t(4) << 30;
    auto m = Model::load(tiny_q2(), {.streaming = o});
    ExpertStreaming &s = *m->streaming();
    EXPECT_NE(s.log().front().find("SSD streaming cache budget auto: MemAvailable 4.00 GiB"),
              std::string::npos)
        << s.log().front();
    // 4 GiB - ~40 MB resident - 1 GiB margin holds all 192 experts of the tiny model.
    EXPECT_EQ(s.source().stats().entries, 192u);
    o.mem_available = uint64_t(1) << 30;  // at most the margin: no room
    EXPECT_THROW((void)Model::load(tiny_q2(), {.streaming = o}), Error);
}

// The file system /proc/mounts says `path` lies on (the longest mount point above it).
std::string fs_type_of(const std::string &path) {
    std::ifstream mounts("/proc/mounts");
    std::string dev, dir, type, rest, best_type;
    size_t best = 0;
    const std::string abs = std::filesystem::weakly_canonical(path).string();
    while (mounts >> dev >> dir >> type && std::getline(mounts, rest)) {
        const bool under =
            abs == dir || dir == "/" ||
            (abs.rfind(dir, 0) == 0 && abs.size() > dir.size() && abs[dir.size()] == '/');
        if (under && dir.size() >= best) {
            best = dir.size();
            best_type = type;
        }
    }
    return best_type;
}

// With a host tier (the CUDA backend's; the runtime also runs it on the CPU, which reads the same
// bytes), `mapped` hands out the file's own bytes: the resident logits, every get a hit.
TEST(StreamingSession, MappedHostTierGivesTheResidentBits) {
    const Workload w;
    const Trace &want = resident_trace(tiny_q2(), 2, w);
    StreamingModelOptions o;
    o.enabled = true;
    o.host_tier = true;
    o.host_mapped = true;
    auto m = Model::load(tiny_q2(), {.n_threads = 2, .streaming = o});
    ASSERT_TRUE(m->streaming()->host_mapped());
    EXPECT_EQ(first_difference(run_trace(*m, w, &want.decoded), want), "");
    const experts::ExpertStats st = m->streaming()->source().stats();
    EXPECT_GT(st.gets, 0u);
    EXPECT_EQ(st.hits, st.gets);
    EXPECT_EQ(st.bytes_read, 0u);
    EXPECT_STREQ(st.reader, "the file's mapping");
    EXPECT_EQ(m->streaming()->log().front(),
              "SSD streaming host tier: the file's mapping (--ssd-streaming-host-cache mapped)");
    // The device tier's preload order is still made (the router's tables: every expert here,
    // fewer than the 4096 cap).
    const model::HParams hp = m->hparams();
    EXPECT_EQ(m->streaming()->preloaded().size(), uint64_t(hp.n_layer) * hp.n_expert);
}

// `auto` takes the mapping for a file on tmpfs (already in memory), a cache elsewhere.
TEST(StreamingSession, AutoHostTierIsTheMappingForAFileOnTmpfs) {
    if (fs_type_of("/dev/shm") != "tmpfs") GTEST_SKIP() << "/dev/shm is not a tmpfs here";
    const RemoveOnExit shm{"/dev/shm/" + std::to_string(::getpid()) + "-stream-tiny-q2.gguf"};
    std::filesystem::copy_file(tiny_q2(), shm.path);
    EXPECT_TRUE(file_in_memory(shm.path));
    StreamingModelOptions o;
    o.enabled = true;
    o.host_tier = true;
    o.mem_available = uint64_t(4) << 30;
    auto m = Model::load(shm.path, {.streaming = o});
    EXPECT_TRUE(m->streaming()->host_mapped());
    EXPECT_NE(m->streaming()->log().front().find("is on a file system in memory (tmpfs or ramfs)"),
              std::string::npos)
        << m->streaming()->log().front();
    // A budget given keeps the cache on tmpfs too.
    o.budget.experts = 8;
    EXPECT_FALSE(Model::load(shm.path, {.streaming = o})->streaming()->host_mapped());
    if (fs_type_of(tiny_q2()) != "tmpfs" && fs_type_of(tiny_q2()) != "ramfs") {
        EXPECT_FALSE(file_in_memory(tiny_q2()));
        o.budget.experts = 0;
        EXPECT_FALSE(Model::load(tiny_q2(), {.streaming = o})->streaming()->host_mapped());
    }
}

TEST(StreamingSession, PopularityIsSavedAndPreloadedNextTime) {
    const RemoveOnExit dir{temp_path("popularity")};
    StreamingModelOptions o = streaming(48, false, experts::ReaderKind::Auto);
    o.popularity_file = popularity_file_for(dir.path, tiny_q2());
    const Workload w{.prompt = 40, .chunk = 16, .decode = 16};
    {
        auto m = Model::load(tiny_q2(), {.n_threads = 2, .streaming = o});
        (void)run_trace(*m, w, nullptr);
        EXPECT_NE(m->streaming()->save_popularity().find("popularity saved to"), std::string::npos);
    }
    ASSERT_TRUE(std::filesystem::exists(o.popularity_file));
    o.preload = true;
    auto m = Model::load(tiny_q2(), {.n_threads = 2, .streaming = o});
    const auto &log = m->streaming()->log();
    EXPECT_NE(log.back().find("from the popularity file"), std::string::npos) << log.back();
    EXPECT_EQ(m->streaming()->source().stats().preloaded, 48u);
    // The same run again: the preloaded popular experts give more hits than a cold start.
    (void)run_trace(*m, w, nullptr);
    o.preload = false;
    auto cold = Model::load(tiny_q2(), {.n_threads = 2, .streaming = o});
    (void)run_trace(*cold, w, nullptr);
    EXPECT_GT(m->streaming()->source().stats().hits, cold->streaming()->source().stats().hits);
}

// Pages of the routed experts' tensors that are in memory (mincore on the mapping), and all of
// them. Whole pages inside a tensor only: its first and last may share a page with a neighbour.
std::pair<uint64_t, uint64_t> routed_pages_in_memory(const Model &m) {
    const long page = ::sysconf(_SC_PAGESIZE);
    uint64_t in_memory = 0, pages = 0;
    for (const model::LayerWeights &L : m.weights().layers) {
        for (model::Tensor t : {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps}) {
            const uintptr_t a = (reinterpret_cast<uintptr_t>(t->data) + page - 1) / page * page;
            const uintptr_t b = (reinterpret_cast<uintptr_t>(t->data) + t->n_bytes) / page * page;
            if (b <= a) continue;
            std::vector<unsigned char> vec((b - a) / page);
            EXPECT_EQ(::mincore(reinterpret_cast<void *>(a), b - a, vec.data()), 0);
            for (unsigned char v : vec) in_memory += v & 1;
            pages += vec.size();
        }
    }
    return {in_memory, pages};
}

void drop_cached_pages(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
}

// The load and a whole streaming run never page in a routed expert through the mapping, and with
// O_DIRECT the reads do not fill the page cache either: mincore reports none of their pages in
// memory, after the file's pages were dropped. The same run resident brings them in (so the check
// can fail).
TEST(StreamingSession, RoutedBytesAreNeverTouchedThroughTheMapping) {
    const std::string &path = flash_q2();
    const Workload w{.prompt = 8, .chunk = 8, .decode = 4};
    drop_cached_pages(path);
    {
        auto m = Model::load(
            path, {.n_threads = 2, .streaming = streaming(6, false, experts::ReaderKind::Auto)});
        ASSERT_TRUE(m->streaming()->source().stats().direct_io)
            << "O_DIRECT is off on this file system: the page cache would hold the reads";
        (void)run_trace(*m, w, nullptr);
        const auto [in_memory, pages] = routed_pages_in_memory(*m);
        EXPECT_GT(pages, 0u);
        EXPECT_EQ(in_memory, 0u) << "of " << pages << " pages of routed experts";
    }
    drop_cached_pages(path);
    auto r = Model::load(path, {.n_threads = 2});
    (void)run_trace(*r, w, nullptr);
    EXPECT_GT(routed_pages_in_memory(*r).first, 0u);
}

}  // namespace
