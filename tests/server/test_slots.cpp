#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "server/slots.h"

using ds4::server::choose_slot;
using ds4::server::FairTurn;
using ds4::server::SlotScheduler;
using ds4::server::SlotView;
using namespace std::chrono_literals;

namespace {

// The prefix every slot offers: slot i resumes prefixes[i] tokens.
auto prefixes(std::vector<size_t> p) {
    return [p](size_t i) { return p[i]; };
}
const auto never = [] { return false; };

}  // namespace

TEST(ChooseSlot, LongestPrefixWins) {
    EXPECT_EQ(choose_slot({{false, 3, 1}, {false, 9, 2}, {false, 5, 0}}), 1);
}

TEST(ChooseSlot, BusySlotsAreSkippedEvenWithTheLongestPrefix) {
    EXPECT_EQ(choose_slot({{true, 100, 0}, {false, 2, 5}, {false, 1, 0}}), 1);
    EXPECT_EQ(choose_slot({{true, 1, 0}, {true, 2, 0}}), -1);
    EXPECT_EQ(choose_slot({}), -1);
}

TEST(ChooseSlot, TiesGoToTheLeastRecentlyUsedThenTheLowestIndex) {
    EXPECT_EQ(choose_slot({{false, 4, 7}, {false, 4, 3}, {false, 4, 5}}), 1);
    EXPECT_EQ(choose_slot({{false, 0, 0}, {false, 0, 0}}), 0);
    EXPECT_EQ(choose_slot({{false, 0, 2}, {false, 0, 0}}), 1);  // never used beats used
}

TEST(SlotScheduler, TakesTheSlotWithTheLongestPrefixThenFreesIt) {
    SlotScheduler s(3, 0);
    auto t = s.enter();
    ASSERT_TRUE(t);
    EXPECT_EQ(s.wait(*t, prefixes({1, 7, 3}), never), 1);
    EXPECT_EQ(t->slot(), 1);
    EXPECT_EQ(s.status().busy, 1u);
    t->release();
    EXPECT_EQ(s.status().busy, 0u);
}

TEST(SlotScheduler, ReleasedSlotsAreReusedLeastRecentlyUsedFirst) {
    SlotScheduler s(2, 0);
    auto a = s.enter();
    EXPECT_EQ(s.wait(*a, prefixes({0, 0}), never), 0);
    auto b = s.enter();
    EXPECT_EQ(s.wait(*b, prefixes({0, 0}), never), 1);
    a->release();  // slot 0 used at time 1
    b->release();  // slot 1 at time 2
    auto c = s.enter();
    EXPECT_EQ(s.wait(*c, prefixes({0, 0}), never), 0);
}

TEST(SlotScheduler, FullQueueRefusesAndCountsWaiting) {
    SlotScheduler s(1, 2);
    auto run = s.enter();
    ASSERT_EQ(s.wait(*run, prefixes({0}), never), 0);
    auto q1 = s.enter(), q2 = s.enter();
    ASSERT_TRUE(q1 && q2);
    EXPECT_FALSE(s.enter());
    EXPECT_EQ(s.status().queued, 2u);
    q1.reset();  // leaving the line frees a place
    EXPECT_EQ(s.status().queued, 1u);
    EXPECT_TRUE(s.enter());
}

TEST(SlotScheduler, NoQueueMeansOnlyFreeSlotsAdmit) {
    SlotScheduler s(2, 0);
    auto a = s.enter(), b = s.enter();
    ASSERT_TRUE(a && b);
    EXPECT_FALSE(s.enter());
}

TEST(SlotScheduler, WaitersRunInArrivalOrder) {
    SlotScheduler s(1, 8);
    auto first = s.enter();
    ASSERT_EQ(s.wait(*first, prefixes({0}), never), 0);
    std::vector<int> order;
    std::mutex m;
    std::vector<std::thread> threads;
    for (int i = 0; i < 5; ++i) {
        auto t = s.enter();  // entered here, in order 0..4
        ASSERT_TRUE(t);
        threads.emplace_back([&, i, t = std::move(*t)]() mutable {
            ASSERT_EQ(s.wait(t, prefixes({0}), never), 0);
            {
                std::lock_guard l(m);
                order.push_back(i);
            }
            std::this_thread::sleep_for(2ms);
            t.release();
        });
    }
    std::this_thread::sleep_for(20ms);  // all of them waiting
    EXPECT_EQ(s.status().queued, 5u);
    first->release();
    for (auto &t : threads) t.join();
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(SlotScheduler, AWaiterThatGivesUpLeavesTheLineAndTheNextRuns) {
    SlotScheduler s(1, 4);
    auto running = s.enter();
    ASSERT_EQ(s.wait(*running, prefixes({0}), never), 0);
    auto quitter = s.enter(), next = s.enter();
    std::atomic<bool> gone{false};
    std::atomic<int> quit_result{99}, next_result{99};
    std::thread q([&] {
        quit_result = s.wait(
            *quitter, prefixes({0}), [&] { return gone.load(); }, 1ms);
    });
    std::thread n([&] { next_result = s.wait(*next, prefixes({0}), never, 1ms); });
    std::this_thread::sleep_for(10ms);
    gone = true;
    q.join();
    EXPECT_EQ(quit_result, -1);
    EXPECT_EQ(s.status().queued, 1u);
    running->release();
    n.join();
    EXPECT_EQ(next_result, 0);
    quitter.reset();  // a ticket that gave up releases nothing
    EXPECT_EQ(s.status().busy, 1u);
}

TEST(SlotScheduler, TheHeadOfTheLineWaitsForAFreeSlotEvenIfTheOthersCouldNot) {
    // Two slots busy, two waiters: the first freed slot goes to the first waiter.
    SlotScheduler s(2, 4);
    auto a = s.enter(), b = s.enter();
    ASSERT_EQ(s.wait(*a, prefixes({0, 0}), never), 0);
    ASSERT_EQ(s.wait(*b, prefixes({0, 0}), never), 1);
    auto w1 = s.enter(), w2 = s.enter();
    std::atomic<int> r1{-2}, r2{-2};
    std::thread t1([&] { r1 = s.wait(*w1, prefixes({5, 0}), never, 1ms); });
    std::this_thread::sleep_for(5ms);
    std::thread t2([&] { r2 = s.wait(*w2, prefixes({0, 5}), never, 1ms); });
    std::this_thread::sleep_for(5ms);
    b->release();  // slot 1 free: w1 is first in line and takes it
    t1.join();
    EXPECT_EQ(r1, 1);
    EXPECT_EQ(r2, -2);
    a->release();
    t2.join();
    EXPECT_EQ(r2, 0);
}

TEST(FairTurn, GrantsTurnsInTheOrderAsked) {
    FairTurn turn;
    turn.lock();
    std::vector<int> order;
    std::vector<std::thread> threads;
    std::atomic<int> started{0};
    for (int i = 0; i < 4; ++i) {
        threads.emplace_back([&, i] {
            ++started;
            turn.lock();
            order.push_back(i);
            turn.unlock();
        });
        while (started <= i) std::this_thread::yield();
        std::this_thread::sleep_for(5ms);  // thread i is waiting before i+1 asks
    }
    turn.unlock();
    for (auto &t : threads) t.join();
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}
