#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "common/error.h"
#include "tokenizer/byte_level.h"

namespace ds4::tokenizer {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

// Fibonacci hashing: the high bits of key * 2^64/phi spread consecutive ids well.
uint64_t hash_key(uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ull) >> 20;
}

// Heap order: smallest rank first, then leftmost.
bool later_candidate(const BpeWorkspace::Candidate &a, const BpeWorkspace::Candidate &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

}  // namespace

BpeMerges::BpeMerges(const std::unordered_map<std::string, int32_t> &token_ids,
                     const std::vector<std::string> &merges) {
    for (unsigned b = 0; b < 256; ++b) {
        const std::string spelled = byte_level_encode(std::string(1, static_cast<char>(b)));
        auto it = token_ids.find(spelled);
        if (it == token_ids.end()) {
            throw Error(
                fmt::format("tokenizer: the vocabulary has no token for byte 0x{:02x} "
                            "('{}'); not a byte-level BPE vocabulary",
                            b, spelled));
        }
        byte_token_[b] = it->second;
    }

    const size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
    slots_.assign(capacity, Slot{kEmptyKey, 0, 0});
    mask_ = capacity - 1;

    std::string merged;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const std::string &m = merges[rank];
        const size_t space = m.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == m.size() ||
            m.find(' ', space + 1) != std::string::npos) {
            throw Error(fmt::format("tokenizer: merge {} is '{}', expected \"A B\"", rank, m));
        }
        const std::string left(m, 0, space);
        const std::string right(m, space + 1);
        merged = left + right;
        auto l = token_ids.find(left);
        auto r = token_ids.find(right);
        auto lr = token_ids.find(merged);
        if (l == token_ids.end() || r == token_ids.end() || lr == token_ids.end()) {
            throw Error(
                fmt::format("tokenizer: merge {} '{}' uses or makes a token that is not "
                            "in the vocabulary",
                            rank, m));
        }
        // A pair listed twice keeps its first (lowest) rank, as in HF tokenizers.
        if (find(l->second, r->second) == nullptr) {
            insert(l->second, r->second, static_cast<int32_t>(rank), lr->second);
        }
    }
    n_merges_ = merges.size();
}

void BpeMerges::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    const uint64_t key = pair_key(left, right);
    for (uint64_t i = hash_key(key) & mask_;; i = (i + 1) & mask_) {
        if (slots_[i].key == kEmptyKey) {
            slots_[i] = Slot{key, rank, merged};
            return;
        }
    }
}

const BpeMerges::Slot *BpeMerges::find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (uint64_t i = hash_key(key) & mask_;; i = (i + 1) & mask_) {
        const Slot &s = slots_[i];
        if (s.key == key) return &s;
        if (s.key == kEmptyKey) return nullptr;
    }
}

void BpeMerges::encode_piece(std::string_view bytes, std::vector<int32_t> &out,
                             BpeWorkspace &ws) const {
    const auto n = static_cast<int32_t>(bytes.size());
    if (n == 0) return;
    if (n == 1) {
        out.push_back(byte_token_[static_cast<uint8_t>(bytes[0])]);
        return;
    }
    ws.ids.resize(n);
    ws.next.resize(n);
    ws.prev.resize(n);
    ws.heap.clear();
    for (int32_t i = 0; i < n; ++i) {
        ws.ids[i] = byte_token_[static_cast<uint8_t>(bytes[i])];
        ws.next[i] = i + 1;
        ws.prev[i] = i - 1;
    }
    auto push_pair = [&](int32_t left) {
        const int32_t right = ws.next[left];
        if (right >= n) return;
        if (const Slot *s = find(ws.ids[left], ws.ids[right])) {
            ws.heap.push_back({s->rank, left, ws.ids[left], ws.ids[right], s->merged});
            std::push_heap(ws.heap.begin(), ws.heap.end(), later_candidate);
        }
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

    while (!ws.heap.empty()) {
        std::pop_heap(ws.heap.begin(), ws.heap.end(), later_candidate);
        const BpeWorkspace::Candidate c = ws.heap.back();
        ws.heap.pop_back();
        // Stale when either symbol changed since the pair was queued (a symbol's id only
        // changes by growing, and an absorbed symbol has id -1).
        const int32_t right = ws.next[c.left];
        if (ws.ids[c.left] != c.left_id || right >= n || ws.ids[right] != c.right_id) continue;
        ws.ids[c.left] = c.merged;
        ws.ids[right] = -1;
        ws.next[c.left] = ws.next[right];
        if (ws.next[right] < n) ws.prev[ws.next[right]] = c.left;
        if (ws.prev[c.left] >= 0) push_pair(ws.prev[c.left]);
        push_pair(c.left);
    }
    for (int32_t i = 0; i < n; i = ws.next[i]) out.push_back(ws.ids[i]);
}

}  // namespace ds4::tokenizer
