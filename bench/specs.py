"""Named benchmark shapes; the small ones double as test shapes, so that the
benchmarked shapes are also the tested ones. Byte counts are explicit formulas."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class NormSpec:
  """bf16 rows of `cols` columns, as many as make x `mb` MB: larger than the
  H200's 50 MB L2, so every pass reads HBM, and large enough that a call's
  fixed cost (1-8 us beyond its kernel in an XLA chain) is a few percent of
  it (at 64 MB, up to a sixth)."""
  cols: int
  mb: int = 256

  @property
  def rows(self) -> int:
    return (self.mb << 20) // (2 * self.cols)

  @property
  def name(self) -> str:
    return f"{self.rows // 1024}k x {self.cols}" if self.rows >= 1024 else f"{self.rows} x {self.cols}"

  def fwd_bytes(self, itemsize: int, residual: bool) -> int:
    """Read x (and residual), write y (and h)."""
    passes = 4 if residual else 2
    return passes * self.rows * self.cols * itemsize

  def bwd_bytes(self, itemsize: int, residual: bool) -> int:
    """Read dy and h (and the cotangent of h), write dh (the residual's
    gradient is the same array). The dscale/dbias partial sums are not
    counted: they are the kernel's overhead."""
    passes = 4 if residual else 3
    return passes * self.rows * self.cols * itemsize


NORM_SPECS = [NormSpec(1 << k) for k in range(9, 17)]  # 512 ... 65536 columns


@dataclasses.dataclass(frozen=True)
class ActivationSpec:
  """An activation over [rows, cols] outputs (gelu, bias_gelu: x is [rows,
  cols] too; swiglu, geglu: x is [rows, 2 cols], its halves a and b). The
  "_erf" ops are the erf form of the GELU (approximate=False)."""
  op: str
  rows: int
  cols: int

  @property
  def gated(self) -> bool:
    return self.op.removesuffix("_erf") in ("swiglu", "geglu")

  @property
  def has_bias(self) -> bool:
    return self.op.removesuffix("_erf") == "bias_gelu"

  @property
  def in_cols(self) -> int:
    return 2 * self.cols if self.gated else self.cols

  @property
  def name(self) -> str:
    return f"{self.rows // 1024}k x {self.in_cols}"

  def _bias_bytes(self) -> int:
    return 4 * self.cols if self.has_bias else 0  # float32 [cols]

  def fwd_bytes(self, itemsize: int) -> int:
    """Read x, write y (bias_gelu: plus the bias)."""
    return self.rows * (self.in_cols + self.cols) * itemsize + self._bias_bytes()

  def bwd_bytes(self, itemsize: int) -> int:
    """The backward: read x and dy, write dx (bias_gelu: plus the bias read
    and its gradient written)."""
    return self.rows * (2 * self.in_cols + self.cols) * itemsize + 2 * self._bias_bytes()

  def fwd_bwd_bytes(self, itemsize: int) -> int:
    """Forward, plus the backward."""
    return self.fwd_bytes(itemsize) + self.bwd_bytes(itemsize)


ACTIVATION_SPECS = ([ActivationSpec(op, 16384, c) for op in ("gelu", "bias_gelu") for c in (4096, 14336)]
                    + [ActivationSpec(op, 16384, 14336)
                       for op in ("swiglu", "geglu", "gelu_erf", "bias_gelu_erf", "geglu_erf")])
