// Session::write_state / read_state on the tiny synthetic model: a state read into a fresh session
// continues bit for bit as the original does; truncated, corrupted and mismatched bytes are
// refused with ds4::Error and leave the session as it was.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>

#include "common/error.h"
#include "runtime/session.h"
#include "session_bytes.h"
#include "tiny_session_model.h"

using namespace ds4;
using namespace ds4::runtime;
using ds4::test::read_into;
using ds4::test::state_of;

namespace {

std::unique_ptr<Model> load_tiny() {
    return Model::load(test::tiny_session_model(11), {.n_threads = 2});
}

// Byte offset of the CPU state's header inside a session state of n tokens: the session header
// (5 u32, u64 count, tokens, u64 count, logits).
size_t cpu_header_offset(size_t n_tokens, size_t n_logits) {
    return 5 * 4 + 8 + 4 * n_tokens + 8 + 4 * n_logits;
}

TEST(SessionState, ReadIntoAFreshSessionContinuesBitIdentically) {
    auto m = load_tiny();
    Session a(*m, {.ctx = 128});
    a.eval(test::made_up_prompt(41));  // crosses the window (8), ratios 4 and 16, the indexer
    const std::string bytes = state_of(a);
    Session b(*m, {.ctx = 128});
    read_into(b, bytes);
    EXPECT_EQ(b.tokens(), a.tokens());
    EXPECT_EQ(b.logits(), a.logits());
    const std::vector<int32_t> more = {3, 141, 59, 26, 5, 358, 97, 93, 238, 462, 64, 33, 83};
    for (int32_t t : more) ASSERT_EQ(a.eval(std::span(&t, 1)), b.eval(std::span(&t, 1))) << t;
    // And the state written again is the same bytes.
    EXPECT_EQ(state_of(a), state_of(b));
}

TEST(SessionState, StateOfASmallerContextLoadsIntoALargerOne) {
    auto m = load_tiny();
    Session a(*m, {.ctx = 96}), b(*m, {.ctx = 200});
    a.eval(test::made_up_prompt(50));
    read_into(b, state_of(a));
    const auto p = test::made_up_prompt(30, 11, 2);
    EXPECT_EQ(a.eval(p), b.eval(p));
    // The other way round does not fit.
    Session small(*m, {.ctx = 64});
    EXPECT_THROW(read_into(small, state_of(a)), Error);
}

TEST(SessionState, EmptySessionRoundTrips) {
    auto m = load_tiny();
    Session a(*m, {.ctx = 64}), b(*m, {.ctx = 64});
    b.eval(test::made_up_prompt(5));
    read_into(b, state_of(a));
    EXPECT_TRUE(b.tokens().empty());
    const auto p = test::made_up_prompt(20);
    EXPECT_EQ(a.eval(p), b.eval(p));
}

TEST(SessionState, TruncatedBytesAreRefusedAndLeaveTheSessionAsItWas) {
    auto m = load_tiny();
    Session a(*m, {.ctx = 64});
    a.eval(test::made_up_prompt(23));
    const std::string bytes = state_of(a);
    Session b(*m, {.ctx = 64});
    b.eval(test::made_up_prompt(7, 5, 1));
    const auto before = state_of(b);
    for (size_t len = 0; len < bytes.size(); len += len < 512 ? 1 : 211) {
        SCOPED_TRACE(len);
        EXPECT_THROW(read_into(b, bytes.substr(0, len)), Error);
    }
    EXPECT_EQ(state_of(b), before);
}

TEST(SessionState, CorruptedFieldsAreRefused) {
    auto m = load_tiny();
    Session a(*m, {.ctx = 64});
    a.eval(test::made_up_prompt(23));
    const std::string bytes = state_of(a);
    const size_t n_vocab = a.logits().size();
    Session b(*m, {.ctx = 64});
    auto with = [&](size_t at, uint32_t v) {
        std::string c = bytes;
        std::memcpy(c.data() + at, &v, 4);
        return c;
    };
    EXPECT_THROW(read_into(b, with(0, 0x12345678)), Error);    // session magic
    EXPECT_THROW(read_into(b, with(4, 2)), Error);             // version
    EXPECT_THROW(read_into(b, with(8, 65)), Error);            // ctx above this session's
    EXPECT_THROW(read_into(b, with(12, 513)), Error);          // vocabulary
    EXPECT_THROW(read_into(b, with(16, 1)), Error);            // layers
    EXPECT_THROW(read_into(b, with(20, 22)), Error);           // token count vs the state
    EXPECT_THROW(read_into(b, with(20, 0xffffffff)), Error);   // token count vs ctx
    EXPECT_THROW(read_into(b, with(28 + 4 * 3, 512)), Error);  // a token outside the vocabulary
    EXPECT_THROW(read_into(b, with(28 + 4 * 23, 7)), Error);   // logit count
    const size_t cpu = cpu_header_offset(23, n_vocab);
    EXPECT_THROW(read_into(b, with(cpu, 0)), Error);         // CPU magic
    EXPECT_THROW(read_into(b, with(cpu + 4, 9)), Error);     // CPU version
    EXPECT_THROW(read_into(b, with(cpu + 8, 1000)), Error);  // CPU ctx
    EXPECT_THROW(read_into(b, with(cpu + 12, 3)), Error);    // CPU layers
    EXPECT_THROW(read_into(b, with(cpu + 17, 24)), Error);   // positions vs tokens
    EXPECT_THROW(read_into(b, with(cpu + 25, 7)), Error);    // layer 0 raw width
    EXPECT_THROW(read_into(b, with(cpu + 29, 9)), Error);    // layer 0 raw rows > window
    EXPECT_TRUE(b.tokens().empty());
    // f16 rows into a session that keeps f32 rows.
    Session f32(*m, {.ctx = 64, .f16_rows = 0});
    EXPECT_THROW(read_into(f32, bytes), Error);
    // A trailing byte is left unread: the caller checks that it consumed everything.
    std::istringstream in(bytes + "x");
    b.read_state(in);
    EXPECT_EQ(in.get(), 'x');
}

TEST(SessionState, RandomCorruptionNeverCrashes) {
    auto m = load_tiny();
    Session a(*m, {.ctx = 64});
    a.eval(test::made_up_prompt(30));
    const std::string bytes = state_of(a);
    std::mt19937_64 rng(7);
    Session b(*m, {.ctx = 64});
    int refused = 0;
    for (int i = 0; i < 300; ++i) {
        std::string c = bytes;
        const int flips = 1 + int(rng() % 4);
        // Mostly in the headers and counts, where a flip changes the shapes.
        for (int f = 0; f < flips; ++f) {
            const size_t at = rng() % 2 ? rng() % 64 : rng() % c.size();
            c[at] = char(c[at] ^ (1 << (rng() % 8)));
        }
        try {
            read_into(b, c);
            // Loaded: flipped row or logit bits are values like any other; the session works.
            ASSERT_EQ(b.tokens().size(), 30u);
        } catch (const Error &) {
            ++refused;
        }
    }
    EXPECT_GT(refused, 0);
}

}  // namespace
