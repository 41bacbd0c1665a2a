"""Flax nnx modules backed by jaxcraft kernels (needs `pip install jaxcraft[flax]`)."""

from jaxcraft.nnx.attention import MultiHeadAttention, dot_product_attention
from jaxcraft.nnx.normalization import LayerNorm, RMSNorm
from jaxcraft.nnx.transformer import MLP, TransformerBlock

__all__ = ["LayerNorm", "MLP", "MultiHeadAttention", "RMSNorm", "TransformerBlock",
           "dot_product_attention"]
