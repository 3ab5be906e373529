"""One media item's vision encoding, evaluated over several steps so text streams keep moving.

MLX builds a graph lazily: calling the vision tower (or the model's ``get_input_embeddings``)
costs almost nothing until its output is evaluated. :class:`SplitEncode` makes that call with
each block of the tower wrapped to keep its output (still lazy), then each :meth:`step`
evaluates blocks in order until ``budget_s`` has passed (at least one block), and the last
step evaluates the features themselves. Every block's output is computed once, from the
previous one, so the features are the very arrays one evaluation of the whole graph gives,
in pieces; a running batch decodes between the pieces. A tower that evaluates something
while it builds its graph (a size read with ``.item()``) only moves that part to the first
step. The tower's block list is found by name (``blocks``, ``layers``); a tower without one
is evaluated whole.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

#: Attribute names of a vision tower's list of transformer blocks (Qwen-VL: ``blocks``;
#: CLIP, SigLIP, Pixtral, Idefics3: ``encoder.layers`` / ``transformer.layers``).
BLOCK_LIST_NAMES = ("blocks", "layers")
#: How deep to look for the block list under the tower (the encoder sits one or two modules down).
MAX_SEARCH_DEPTH = 3


def block_list(module: Any, depth: int = MAX_SEARCH_DEPTH) -> tuple[Any, str] | None:
    """(owner, attribute) of the first non-empty list of modules named in ``BLOCK_LIST_NAMES``
    under ``module``, breadth first; None without one."""
    level = [module]
    for _ in range(depth + 1):
        for owner in level:
            for name in BLOCK_LIST_NAMES:
                blocks = getattr(owner, name, None)
                if isinstance(blocks, list) and blocks and all(callable(b) for b in blocks):
                    return owner, name
        level = [child for owner in level for _, child in _children(owner)]
    return None


def _children(module: Any) -> list[tuple[str, Any]]:
    children = getattr(module, "children", None)
    if children is None:
        return []
    return [(name, child) for name, child in children().items() if hasattr(child, "children")]


class _Recorded:
    """A block that keeps each output it gives."""

    def __init__(self, block: Any, outputs: list[Any]):
        self._block, self._outputs = block, outputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._block(*args, **kwargs)
        self._outputs.append(out)
        return out


@contextlib.contextmanager
def recording(tower: Any) -> Iterator[list[Any]]:
    """Inside: the tower's blocks record their (lazy) outputs in the list given."""
    outputs: list[Any] = []
    found = block_list(tower)
    if found is None:
        yield outputs
        return
    owner, name = found
    blocks = getattr(owner, name)
    setattr(owner, name, [_Recorded(block, outputs) for block in blocks])
    try:
        yield outputs
    finally:
        setattr(owner, name, blocks)


class SplitEncode:
    """One item's encoding: ``build()`` makes the lazy graph (with ``tower``'s blocks
    recorded), :meth:`step` evaluates it a piece at a time; :attr:`result` once :attr:`done`."""

    def __init__(self, build: Callable[[], Any], tower: Any, budget_s: float | None):
        with recording(tower) as outputs:
            self._result = build()
        # budget None: the whole graph in one step (no block is evaluated on its own)
        self._pending = outputs if budget_s is not None else []
        self._budget_s = budget_s
        self.done = False
        self.steps = 0

    @property
    def result(self) -> Any:
        assert self.done, "step() until done"
        return self._result

    def step(self) -> bool:
        """Evaluate blocks until the budget has passed (at least one), else the result; True
        once the result is evaluated."""
        started = time.perf_counter()
        self.steps += 1
        while self._pending:
            mx.eval(_arrays(self._pending.pop(0)))  # dropped: the next block holds its own output
            if time.perf_counter() - started >= self._budget_s:
                return False
        mx.eval(_arrays(self._result))
        self.done = True
        return True


def _arrays(tree: Any) -> list[mx.array]:
    """The arrays in a block's output or a result (an array, or tuples / lists holding them)."""
    if isinstance(tree, mx.array):
        return [tree]
    if isinstance(tree, tuple | list):
        return [a for item in tree for a in _arrays(item)]
    return []
