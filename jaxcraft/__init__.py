"""jaxcraft: hand-written CUDA and CPU kernels as first-class JAX operations."""

from jaxcraft.ops.norm import layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm"]
__version__ = "0.1.0"
