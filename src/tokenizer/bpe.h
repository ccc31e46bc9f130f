#pragma once
// Byte-level BPE merges on token ids.
//
// A piece (one pre-tokenizer output) starts as one token per byte; then, repeatedly, the adjacent
// pair with the lowest merge rank is replaced by its merged token (leftmost first among equal
// ranks) until no adjacent pair has a rank. This is the order of HF `tokenizers`' BPE::merge_all
// (a min-heap on (rank, position)), so the result is the same token sequence.
//
// Merges are resolved once to ids: (left id, right id) -> (rank, merged id), kept in an
// open-addressing table, so encoding a piece touches no strings.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ds4::tokenizer {

// Scratch memory reused across pieces; one per encoding thread.
struct BpeWorkspace {
    struct Candidate {
        int32_t rank;
        int32_t left;  // index of the left symbol in the piece
        int32_t left_id;
        int32_t right_id;
        int32_t merged;  // the token the pair becomes
    };
    std::vector<int32_t> ids;   // current token of each surviving symbol, -1 once absorbed
    std::vector<int32_t> next;  // index of the next surviving symbol (n at the end)
    std::vector<int32_t> prev;  // index of the previous surviving symbol (-1 at the start)
    std::vector<Candidate> heap;
};

class BpeMerges {
  public:
    // `token_ids` maps vocabulary strings to ids; `merges` are "A B" strings, rank = index.
    // Throws ds4::Error when a merge names a token, or produces a token, not in the vocabulary,
    // or when a byte has no single-byte token.
    BpeMerges(const std::unordered_map<std::string, int32_t> &token_ids,
              const std::vector<std::string> &merges);

    // Appends the tokens of one piece of raw bytes.
    void encode_piece(std::string_view bytes, std::vector<int32_t> &out, BpeWorkspace &ws) const;

    size_t n_merges() const { return n_merges_; }

  private:
    struct Slot {
        uint64_t key;  // (left id << 32) | right id; kEmptyKey when free
        int32_t rank;
        int32_t merged;
    };
    static constexpr uint64_t kEmptyKey = ~uint64_t{0};

    void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
    const Slot *find(int32_t left, int32_t right) const;

    int32_t byte_token_[256];
    std::vector<Slot> slots_;
    uint64_t mask_ = 0;
    size_t n_merges_ = 0;
};

}  // namespace ds4::tokenizer
