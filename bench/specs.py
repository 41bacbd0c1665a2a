"""Named benchmark shapes; the small ones double as test shapes
(shared/DESIGN.md rule 8). Byte counts are explicit formulas."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class NormSpec:
  rows: int
  cols: int

  @property
  def name(self) -> str:
    return f"{self.rows // 1024}k x {self.cols}"

  def fwd_bytes(self, itemsize: int, residual: bool) -> int:
    """Read x (and residual), write y (and h)."""
    passes = 4 if residual else 2
    return passes * self.rows * self.cols * itemsize

  def fwd_bwd_bytes(self, itemsize: int, residual: bool) -> int:
    """Forward plus backward (read dy and h, write dh; plus the residual's
    passes: read r and write h forward, read dh_extra backward)."""
    passes = 5 + (3 if residual else 0)
    return passes * self.rows * self.cols * itemsize


NORM_SPECS = [NormSpec(16384, 1024), NormSpec(16384, 4096), NormSpec(16384, 8192),
              NormSpec(4096, 32768)]
# Small versions of the same shapes, for the test suite.
NORM_TEST_SPECS = [NormSpec(64, 1024), NormSpec(16, 8192), NormSpec(4, 32768)]
