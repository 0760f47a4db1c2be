"""`relayq.hooking`: an event names its hook method when its class is made, so a misspelt
hook fails at import; one emitter tells the runs', the limiter's and the circuit's hooks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from relayq.circuit import CircuitChange, CircuitHooks, circuit_hooks
from relayq.hooking import Emitter, HookEvent
from relayq.ratelimit import LimiterHooks, LimitWait


class Watcher:
    def before_step(self, event: Stepping) -> None: ...
    def after_step(self, event: Stepped) -> None: ...


@dataclass(frozen=True, slots=True)
class Stepping(HookEvent, hook=Watcher.before_step):
    n: int


@dataclass(frozen=True, slots=True)
class Stepped(HookEvent, hook=Watcher.after_step):
    n: int


class Told(Watcher):
    def __init__(self, name: str, told: list[tuple[str, str]]) -> None:
        self.name, self.told = name, told

    def before_step(self, event: Stepping) -> None:
        self.told.append((self.name, "before_step"))

    def after_step(self, event: Stepped) -> None:
        self.told.append((self.name, "after_step"))


def test_an_event_names_its_method_by_the_method_itself():
    assert (Stepping.hook, Stepped.hook) == ("before_step", "after_step")
    assert Stepping(1).hook == "before_step"  # and a slotted dataclass keeps it


def test_a_misspelt_hook_fails_when_the_event_class_is_made():
    with pytest.raises(AttributeError):

        class Misspelt(HookEvent, hook=Watcher.after_stpe):  # type: ignore[attr-defined]
            pass

    with pytest.raises(TypeError, match="not a before_ or after_ hook method"):

        class NoHook(HookEvent, hook=print):
            pass

    with pytest.raises(TypeError, match="names no hook method"):

        class Unnamed(HookEvent):
            pass


def test_before_hooks_are_told_in_order_and_after_hooks_in_reverse():
    told: list[tuple[str, str]] = []
    hooks = Emitter([Told("first", told), Told("second", told)], base=Watcher, failure="%(hook)s")
    hooks.emit_now(Stepping(1))
    hooks.emit_now(Stepped(1), [Told("extra", told)])
    assert told == [
        ("first", "before_step"),
        ("second", "before_step"),
        ("extra", "after_step"),
        ("second", "after_step"),
        ("first", "after_step"),
    ]


def test_an_event_of_another_kind_of_hooks_is_refused():
    hooks = Emitter([Told("only", [])], base=Watcher, failure="%(hook)s")
    with pytest.raises(TypeError, match="no event of Watcher"):
        hooks.emit_now(LimitWait(provider="h/m", seconds=1.0, reason="in_flight"))
    with pytest.raises(TypeError, match="is not a Watcher"):
        hooks.add(LimiterHooks())  # type: ignore[arg-type]


async def test_the_circuit_and_the_limiter_hooks_go_through_the_same_emitter(caplog):
    seen: list[CircuitChange] = []

    class Broken(CircuitHooks):
        def after_change(self, event: CircuitChange) -> None:
            raise RuntimeError("secret in a message")

    class Keeping(CircuitHooks):
        def after_change(self, event: CircuitChange) -> None:
            seen.append(event)

    hooks = circuit_hooks([Keeping(), Broken()])
    await hooks.emit(CircuitChange(provider="h/m", state="open"))
    assert [e.state for e in seen] == ["open"]
    assert "a circuit hook failed in after_change (RuntimeError)" in caplog.text
    assert "secret" not in caplog.text
