"""Flax linen modules backed by jaxcraft kernels (needs `pip install jaxcraft[flax]`)."""

from jaxcraft.nn.normalization import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]
