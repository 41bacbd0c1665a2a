"""Shared pieces of the sharding tests: the 4 x 2 mesh of virtual CPU devices
(conftest sets 8) and the collectives a compiled function contains."""

import jax
import pytest

COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def cpu_mesh(axis_type):
  """A ("data": 4, "model": 2) mesh of the first 8 CPU devices (skips with fewer)."""
  if len(jax.devices("cpu")) < 8:
    pytest.skip("needs 8 CPU devices")
  return jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2,
                       devices=jax.devices("cpu")[:8])


def collectives(fn, *args):
  """The COLLECTIVES in the compiled HLO of jit(fn)(*args), in COLLECTIVES' order."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  return [c for c in COLLECTIVES if c in text]
