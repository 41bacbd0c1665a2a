"""The README's Python code blocks run, in order, in one namespace (the Flax
block uses arrays the API tour made), on the CPU, at the README's sizes."""

import pathlib
import re

import jax

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TEST_COMMAND = 'pip install ".[test]" && pytest -q -n 2 tests'

# Textual substitutions applied to the blocks before they run; each must
# match, so that a change to the README is noticed here. On a GPU machine
# jax.devices() lists the GPUs; the ring attention mesh is pinned to the CPU
# devices (tests/conftest.py makes 8 of them) like every other array here.
SUBSTITUTIONS = {
    'jax.devices()': 'jax.devices("cpu")',
}


def _blocks() -> list[str]:
  """The python blocks, each preceded by blank lines so that a traceback's
  line numbers are README.md's."""
  text = README.read_text()
  blocks = ["\n" * text.count("\n", 0, m.start(1)) + m.group(1)
            for m in PYTHON_BLOCK.finditer(text)]
  assert blocks, "README.md has no ```python blocks"
  for old, new in SUBSTITUTIONS.items():
    assert any(old in b for b in blocks), (
        f"README.md's python blocks no longer contain {old!r}: update SUBSTITUTIONS")
    assert "\n" not in old + new  # keeps the line numbers
    blocks = [b.replace(old, new) for b in blocks]
  return blocks


def test_readme_python_blocks_run_on_cpu():
  namespace = {"__name__": "readme"}
  with jax.default_device(jax.devices("cpu")[0]):
    for block in _blocks():
      exec(compile(block, str(README), "exec"), namespace)  # raising fails the test
    jax.block_until_ready([v for v in namespace.values() if isinstance(v, jax.Array)])


def test_readme_test_command_is_the_ci_command():
  """.ci/run runs exactly the README's test command."""
  assert TEST_COMMAND in README.read_text()
  ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  assert TEST_COMMAND in ci
