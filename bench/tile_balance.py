"""A list-scheduling model of the Hopper attention backward's work order under a causal mask
(cpp/kernels/attention/sm90/tile_order.h): the fraction of the kernel's time the SMs are busy,
for the group of heads the launcher picks and for other group sizes.

  python bench/tile_balance.py [B,S,N,K[,D] ...]   (default: the decoder bench's D128 shapes)

One CTA per SM takes one key tile (128 keys; 64 at head dim 256) of one KV head and walks the
query tiles its keys are seen by, for each of the N / K query heads of its group:
(N / K) * (tiles - rank) steps, plus a fixed cost per CTA. CTAs start in the launcher's order
(tile-major within groups of `group` (KV head, batch) pairs, the largest tiles first) as SMs free
up. Times are in steps; the model ignores L2.
"""

from __future__ import annotations

import heapq
import sys

SMS = 132  # H100 / H200
KEY_TILE = {64: 128, 128: 128, 256: 64}  # keys per CTA, by head dim (BwdTiles)
GROUP_BYTES = 16 << 20  # kTileGroupBytes
CTA_COST = 2  # steps of start and end per CTA (K/V load, dK/dV store)


def key_tiles(seqlen: int, head_dim: int) -> int:
  return -(-seqlen // KEY_TILE[head_dim])


def launcher_group(seqlen: int, heads: int, kv_heads: int, batch: int, head_dim: int = 128) -> int:
  """The group launch_bwd_sm90 picks: Q and dO (float32 bytes, all query heads of a KV head)
  of a group within GROUP_BYTES, doubled while the group's tiles cover under 15/16 of the SMs,
  at most 16 pairs (4 at 4 or fewer key tiles)."""
  per_head = seqlen * head_dim * 4 * (heads // kv_heads)
  pairs = kv_heads * batch
  group = max(1, min(GROUP_BYTES // per_head, pairs))
  tiles = key_tiles(seqlen, head_dim)
  while group * tiles * 16 < SMS * 15 and group < pairs:
    group *= 2
  return min(group, pairs, 4 if tiles <= 4 else 16)


def busy(seqlen: int, heads: int, kv_heads: int, batch: int, group: int,
         head_dim: int = 128) -> float:
  """Total work over SMS x the time the last CTA ends."""
  tiles, pairs = key_tiles(seqlen, head_dim), kv_heads * batch
  steps_per_tile = heads // kv_heads
  work = []
  for first in range(0, pairs, group):
    members = min(group, pairs - first)
    for rank in range(tiles):
      work += [steps_per_tile * (tiles - rank) + CTA_COST] * members
  free = [0.0] * SMS
  end = 0.0
  for w in work:
    t = heapq.heappop(free) + w
    heapq.heappush(free, t)
    end = max(end, t)
  return sum(work) / (SMS * end)


def main():
  shapes = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or [
      (8, 2048, 16, 4), (2, 8192, 16, 4), (8, 2048, 16, 16), (2, 8192, 16, 16)]
  for batch, seqlen, heads, kv_heads, *dim in shapes:
    head_dim = dim[0] if dim else 128
    chosen = launcher_group(seqlen, heads, kv_heads, batch, head_dim)
    others = "  ".join(f"{g}: {busy(seqlen, heads, kv_heads, batch, g, head_dim):.0%}"
                       for g in (1, 2, 4, 8, 16) if g <= kv_heads * batch)
    chosen_busy = busy(seqlen, heads, kv_heads, batch, chosen, head_dim)
    print(f"B {batch} S {seqlen} heads {heads}/{kv_heads} D{head_dim}: launcher's group {chosen} "
          f"-> {chosen_busy:.0%} busy; by group  {others}")


if __name__ == "__main__":
  main()
