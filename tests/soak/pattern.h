// Byte patterns the soak writes and checks, and a model of what a region
// should hold after a sequence of writes.
//
// The byte at absolute offset x of a region filled with `seed` is byte x%8 of
// Word(seed, x/8), so any sub-range can be generated or checked on its own,
// wherever it lies in a buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>

namespace podlink::soak {

inline uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t Word(uint64_t seed, uint64_t word_index) { return Mix(seed * 0xd1342543de82ef95ULL ^ word_index); }

inline uint8_t PatternByte(uint64_t seed, uint64_t x) {
  return static_cast<uint8_t>(Word(seed, x >> 3) >> ((x & 7) * 8));
}

// Writes the pattern of offsets [off, off+len) to p[0, len).
inline void FillPattern(uint8_t* p, uint64_t off, uint64_t len, uint64_t seed) {
  uint64_t i = 0;
  for (; i < len && ((off + i) & 7) != 0; ++i) p[i] = PatternByte(seed, off + i);
  for (; i + 8 <= len; i += 8) {
    uint64_t w = Word(seed, (off + i) >> 3);
    std::memcpy(p + i, &w, 8);
  }
  for (; i < len; ++i) p[i] = PatternByte(seed, off + i);
}

// Number of bytes of p[0, len) that differ from the pattern of [off, off+len).
inline uint64_t CountMismatches(const uint8_t* p, uint64_t off, uint64_t len, uint64_t seed) {
  uint64_t bad = 0, i = 0;
  for (; i < len && ((off + i) & 7) != 0; ++i) bad += p[i] != PatternByte(seed, off + i);
  for (; i + 8 <= len; i += 8) {
    uint64_t w = Word(seed, (off + i) >> 3), got;
    std::memcpy(&got, p + i, 8);
    if (got != w) {
      for (int b = 0; b < 8; ++b) bad += p[i + b] != PatternByte(seed, off + i + b);
    }
  }
  for (; i < len; ++i) bad += p[i] != PatternByte(seed, off + i);
  return bad;
}

// What a region holds: disjoint segments [start, end) each filled with one
// seed's pattern. Starts as one segment; every write replaces its range.
class RegionModel {
 public:
  RegionModel(uint64_t size, uint64_t base_seed) : size_(size) { segs_[0] = {size, base_seed}; }

  void Write(uint64_t off, uint64_t len, uint64_t seed) {
    if (len == 0) return;
    Split(off);
    Split(off + len);
    segs_.erase(segs_.lower_bound(off), segs_.lower_bound(off + len));
    segs_[off] = {off + len, seed};
  }

  // Mismatching bytes of p[0, len) against the model's [off, off+len).
  uint64_t Check(const uint8_t* p, uint64_t off, uint64_t len) const {
    uint64_t bad = 0;
    auto it = segs_.upper_bound(off);
    --it;  // the segment holding `off` (segments cover [0, size))
    for (uint64_t pos = off, end = off + len; pos < end; ++it) {
      uint64_t stop = it->second.end < end ? it->second.end : end;
      bad += CountMismatches(p + (pos - off), pos, stop - pos, it->second.seed);
      pos = stop;
    }
    return bad;
  }

  uint64_t size() const { return size_; }

 private:
  struct Seg {
    uint64_t end;
    uint64_t seed;
  };
  // Makes `at` a segment boundary.
  void Split(uint64_t at) {
    if (at >= size_) return;
    auto it = segs_.upper_bound(at);
    --it;
    if (it->first == at) return;
    Seg tail{it->second.end, it->second.seed};
    it->second.end = at;
    segs_[at] = tail;
  }
  uint64_t size_;
  std::map<uint64_t, Seg> segs_;
};

}  // namespace podlink::soak
