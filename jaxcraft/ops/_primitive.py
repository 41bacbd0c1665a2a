"""Machinery shared by every jaxcraft op.

Each op has two primitives:
- a *kernel* primitive whose lowering is the jaxcraft FFI custom call on
  platforms where the kernel is built, and the op's pure-JAX reference
  elsewhere (any other platform, or a CPU-only build running on a GPU);
- a *partitioned* primitive that users' transformations see: it carries the
  batching rule, and lowers through `custom_partitioning` so that sharded
  `jax.jit` runs the kernel per shard instead of gathering whole arrays.
  (`custom_partitioning` has no batching rule of its own, hence the outer
  primitive.)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax._src import dispatch
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from jaxcraft import _ffi

IMPLEMENTATIONS = (None, "cuda", "cpu", "xla")
NOT_MAPPED = None  # how batching rules mark an operand without a batch axis
KERNEL_PLATFORMS = ("cpu", "cuda")


def check_implementation(implementation: str | None) -> None:
  """Rejects unknown names, and kernels that this build does not have."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        "implementation must be None, 'cuda', 'cpu' or 'xla'; got "
        f"{implementation!r}")
  if implementation in KERNEL_PLATFORMS and not _ffi.has_kernels(implementation):
    why = _ffi.extension_error()
    if implementation == "cuda":
      raise ValueError(f"implementation='cuda': {_ffi.cuda_kernels_missing()}")
    raise ValueError(f"implementation={implementation!r}: jaxcraft was built without "
                     f"{implementation} kernels (the extension failed to import: {why})")


def policy_choice(entry, dtype):
  """A policy table's entry for one dtype: the entry itself, or where it is
  a dict by dtype name (the choice differs by dtype), that dtype's value."""
  return entry[jnp.dtype(dtype).name] if isinstance(entry, dict) else entry


def new_primitive(name: str, abstract_eval: Callable) -> Primitive:
  """A primitive with several results, dispatched by compiling its lowering;
  the caller registers the lowerings."""
  prim = Primitive(name)
  prim.multiple_results = True
  prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
  prim.def_abstract_eval(abstract_eval)
  return prim


def kernel_primitive(name: str, *, target: str, abstract_eval: Callable,
                     reference: Callable, ffi_attrs: Callable[..., dict],
                     unsupported: Callable[..., str | None] | None = None,
                     policy: Callable[..., str | None] | None = None) -> Primitive:
  """A primitive lowered to FFI `target` where built, else to `reference`.

  `reference(*operands, **params)` and `ffi_attrs(**params)` (the attributes
  the handler reads) both receive the primitive's params, which include
  `implementation`, directly or as a field of a `cfg` param. Both hooks are
  called as `hook(platform, avals_in, **params)` and may name a reason to run
  the reference instead of the platform's kernel. `unsupported`: the kernel
  cannot take these inputs (when that kernel was forced, the reason is
  raised). `policy`: under implementation=None only, the reference is faster
  here.
  """
  prim = new_primitive(name, abstract_eval)

  def reference_lowering(ctx, *args, **params):
    return mlir.lower_fun(functools.partial(reference, **params),
                          multiple_results=True)(ctx, *args)

  def platform_lowering(ctx, *args, platform, **params):
    implementation = (params["cfg"].implementation if "cfg" in params
                      else params["implementation"])
    if implementation not in (None, platform):
      raise ValueError(
          f"implementation={implementation!r} was requested, but this "
          f"computation is being compiled for {platform}")
    why = unsupported(platform, ctx.avals_in, **params) if unsupported else None
    if why is None and implementation is None and policy:
      why = policy(platform, ctx.avals_in, **params)
    built = _ffi.has_kernels(platform)
    if platform == "cuda" and not built:
      _ffi.warn_cuda_kernels_missing()
    if built and why is None:
      return jax.ffi.ffi_lowering(target)(ctx, *args, **ffi_attrs(**params))
    if implementation == platform:
      check_implementation(implementation)  # raises if the kernels are not built
      raise ValueError(f"implementation={implementation!r}: {why}")
    return reference_lowering(ctx, *args, **params)

  mlir.register_lowering(prim, reference_lowering)
  for platform in KERNEL_PLATFORMS:
    mlir.register_lowering(
        prim, functools.partial(platform_lowering, platform=platform),
        platform=platform)
  return prim


