"""A small decoder-only GPT trained with Adam on a synthetic language, three ways:

  --model jaxcraft  `jaxcraft.nn.TransformerBlock`: the residual add and RMSNorm in one kernel,
                    causal flash attention with no mask array, SwiGLU MLP
  --model flax      the same block from stock flax.linen parts (`RMSNorm`,
                    `MultiHeadDotProductAttention` with a `make_causal_mask` mask)
  --model dropin    the stock block with `jaxcraft.nn.RMSNorm` and
                    `attention_fn=jaxcraft.nn.dot_product_attention`: only the imports change
                    (the kernel reads Flax's causal mask array, where jaxcraft's block passes
                    the causal flag and no array)

The three have one parameter tree, so one init serves all of them and their loss curves can be
compared: `python -m jaxcraft.examples.gpt --compare --plot loss.png`.

The data (`make_batches`) needs no download: each sequence is a walk of a fixed random Markov
chain (every token has `branching` possible successors) followed by a copy of the walk. The
walk is predictable up to the chain's entropy (about 1.1 nats a token with 4 successors, from
ln(vocab) = 4.2 at the start), which the embeddings learn within ~100 steps; the copy is
predictable exactly, but only by attending half a sequence back, which takes longer. The
loss floor is therefore about half the chain's entropy, ~0.55.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxcraft.nn

KINDS = ("jaxcraft", "flax", "dropin")
EMBED_STD = 0.02  # GPT-2's: with the tied head, initial logits are ~0 and the loss ~ln(vocab)


@dataclasses.dataclass(frozen=True)
class Config:
  """Model, data and optimizer settings; the defaults train 200 steps on 2 CPU cores in 15-30 s.

  Attributes:
    vocab: vocabulary size.
    seq_len: model input length (a data sequence has seq_len + 1 tokens).
    batch: sequences per step.
    layers: transformer blocks.
    d_model: model width.
    heads: attention heads.
    mlp_hidden: the SwiGLU MLP's hidden width.
    tied_head: the output head is the transposed token embedding.
    dtype: activation dtype name, "float32" or "bfloat16"; parameters and
      Adam state are float32.
    lr: Adam's learning rate.
    seed: seed of the initialization and the data.
    branching: successors of each token in the data's Markov chain.
  """
  vocab: int = 64
  seq_len: int = 64  # model input length; a sequence carries one more token, the last target
  batch: int = 16
  layers: int = 2
  d_model: int = 128
  heads: int = 4
  mlp_hidden: int = 256
  tied_head: bool = True
  dtype: str = "float32"  # activations; parameters and Adam state are float32
  lr: float = 3e-3
  seed: int = 0
  branching: int = 4  # successors of each token in the data's Markov chain


class StockBlock(linen.Module):
  """`jaxcraft.nn.TransformerBlock` built from stock flax.linen parts.

  The same submodule names, parameter shapes and math:
  h = x + attention(norm(x)); out = h + mlp(norm(h)), causal through a mask
  array. Called on x [B, T, d_model], returns [B, T, d_model].

  Attributes:
    num_heads: attention heads.
    mlp_hidden: the MLP's hidden width.
    dtype: computation dtype.
    param_dtype: parameter dtype.
    norm: the norm module class (`flax.linen.RMSNorm` or
      `jaxcraft.nn.RMSNorm`).
    attention_fn: the attention function of
      `flax.linen.MultiHeadDotProductAttention`.
  """
  num_heads: int
  mlp_hidden: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  norm: Callable[..., linen.Module] = linen.RMSNorm
  attention_fn: Callable = linen.dot_product_attention

  @linen.compact
  def __call__(self, x):
    norm = lambda name: self.norm(dtype=self.dtype, param_dtype=self.param_dtype, name=name)
    attention = linen.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype, param_dtype=self.param_dtype,
        attention_fn=self.attention_fn, name="attention")
    h = x + attention(norm("attention_norm")(x), mask=linen.make_causal_mask(x[..., 0]))
    mlp = StockMLP(self.mlp_hidden, dtype=self.dtype, param_dtype=self.param_dtype, name="mlp")
    return h + mlp(norm("mlp_norm")(h)).astype(h.dtype)


class StockMLP(linen.Module):
  """`jaxcraft.nn.MLP` (SwiGLU) as stock Flax writes it.

  The same Dense layers and names, the activation in jax.nn. Called on
  x [..., d_model], returns [..., d_model].

  Attributes:
    hidden: the hidden width.
    dtype: computation dtype.
    param_dtype: parameter dtype.
  """
  hidden: int
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @linen.compact
  def __call__(self, x):
    dense = lambda features, name: linen.Dense(features, dtype=self.dtype,
                                               param_dtype=self.param_dtype, name=name)
    a, b = jnp.split(dense(2 * self.hidden, "wi")(x), 2, axis=-1)
    return dense(x.shape[-1], "wo")(jax.nn.silu(a) * b)


class GPT(linen.Module):
  """Token + learned position embeddings, `layers` blocks, a final norm, an output head.

  Called on int tokens [B, T] (T <= seq_len), returns logits
  [B, T, vocab] in the config's dtype. The head is the token embedding,
  transposed, when `tied_head`.

  Attributes:
    config: the model settings.
    block: block(name=...) builds one block, [B, T, d_model] -> [B, T, d_model].
    norm: the final norm's module class.
  """
  config: Config
  block: Callable[..., linen.Module]  # block(name=...): [B, T, d_model] -> [B, T, d_model]
  norm: Callable[..., linen.Module]  # the final norm's class

  @linen.compact
  def __call__(self, tokens):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    init = linen.initializers.normal(EMBED_STD)
    embed = linen.Embed(c.vocab, c.d_model, dtype=dtype, embedding_init=init, name="embed")
    position = linen.Embed(c.seq_len, c.d_model, dtype=dtype, embedding_init=init,
                           name="position_embed")
    x = embed(tokens) + position(jnp.arange(tokens.shape[-1]))
    for i in range(c.layers):
      x = self.block(name=f"block_{i}")(x)
    x = self.norm(dtype=dtype, name="final_norm")(x)
    if c.tied_head:
      return embed.attend(x)
    return linen.Dense(c.vocab, use_bias=False, dtype=dtype, name="head")(x)


def make_model(kind: str, config: Config, attention_fn: Callable | None = None) -> GPT:
  """The GPT with `kind`'s blocks.

  Args:
    kind: "jaxcraft", "flax" or "dropin" (see the module docstring).
    config: the model settings.
    attention_fn: replaces a stock kind's attention function (the
      benchmark's cuDNN variant); None keeps the kind's own.

  Returns:
    The `GPT` module.

  Raises:
    ValueError: an unknown `kind`, or `attention_fn` with "jaxcraft".
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
  if kind == "jaxcraft" and attention_fn is not None:
    raise ValueError("attention_fn replaces the stock blocks' attention; 'jaxcraft' has its own")
  layer = dict(num_heads=config.heads, mlp_hidden=config.mlp_hidden,
               dtype=jnp.dtype(config.dtype), param_dtype=jnp.float32)
  if kind == "jaxcraft":
    block = functools.partial(jaxcraft.nn.TransformerBlock, norm="rms", activation="swiglu",
                              is_causal=True, **layer)
    return GPT(config, block, jaxcraft.nn.RMSNorm)
  norm = linen.RMSNorm if kind == "flax" else jaxcraft.nn.RMSNorm
  default_fn = (linen.dot_product_attention if kind == "flax"
                else jaxcraft.nn.dot_product_attention)
  block = functools.partial(StockBlock, norm=norm, attention_fn=attention_fn or default_fn,
                            **layer)
  return GPT(config, block, norm)


