"""One way to tell hooks of an event: the runs' (`tasks.hooks.RunHooks`), the limiter's
(`relayq.ratelimit.LimiterHooks`) and the circuit's (`relayq.circuit.CircuitHooks`).

An event names the hook method it is told through, by the method itself, when its class
is made, so a misspelt hook fails at import, never silently at the emit:

    @dataclass(frozen=True)
    class RunSettled(HookEvent, hook=RunHooks.after_run_settled):
        run_id: str

    await hooks.emit(RunSettled("run_1"))

An `Emitter` calls every hook that overrides the event's method, in the order they were
added for `before_*` methods and in reverse for `after_*` ones (a hook that opens
something in `before_turn` closes it after the hooks added later have seen the end). A
hook that raises is logged, by its name and the error's type (its message may quote what
it was looking at), and skipped: watching never fails the work it watches.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

__all__ = ["Emitter", "HookEvent"]

H = TypeVar("H")


class HookEvent:
    """The base of an event: `class E(HookEvent, hook=Hooks.after_e)` names its method."""

    __slots__ = ()

    hook: ClassVar[str]
    """The name of the hook method the event is told through."""

    def __init_subclass__(cls, *, hook: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if hook is None:
            # A dataclass with slots remakes its class, without the keyword: the name is
            # already on it.
            if not hasattr(cls, "hook"):
                raise TypeError(f"{cls.__name__} names no hook method (hook=Hooks.method)")
            return
        name = getattr(hook, "__name__", "")
        if not name.startswith(("before_", "after_")):
            raise TypeError(f"{cls.__name__}: {hook!r} is not a before_ or after_ hook method")
        cls.hook = name


class Emitter(Generic[H]):
    """Hooks of one kind (`base`, a class of no-op methods), told of events in order.

    For each method it keeps the hooks that override it, so an event nobody watches
    costs a dictionary lookup. `failure` is the log line of a hook that raised, with
    `%(hook)s`, `%(method)s` and `%(error)s` (the exception's type).
    """

    def __init__(self, hooks: Iterable[H] = (), *, base: type[H], failure: str) -> None:
        self.base = base
        self.failure = failure
        self._hooks: list[H] = []
        self._methods = tuple(name for name in vars(base) if name.startswith(("before_", "after_")))
        self._by_method: dict[str, tuple[H, ...]] = {}
        for hook in hooks:
            self.add(hook)

    def add(self, hook: H) -> None:
        """Tell `hook` of events after those added before it."""
        if not isinstance(hook, self.base):
            raise TypeError(f"{hook!r} is not a {self.base.__name__}")
        self._hooks.append(hook)
        self._by_method = {
            method: tuple(h for h in self._hooks if self._overrides(h, method))
            for method in self._methods
        }

    def _overrides(self, hook: H, method: str) -> bool:
        return getattr(type(hook), method) is not getattr(self.base, method)

    def watching(self, event: HookEvent, extra: Sequence[H] = ()) -> tuple[H, ...]:
        """The hooks to tell of `event`, in the order they are told: `extra` (an
        agent's own) after the rest, and the whole reversed for an `after_*` event."""
        method = event.hook
        if method not in self._methods:
            raise TypeError(f"{type(event).__name__} is no event of {self.base.__name__}")
        hooks = self._by_method.get(method, ())
        if extra:
            hooks = (*hooks, *(h for h in extra if self._overrides(h, method)))
        return tuple(reversed(hooks)) if method.startswith("after_") else hooks

    def emit_now(self, event: HookEvent, extra: Sequence[H] = ()) -> None:
        """Tell the hooks here and now: for hooks whose methods are plain and quick."""
        for hook in self.watching(event, extra):
            try:
                getattr(hook, event.hook)(event)
            except Exception as exc:
                self._failed(hook, event, exc)

    async def emit(self, event: HookEvent, extra: Sequence[H] = ()) -> None:
        """Tell the hooks from a loop: an `async def` method is awaited; a plain one runs
        on a thread (the loop's default executor), so a hook that blocks never stalls the
        loop, unless its hook says `on_loop` (quick, and written for the loop)."""
        for hook in self.watching(event, extra):
            try:
                call = getattr(hook, event.hook)
                if getattr(hook, "on_loop", False) or inspect.iscoroutinefunction(call):
                    result = call(event)
                else:
                    result = await asyncio.to_thread(call, event)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self._failed(hook, event, exc)

    def _failed(self, hook: H, event: HookEvent, exc: Exception) -> None:
        # In the log of the module that defines the hooks' kind (`tasks.hooks`, ...); an
        # error, since it is a bug, but with no traceback: its message may quote a value.
        logging.getLogger(self.base.__module__).error(
            self.failure,
            {"hook": type(hook).__name__, "method": event.hook, "error": type(exc).__name__},
        )
