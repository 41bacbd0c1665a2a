"""Flax linen modules backed by jaxcraft kernels (needs `pip install jaxcraft[flax]`)."""

from jaxcraft.nn.attention import MultiHeadAttention, dot_product_attention
from jaxcraft.nn.normalization import LayerNorm, RMSNorm
from jaxcraft.nn.transformer import MLP, TransformerBlock

__all__ = ["LayerNorm", "MLP", "MultiHeadAttention", "RMSNorm", "TransformerBlock",
           "dot_product_attention"]