def _init_tokens(config: Config):
  return jnp.zeros((1, config.seq_len), jnp.int32)  # parameter shapes do not depend on batch


def init_params(config: Config):
  """One initialization for every kind (their parameter trees are identical).

  Args:
    config: the model settings (its seed seeds the initialization).

  Returns:
    The parameter tree (float32 leaves).
  """
  model = make_model("flax", config)
  return jax.jit(model.init)(jax.random.key(config.seed), _init_tokens(config))["params"]


def param_shapes(model: GPT, config: Config):
  """The model's parameter tree with (shape, dtype) leaves, without computing anything.

  Args:
    model: a `GPT`.
    config: its settings.

  Returns:
    The parameter tree with (shape, dtype) tuples as leaves.
  """
  tree = jax.eval_shape(model.init, jax.random.key(0), _init_tokens(config))["params"]
  return jax.tree.map(lambda a: (a.shape, a.dtype), tree)


def check_params(model: GPT, config: Config, params) -> None:
  """Checks that `params` has exactly `model`'s tree, shapes and dtypes.

  Args:
    model: a `GPT`.
    config: its settings.
    params: the parameter tree to check.

  Raises:
    ValueError: the tree, a shape or a dtype differs.
  """
  expected = param_shapes(model, config)
  got = jax.tree.map(lambda a: (a.shape, a.dtype), params)
  if got != expected:
    raise ValueError(f"parameters do not fit the model: got {got}, expected {expected}")


