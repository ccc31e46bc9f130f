#pragma once
// Who runs where (docs/SERVER.md, Sessions and KV reuse): the choice of a session slot for a
// prompt, the bounded FIFO of requests waiting for one, and the fair turn the slots take on the
// one compute engine. Pure logic over slot indices: the Engine owns the sessions.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace ds4::server {

// What slot choice sees of one slot.
struct SlotView {
    bool busy = false;
    size_t prefix = 0;       // tokens of the prompt the slot can resume from
    uint64_t last_used = 0;  // when it was last released; 0 = never
};

// The free slot with the longest resumable prefix; among equals the least recently used (then
// the lowest index). -1 when every slot is busy.
int choose_slot(const std::vector<SlotView> &slots);

// Slots and the queue in front of them. A request enters (or is refused when the queue is full),
// waits in arrival order until it is first in line and a slot is free, takes the slot that
// choose_slot picks for it, and releases it when done.
class SlotScheduler {
  public:
    SlotScheduler(size_t n_slots, size_t max_queue);

    // A request's place: in line after enter(), on a slot after wait(). Leaving the ticket (its
    // destructor, or release()) leaves the line or frees the slot.
    class Ticket {
      public:
        Ticket() = default;
        Ticket(Ticket &&o) noexcept { *this = std::move(o); }
        Ticket &operator=(Ticket &&o) noexcept;
        ~Ticket() { release(); }
        int slot() const { return slot_; }
        void release();

      private:
        friend class SlotScheduler;
        SlotScheduler *owner_ = nullptr;
        uint64_t id_ = 0;
        int slot_ = -1;
    };

    // A place in line, or nullopt when every slot is taken and max_queue requests already wait.
    std::optional<Ticket> enter();
    // Waits until the ticket is first in line and a slot is free, then takes the slot that
    // choose_slot picks with prefix(slot) (called under the scheduler's lock, for free slots
    // only) and returns it. Returns -1, out of line, once give_up() is true (polled every `poll`).
    int wait(Ticket &t, const std::function<size_t(size_t)> &prefix,
             const std::function<bool()> &give_up,
             std::chrono::milliseconds poll = std::chrono::milliseconds(50));

    struct Status {
        size_t slots = 0, busy = 0, queued = 0, max_queue = 0;
    };
    Status status() const;

  private:
    void leave(Ticket &t);

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<SlotView> slots_;
    std::deque<uint64_t> line_;  // ids waiting, in arrival order
    size_t max_queue_;
    uint64_t next_id_ = 1, clock_ = 0;
};

// A mutex that is granted in the order it was asked for (a ticket lock), so that slots
// alternating on the compute engine each get their turn. Meets Lockable's lock/unlock.
class FairTurn {
  public:
    void lock();
    void unlock();

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t next_ = 0, serving_ = 0;
};

}  // namespace ds4::server
