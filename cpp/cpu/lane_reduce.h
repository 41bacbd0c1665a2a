// Reductions over a row with 16 (or kLanes) independent partial results,
// so that the compiler vectorizes them (one serial accumulator binds a loop
// to the add latency, ~4 cycles per element). Lane l takes the terms
// c = l mod kLanes in order, the tail goes to lane 0, and the lanes combine
// in order. Use them inside a function compiled per ISA (cpu/isa_clones.h).
#pragma once
#include <cstdint>
#include <limits>

namespace jaxcraft {
namespace cpu {

constexpr int kReduceLanes = 16;

// The sum of term(c) over c < n, each term evaluated once, in order within
// its lane (a term may write its element back).
template <int kLanes = kReduceLanes, typename Term>
[[gnu::always_inline]] inline float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(c + l);
  for (; c < n; ++c) acc[0] += term(c);
  float total = 0.f;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

// The largest term(c) over c < n (-inf when n = 0); NaNs are skipped.
template <typename Term>
[[gnu::always_inline]] inline float lane_max(int64_t n, Term term) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float acc[kReduceLanes];
  for (int l = 0; l < kReduceLanes; ++l) acc[l] = kNegInf;
  int64_t c = 0;
  for (; c + kReduceLanes <= n; c += kReduceLanes)
    for (int l = 0; l < kReduceLanes; ++l) {
      const float x = term(c + l);
      acc[l] = x > acc[l] ? x : acc[l];
    }
  for (; c < n; ++c) {
    const float x = term(c);
    acc[0] = x > acc[0] ? x : acc[0];
  }
  float m = kNegInf;
  for (int l = 0; l < kReduceLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

}  // namespace cpu
}  // namespace jaxcraft
