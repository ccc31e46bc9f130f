#include "server/responses_store.h"

#include <algorithm>

namespace ds4::server {

ResponseTurn::~ResponseTurn() {
    // Destroying the last owner of a long chain would recurse once per turn: the turns only this
    // one holds are unlinked one by one instead.
    std::shared_ptr<const ResponseTurn> p = std::move(previous);
    while (p && p.use_count() == 1) {
        // Every turn is made non-const (make_shared<ResponseTurn>), so this is its owner's write.
        std::shared_ptr<const ResponseTurn> next =
            std::move(const_cast<ResponseTurn &>(*p).previous);
        p = std::move(next);
    }
}

std::vector<tokenizer::ChatMessage> conversation(const ResponseTurn *last) {
    std::vector<const ResponseTurn *> chain;
    for (const ResponseTurn *t = last; t; t = t->previous.get()) chain.push_back(t);
    std::vector<tokenizer::ChatMessage> out;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it)
        out.insert(out.end(), (*it)->messages.begin(), (*it)->messages.end());
    return out;
}

void ResponsesStore::put(const std::string &id, Entry e) {
    if (capacity_ == 0) return;
    std::vector<Entry> evicted;  // destroyed after the lock is released
    std::lock_guard lock(mu_);
    const auto [it, inserted] = entries_.insert_or_assign(id, std::move(e));
    if (inserted) order_.push_back(id);
    while (entries_.size() > capacity_) {
        const auto old = entries_.find(order_.front());
        evicted.push_back(std::move(old->second));
        entries_.erase(old);
        order_.pop_front();
    }
}

std::optional<ResponsesStore::Entry> ResponsesStore::get(const std::string &id) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
}

bool ResponsesStore::erase(const std::string &id) {
    std::optional<Entry> gone;  // destroyed after the lock is released
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    gone = std::move(it->second);
    entries_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    return true;
}

size_t ResponsesStore::size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
}

}  // namespace ds4::server
