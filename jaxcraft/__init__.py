"""jaxcraft: hand-written CUDA and CPU kernels as first-class JAX operations."""

import importlib

from jaxcraft import remat
from jaxcraft._ffi import EXPORT_DISABLED_CHECKS
from jaxcraft.ops.activations import bias_gelu, geglu, gelu, swiglu
from jaxcraft.ops.attention import dot_product_attention
from jaxcraft.ops.attention_dropout import attention_dropout_mask
from jaxcraft.ops.decode_attention import decode_attention
from jaxcraft.ops.embedding import embedding_lookup
from jaxcraft.ops.norm import layer_norm, rms_norm
from jaxcraft.ops.ring_attention import ring_attention
from jaxcraft.ops.softmax import softmax

__all__ = ["EXPORT_DISABLED_CHECKS", "attention_dropout_mask", "decode_attention", "dot_product_attention", "layer_norm",
           "ring_attention", "rms_norm", "remat", "nn", "nnx"]
__all__ += ["bias_gelu", "embedding_lookup", "geglu", "gelu", "softmax", "swiglu"]
__version__ = "0.1.0"


def __getattr__(name):
  # The Flax modules import flax, an optional dependency: load them on first use.
  if name in ("nn", "nnx"):
    return importlib.import_module(f"jaxcraft.{name}")
  raise AttributeError(f"module 'jaxcraft' has no attribute {name!r}")
