#include "server/slots.h"

#include <algorithm>

namespace ds4::server {

int choose_slot(const std::vector<SlotView> &slots) {
    int best = -1;
    for (size_t i = 0; i < slots.size(); ++i) {
        const SlotView &s = slots[i];
        if (s.busy) continue;
        if (best < 0) {
            best = int(i);
            continue;
        }
        const SlotView &b = slots[size_t(best)];
        if (s.prefix > b.prefix || (s.prefix == b.prefix && s.last_used < b.last_used))
            best = int(i);
    }
    return best;
}

SlotScheduler::SlotScheduler(size_t n_slots, size_t max_queue)
    : slots_(n_slots), max_queue_(max_queue) {}

SlotScheduler::Ticket &SlotScheduler::Ticket::operator=(Ticket &&o) noexcept {
    if (this != &o) {
        release();
        owner_ = o.owner_;
        id_ = o.id_;
        slot_ = o.slot_;
        o.owner_ = nullptr;
        o.slot_ = -1;
    }
    return *this;
}

void SlotScheduler::Ticket::release() {
    if (owner_) owner_->leave(*this);
    owner_ = nullptr;
    slot_ = -1;
}

std::optional<SlotScheduler::Ticket> SlotScheduler::enter() {
    std::lock_guard lock(mu_);
    size_t busy = 0;
    for (const SlotView &s : slots_) busy += s.busy;
    if (line_.size() + busy >= slots_.size() + max_queue_) return std::nullopt;
    Ticket t;
    t.owner_ = this;
    t.id_ = next_id_++;
    line_.push_back(t.id_);
    return t;
}

int SlotScheduler::wait(Ticket &t, const std::function<size_t(size_t)> &prefix,
                        const std::function<bool()> &give_up, std::chrono::milliseconds poll) {
    std::unique_lock lock(mu_);
    if (t.slot_ >= 0) return t.slot_;
    for (;;) {
        if (!line_.empty() && line_.front() == t.id_) {
            for (size_t i = 0; i < slots_.size(); ++i)
                slots_[i].prefix = slots_[i].busy ? 0 : prefix(i);
            const int s = choose_slot(slots_);
            if (s >= 0) {
                line_.pop_front();
                slots_[size_t(s)].busy = true;
                t.slot_ = s;
                cv_.notify_all();  // the next in line may find another free slot
                return s;
            }
        }
        // give_up may look at a socket: not under the lock.
        lock.unlock();
        const bool quit = give_up();
        lock.lock();
        if (quit) {
            line_.erase(std::remove(line_.begin(), line_.end(), t.id_), line_.end());
            t.owner_ = nullptr;
            cv_.notify_all();
            return -1;
        }
        cv_.wait_for(lock, poll);
    }
}

void SlotScheduler::leave(Ticket &t) {
    std::lock_guard lock(mu_);
    if (t.slot_ >= 0) {
        slots_[size_t(t.slot_)].busy = false;
        slots_[size_t(t.slot_)].last_used = ++clock_;
    } else {
        line_.erase(std::remove(line_.begin(), line_.end(), t.id_), line_.end());
    }
    cv_.notify_all();
}

SlotScheduler::Status SlotScheduler::status() const {
    std::lock_guard lock(mu_);
    Status st{.slots = slots_.size(), .queued = line_.size(), .max_queue = max_queue_};
    for (const SlotView &s : slots_) st.busy += s.busy;
    return st;
}

void FairTurn::lock() {
    std::unique_lock lock(mu_);
    const uint64_t mine = next_++;
    cv_.wait(lock, [&] { return serving_ == mine; });
}

void FairTurn::unlock() {
    {
        std::lock_guard lock(mu_);
        ++serving_;
    }
    cv_.notify_all();
}

}  // namespace ds4::server
