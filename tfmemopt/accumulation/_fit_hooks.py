"""Hooks around `tfmemopt.Model.fit`: how a higher layer reaches into fit.

`tfmemopt.Model.fit` runs Keras's loop inside every registered hook. A hook
is a callable `(model, args, kwargs) -> context manager`, given the model
and the arguments of `fit`. The out-of-memory report registers one
(`tfmemopt.tuning`, on import): it needs the estimator and the planner, which
sit above `accumulation` and import `Model`. Registering keeps the imports
one way: `accumulation` never imports `tuning`.
"""

from __future__ import annotations

import contextlib
from typing import Callable
from typing import ContextManager
from typing import Iterator

FitHook = Callable[[object, tuple, dict], ContextManager]

_HOOKS: list[FitHook] = []


def add_fit_hook(hook: FitHook) -> FitHook:
    """Registers `hook` (once); usable as a decorator."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)
    return hook


@contextlib.contextmanager
def around_fit(model, args: tuple, kwargs: dict) -> Iterator[None]:
    """Enters every registered hook, in the order they were added."""
    with contextlib.ExitStack() as stack:
        for hook in list(_HOOKS):
            stack.enter_context(hook(model, args, kwargs))
        yield