def make_batches(config: Config, steps: int) -> np.ndarray:
  """Training data: Markov-chain walks followed by their copies (see the module docstring).

  Args:
    config: the data settings (vocab, seq_len, batch, branching, seed). The
      chain depends on the seed only, batch i on the seed and i.
    steps: how many batches.

  Returns:
    int32 [steps, batch, seq_len + 1].
  """
  rng = np.random.default_rng(config.seed)
  k = config.branching
  successors = np.stack([rng.choice(config.vocab, k, replace=False)
                         for _ in range(config.vocab)])
  cumulative = rng.dirichlet(np.ones(k), size=config.vocab).cumsum(-1)
  half = config.seq_len // 2 + 1  # walk + copy cover the seq_len + 1 tokens

  def batch(step):
    rng = np.random.default_rng([config.seed, step])
    walk = np.empty((config.batch, half), np.int32)
    walk[:, 0] = rng.integers(config.vocab, size=config.batch)
    for t in range(1, half):
      prev = walk[:, t - 1]
      choice = (cumulative[prev] < rng.random(config.batch)[:, None]).sum(-1)
      walk[:, t] = successors[prev, np.minimum(choice, k - 1)]  # the cumsum may end below 1
    return np.concatenate([walk, walk], axis=1)[:, :config.seq_len + 1]
  return np.stack([batch(step) for step in range(steps)])


def make_train_step(model: GPT, optimizer: optax.GradientTransformation):
  """A jitted training step: next-token cross-entropy, one optimizer update.

  Args:
    model: a `GPT`.
    optimizer: an optax optimizer.

  Returns:
    step(params, opt_state, tokens) -> (params, opt_state, loss), with tokens
    int [B, T + 1] and the loss a float32 scalar (logits cast to float32).
    Params and optimizer state are donated, so the update happens in place.
  """
  def loss_fn(params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:]).mean()

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return step