def partitioned_primitive(name: str, *, abstract_eval: Callable,
                          batching_rule: Callable,
                          make_partitioned: Callable[..., Callable]) -> Primitive:
  """The user-facing primitive of an op.

  `make_partitioned(shapes, **params)` returns the op's `PartitionedCall`
  (built by `partitioned_call`) given the operands' shapes; it is called once
  per (shapes, params).
  """
  prim = new_primitive(name, abstract_eval)
  batching.primitive_batchers[prim] = batching_rule
  cached = functools.cache(make_partitioned)

  def lowering(ctx, *args, **params):
    shapes = tuple(tuple(a.shape) for a in ctx.avals_in)
    call = cached(shapes, **params)
    # One device (eager dispatch, plain jit): nothing to partition.
    # custom_partitioning cannot lower without a device assignment.
    axis_ctx = ctx.module_context.axis_context
    devices = getattr(axis_ctx, "device_assignment", ())
    fn = call.local if devices is None or len(devices or ()) == 1 else call.partitioned
    return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

  mlir.register_lowering(prim, lowering)
  # Like jax's cuDNN attention: jit must know the devices at lowering time for
  # custom_partitioning to see the mesh.
  dispatch.prim_requires_devices_during_lowering.add(prim)
  return prim


class PartitionedCall(NamedTuple):
  local: Callable        # operands -> outputs on one device's shards
  partitioned: Callable  # custom_partitioning wrapper of `local`


class Plan(NamedTuple):
  """What `choose_shardings` decides (see `partitioned_call`)."""
  arg_specs: Any
  result_specs: Any
  psum_axes: Any
  body: Callable | None = None  # per-device function; None: the op's local_fn


def partitioned_call(local_fn: Callable, *, sharding_rule: str,
                     choose_shardings: Callable, **rule_kwargs: Any) -> PartitionedCall:
  """Wraps `local_fn` (operands -> list of outputs, on per-device shapes).

  `choose_shardings(mesh, arg_specs)` gets each operand's PartitionSpec
  (None when the sharding is not a mesh sharding) and returns a `Plan` (or
  its first three fields as a tuple): the layout the kernel runs in (XLA
  reshards operands into it), for each output the mesh axes it must be
  summed over (outputs that reduce over rows split across devices), or (),
  and optionally a `body` to run per device instead of `local_fn`: one that
  communicates over mesh axes itself (its collectives may name any mesh
  axis: the partitioned body runs with every axis manual).
  """
  fn = custom_partitioning(local_fn)

  def specs_of(mesh, arg_shapes):
    return [s.sharding.spec if isinstance(s.sharding, NamedSharding) else None
            for s in arg_shapes]

  def partition(mesh, arg_shapes, result_shape):
    plan = Plan(*choose_shardings(mesh, specs_of(mesh, arg_shapes)))
    body = plan.body or local_fn

    def lowered(*args):
      outs = body(*args)
      return [jax.lax.psum(o, axes) if axes else o for o, axes in zip(outs, plan.psum_axes)]

    # Results are a list (local_fn returns one); operands a tuple.
    result_shardings = [NamedSharding(mesh, s) for s in plan.result_specs]
    return mesh, lowered, result_shardings, tuple(NamedSharding(mesh, s) for s in plan.arg_specs)

  def infer(mesh, arg_shapes, result_shape):
    plan = Plan(*choose_shardings(mesh, specs_of(mesh, arg_shapes)))
    return [NamedSharding(mesh, s) for s in plan.result_specs]

  fn.def_partition(partition=partition, infer_sharding_from_operands=infer,
                   sharding_rule=sharding_rule, **rule_kwargs)
  return PartitionedCall(local_fn, fn)


def move_to_front(x, dim, size):
  """The batched operand with its batch axis first (broadcast if unbatched)."""
  if dim is NOT_MAPPED:
    return jax.numpy.broadcast_to(x, (size, *x.shape))
  return jax.numpy.moveaxis(x, dim, 0)


def result_aval(like, shape, dtype, spec=()):
  """Abstract value for a result: `shape`/`dtype`, on the mesh of the operand
  `like` and varying over the same manual axes (inside `shard_map`), with its
  dimensions sharded as `spec` says (default: not sharded)."""
  spec = tuple(spec) + (None,) * (len(shape) - len(spec))
  sharding = NamedSharding(like.sharding.mesh, PartitionSpec(*spec))
  return like.update(shape=tuple(shape), dtype=dtype, weak_type=False, sharding=sharding)


def row_spec(aval, keep: int):
  """The first `keep` entries of an operand's sharding spec (row axes)."""
  spec = tuple(getattr(aval.sharding, "spec", ()))
  return (spec + (None,) * keep)[:keep]


def varying_axes(x) -> frozenset:
  """Manual mesh axes over which x varies inside shard_map (empty outside).
  The attribute moved between JAX versions: `.vma`, or `.mat.varying`."""
  aval = jax.typeof(x)
  vma = getattr(aval, "vma", None)
  if vma is None:
    vma = getattr(getattr(aval, "mat", None), "varying", frozenset())
  return frozenset(vma)


def sum_to_match(grad, primal):
  """A parameter's cotangent summed over the manual axes where it varies but
  the primal does not (a shard_map'ed gradient of a replicated parameter)."""
  extra = tuple(sorted(varying_axes(grad) - varying_axes(primal)))
  return jax.lax.psum(grad, extra) if extra else grad