# Small versions of the same shapes: JAXCRAFT_BENCH_ACTIVATIONS_SMOKE=1 runs
# the code path anywhere (a CPU check; the numbers mean little).
ACTIVATION_SMOKE_SPECS = [ActivationSpec(s.op, 64, s.cols // 64) for s in ACTIVATION_SPECS]



@dataclasses.dataclass(frozen=True)
class SoftmaxSpec:
  """Softmax over the last axis of [rows, cols] (attention-score rows,
  vocabulary-sized logits)."""
  rows: int
  cols: int

  @property
  def name(self) -> str:
    k = f"{self.cols // 1024}k" if self.cols >= 1024 else str(self.cols)
    return f"{self.rows // 1024}k x {k}" if self.rows >= 1024 else f"{self.rows} x {k}"

  def fwd_bytes(self, itemsize: int) -> int:
    """Read x, write y."""
    return 2 * self.rows * self.cols * itemsize

  def bwd_bytes(self, itemsize: int) -> int:
    """The backward: read y and dy, write dx."""
    return 3 * self.rows * self.cols * itemsize

  def fwd_bwd_bytes(self, itemsize: int) -> int:
    """Forward, plus the backward."""
    return self.fwd_bytes(itemsize) + self.bwd_bytes(itemsize)


# 8192 f32 columns: the widest rows one block of the backward kernel holds;
# 32768 and 131072: rows over thread-block clusters (sm_90), or for f32
# 131072 the stream kernels (jaxcraft/ops/softmax.py's limits).
SOFTMAX_SPECS = [SoftmaxSpec(16384, 4096), SoftmaxSpec(16384, 8192), SoftmaxSpec(16384, 32768),
                 SoftmaxSpec(4096, 131072)]
# JAXCRAFT_BENCH_SOFTMAX_SMOKE=1: the code path anywhere (the numbers mean little).
SOFTMAX_SMOKE_SPECS = [SoftmaxSpec(64, s.cols // 64) for s in SOFTMAX_SPECS]

@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """bf16 self-attention, 16k tokens per batch, hidden 2048 (N = 2048 / D); `group` query
  heads share each KV head (grouped-query attention when > 1)."""
  head_dim: int
  seqlen: int
  causal: bool
  tokens: int = 16384
  hidden: int = 2048
  group: int = 1

  @property
  def batch(self) -> int:
    return max(1, self.tokens // self.seqlen)

  @property
  def heads(self) -> int:
    return self.hidden // self.head_dim

  @property
  def kv_heads(self) -> int:
    return self.heads // self.group

  @property
  def name(self) -> str:
    gqa = f" GQA {self.heads}/{self.kv_heads}" if self.group > 1 else ""
    return f"D{self.head_dim} S{self.seqlen}{' causal' if self.causal else ''}{gqa}"

  def fwd_flops(self) -> float:
    """4 B N S^2 D (two matmuls), halved when causal."""
    flops = 4.0 * self.batch * self.heads * self.seqlen ** 2 * self.head_dim
    return flops / 2 if self.causal else flops

  def fwd_bwd_flops(self) -> float:
    return 3.5 * self.fwd_flops()


ATTENTION_SPECS = [AttentionSpec(d, s, c) for d in (64, 128, 256)
                   for s in (512, 1024, 2048, 4096, 8192, 16384) for c in (False, True)]


@dataclasses.dataclass(frozen=True)
class RingSpec:
  """bf16 ring attention (context parallelism): one sequence of `seqlen`
  tokens split over `devices` GPUs."""
  seqlen: int
  devices: int = 2
  heads: int = 16
  head_dim: int = 128
  causal: bool = True
  batch: int = 1

  @property
  def name(self) -> str:
    k = f"{self.seqlen // 1024}k" if self.seqlen >= 1024 else str(self.seqlen)
    return f"S{k} N{self.heads} D{self.head_dim}{' causal' if self.causal else ''} / {self.devices}"

  def fwd_flops(self, seqlen=None) -> float:
    """4 B N S^2 D (two matmuls), halved when causal; `seqlen` defaults to the whole sequence."""
    s = self.seqlen if seqlen is None else seqlen
    flops = 4.0 * self.batch * self.heads * s ** 2 * self.head_dim
    return flops / 2 if self.causal else flops

  def fwd_bwd_flops(self, seqlen=None) -> float:
    return 3.5 * self.fwd_flops(seqlen)


RING_SPECS = [RingSpec(32768), RingSpec(131072)]
# JAXCRAFT_BENCH_RING_SMOKE=1: the code path on 2 virtual CPU devices; the numbers mean nothing.
RING_SMOKE_SPECS = [RingSpec(64, heads=2, head_dim=64)]


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """One training step of jaxcraft/examples/gpt.py's GPT: bf16 activations, float32
  parameters and Adam state, causal attention, SwiGLU MLP, tied output head."""
  layers: int = 12
  d_model: int = 1024
  heads: int = 16
  seqlen: int = 2048
  batch: int = 8
  vocab: int = 32768
  mlp_hidden: int = 2816  # SwiGLU at ~8/3 d_model costs what a 4 d_model GELU MLP does

  @property
  def name(self) -> str:
    return f"L{self.layers} d{self.d_model} S{self.seqlen} B{self.batch}"

  @property
  def tokens(self) -> int:
    return self.batch * self.seqlen

  def matmul_params(self) -> int:
    """Weights each token is multiplied by: per layer query, key, value, out (4 d^2) and the
    MLP's wi and wo (3 d f); the output head (d V)."""
    d = self.d_model
    return self.layers * (4 * d * d + 3 * d * self.mlp_hidden) + d * self.vocab

  def flops(self) -> float:
    """Model FLOPs of a step: 6 per weight and token (2 forward, 4 backward), plus causal
    attention's two S x S matmuls, 2 B S^2 d forward per layer (half of 4 B S^2 d), x3 with
    the backward."""
    attention = 3 * self.layers * 2.0 * self.batch * self.seqlen ** 2 * self.d_model
    return 6.0 * self.matmul_params() * self.tokens + attention


TRAIN_SPECS = {
    "full": TrainSpec(),
    "quick": TrainSpec(layers=4),  # JAXCRAFT_BENCH_QUICK=1 (short device leases)
    # A CPU smoke check: the plumbing runs; the numbers mean nothing.
    "smoke": TrainSpec(layers=2, d_model=128, heads=4, seqlen=128, batch=2, vocab=256,
                       mlp_hidden=384),
}


@dataclasses.dataclass(frozen=True)
class EmbeddingSpec:
  """An embedding lookup: `ids` ids into a [vocab, dim] table. `skew`: the
  fraction of ids drawn from `hot` rows (many repeats), the rest uniform.
  `dtype`: the table's (a float32 table: the training master copy)."""
  vocab: int
  dim: int
  ids: int
  skew: float = 0.0
  hot: int = 100
  dtype: str = "bfloat16"

  @property
  def name(self) -> str:
    k = lambda n: f"{n // 1024}k" if n >= 1024 else str(n)
    kind = f" skew{round(100 * self.skew)}/{self.hot}" if self.skew else " uniform"
    dtype = "" if self.dtype == "bfloat16" else f" {self.dtype}"
    return f"{k(self.vocab)} x {self.dim}{dtype} {k(self.ids)} ids{kind}"

  def fwd_bytes(self, itemsize: int) -> int:
    """Read the ids' rows of the table, write them out (ids: 4 bytes each)."""
    return 2 * self.ids * self.dim * itemsize + 4 * self.ids

  def bwd_bytes(self, itemsize: int) -> int:
    """Read the cotangent [ids, dim]; write the whole dense gradient [vocab,
    dim] once (every row, zeros included, must be written: it is the output).
    XLA's scatter-add touches more: it writes the zero table, then
    reads-modifies-writes the ids' rows, ~(vocab + 2 ids) x dim; counted here
    is only what must be touched."""
    return (self.ids + self.vocab) * self.dim * itemsize + 4 * self.ids

  def fwd_bwd_bytes(self, itemsize: int) -> int:
    return self.fwd_bytes(itemsize) + self.bwd_bytes(itemsize)


EMBEDDING_SPECS = [EmbeddingSpec(131072, 4096, 16384), EmbeddingSpec(131072, 4096, 16384, skew=0.9),
                   EmbeddingSpec(32768, 1024, 16384), EmbeddingSpec(32768, 1024, 16384, skew=0.9),
                   EmbeddingSpec(131072, 4096, 16384, dtype="float32")]
# Small versions of the same layout (tests/test_embedding.py's shapes are
# smaller still); JAXCRAFT_BENCH_SMOKE=1 runs them (CPU plumbing check).
EMBEDDING_SMOKE_SPECS = [EmbeddingSpec(8192, 256, 2048), EmbeddingSpec(8192, 256, 2048, skew=0.9, hot=10),
                         EmbeddingSpec(8192, 256, 2048, dtype="float32")]