class _Progress:
  """A tqdm bar when tqdm is installed, else a printed line every `every` steps. The loss is
  read (a device sync) only when shown, so steps keep overlapping."""

  def __init__(self, desc: str, total: int):
    self.desc, self.total, self.every = desc, total, max(1, total // 20)
    try:
      from tqdm import tqdm
    except ImportError:
      self.bar = None
    else:
      self.bar = tqdm(total=total, desc=desc)

  def update(self, step: int, loss) -> None:
    shown = (step + 1) % self.every == 0 or step + 1 == self.total
    if self.bar is not None:
      self.bar.update(1)
      if shown:
        self.bar.set_postfix(loss=f"{float(loss):.4f}")
    elif shown:
      print(f"{self.desc}: step {step + 1}/{self.total} loss {float(loss):.4f}", flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def train(kind: str, config: Config, steps: int, *, params=None, batches=None,
          progress: bool = True) -> np.ndarray:
  """Trains `kind` with Adam.

  Args:
    kind: "jaxcraft", "flax" or "dropin".
    config: the model, data and optimizer settings.
    steps: training steps.
    params: initial parameters (default `init_params(config)`); the
      caller's arrays are not donated.
    batches: int32 [>= steps, batch, seq_len + 1] (default
      `make_batches(config, steps)`).
    progress: show a progress bar (tqdm) or periodic loss lines.

  Returns:
    float32 [steps]: the loss of each step.

  Raises:
    ValueError: an unknown `kind`, or `params` that do not fit the model.
  """
  model = make_model(kind, config)
  params = init_params(config) if params is None else params
  check_params(model, config, params)
  batches = make_batches(config, steps) if batches is None else batches
  optimizer = optax.adam(config.lr)
  step_fn = make_train_step(model, optimizer)
  params = jax.tree.map(jnp.copy, params)  # donated by the step: the caller's stay valid
  opt_state = optimizer.init(params)
  bar = _Progress(kind, steps) if progress else None
  losses = []
  for i, tokens in enumerate(batches[:steps]):
    params, opt_state, loss = step_fn(params, opt_state, tokens)
    losses.append(loss)
    if bar is not None:
      bar.update(i, loss)
  if bar is not None:
    bar.close()
  return np.asarray(jax.device_get(losses), np.float32)


def plot(curves: dict[str, np.ndarray], path: str, title: str) -> None:
  """Writes loss curves as a PNG; prints a note and skips without matplotlib.

  Args:
    curves: kind -> float losses per step.
    path: the PNG's path.
    title: the plot's title.
  """
  try:
    import matplotlib
  except ImportError:
    print(f"matplotlib is not installed: skipped the plot {path}")
    return
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  # Matching curves overlap: distinct dashes keep each one visible.
  for (kind, losses), style in zip(curves.items(), ("-", "--", ":")):
    ax.plot(np.arange(1, len(losses) + 1), losses, style, label=kind, lw=1.5)
  ax.set_xlabel("step")
  ax.set_ylabel("training loss (nats / token)")
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  print(f"wrote {path}")


def _parse(argv) -> tuple[argparse.Namespace, Config]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", choices=KINDS, default="jaxcraft")
  parser.add_argument("--compare", action="store_true",
                      help="train every kind from the same init and data; compare the curves")
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--plot", metavar="PATH", help="write the loss curves to this PNG")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=Config.dtype)
  parser.add_argument("--untied", action="store_true", help="a separate output head")
  for field in ("batch", "seq_len", "layers", "d_model", "heads", "mlp_hidden", "lr", "seed"):
    default = getattr(Config, field)
    parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
  args = parser.parse_args(argv)
  config = Config(batch=args.batch, seq_len=args.seq_len, layers=args.layers,
                  d_model=args.d_model, heads=args.heads, mlp_hidden=args.mlp_hidden,
                  tied_head=not args.untied, dtype=args.dtype, lr=args.lr, seed=args.seed)
  return args, config


def main(argv=None) -> dict[str, np.ndarray]:
  """Runs the command line (see `--help`).

  Args:
    argv: the arguments (default: sys.argv[1:]).

  Returns:
    kind -> float32 [steps] loss curve, for each kind trained.
  """
  args, config = _parse(argv)
  kinds = KINDS if args.compare else (args.model,)
  params = init_params(config)
  batches = make_batches(config, args.steps)
  curves = {kind: train(kind, config, args.steps, params=params, batches=batches)
            for kind in kinds}
  tail = max(1, args.steps // 10)
  for kind, losses in curves.items():
    print(f"{kind:8s} loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(mean of the last {tail} steps {losses[-tail:].mean():.4f})")
  if args.compare:
    for kind in ("jaxcraft", "dropin"):
      print(f"max |loss({kind}) - loss(flax)| over {args.steps} steps: "
            f"{np.abs(curves[kind] - curves['flax']).max():.3g}")
  if args.plot:
    plot(curves, args.plot, f"GPT {config.layers}L d{config.d_model} {config.dtype}, "
                            f"batch {config.batch} x {config.seq_len}")
  return curves


if __name__ == "__main__":
  main()
