"""Flax nnx modules backed by jaxcraft kernels (needs `pip install jaxcraft[flax]`)."""

from jaxcraft.nnx.normalization import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]
