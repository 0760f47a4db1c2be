"""What opens a provider's circuit, the signal a kept-back call raises, and its countdown."""

from __future__ import annotations

import pickle

import pytest

from relayq import InProcessRequest, InProcessResponse, ModelError
from relayq.circuit import (
    Circuit,
    CircuitChange,
    CircuitHooks,
    CircuitModel,
    ProviderDown,
    outage_countdown,
    outage_of,
)
from relayq.ratelimit import ProviderLimits

REQUEST = InProcessRequest(messages=[{"role": "user", "content": "hi"}], tools=[])


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ModelError("x unreachable", retryable=True, unanswered="unreachable"), "unreachable"),
        (ModelError("x timed out", retryable=True, unanswered="timeout"), "timeout"),
        (ModelError("x answered 500", retryable=True, status=500), "server_error"),
        (ModelError("x answered 503", retryable=True, status=503), "server_error"),
        (ModelError("x answered 529", retryable=True, status=529), "server_error"),
    ],
)
def test_an_unreachable_provider_a_timeout_and_a_5xx_are_outages(error: ModelError, kind: str):
    assert outage_of(error) == kind


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 429])
def test_a_4xx_is_no_outage(status: int):
    assert outage_of(ModelError(f"answered {status}", status=status)) is None


def test_an_error_with_no_status_and_no_transport_failure_is_no_outage():
    # A missing key, an unreadable reply, a turn out of time for its own reasons
    assert outage_of(ModelError("no API key")) is None
    assert outage_of(TimeoutError()) is None
    assert outage_of(ProviderDown("h/m", "k", 1.0, 2.0)) is None


def test_provider_down_survives_pickling_whole():
    signal = ProviderDown(
        "api.example.com/m", "k1", 1700000000.5, 2.5,
        probing=True, called=True, kind="timeout", error="timed out",
    )  # fmt: skip

    again = pickle.loads(pickle.dumps(signal))

    assert type(again) is ProviderDown
    assert vars(again) == vars(signal)
    assert again.retryable
    assert again.retry_after == 2.5


def test_the_prober_comes_back_for_its_probe_and_the_others_later_as_the_outage_goes_on():
    def countdown(waited: float, *, probing: bool = False, limit: float = 3600.0) -> float:
        return outage_countdown(0.4, waited, 5.0, limit, probing=probing)

    assert countdown(100.0, probing=True) == 0.4
    assert 4.0 <= countdown(1.0) <= 6.0
    assert 160.0 <= countdown(400.0) <= 240.0
    assert countdown(10_000.0, limit=100_000.0) == 300.0, "never past MAX_DELAY"
    assert countdown(3599.0) <= 1.05, "never past the outage limit"


class Failing:
    def __init__(self, error: ModelError) -> None:
        self.error = error
        self.calls = 0

    async def __call__(self, request: InProcessRequest) -> InProcessResponse:
        self.calls += 1
        raise self.error


async def test_without_a_shared_circuit_every_error_stands_as_it_was():
    # Given the base circuit (no broker to share one through)
    error = ModelError("x unreachable", retryable=True, unanswered="unreachable")
    model = CircuitModel(Failing(error), Circuit(), ProviderLimits(key="k", label="h/m"))

    # When the provider cannot be reached, Then the turn sees the error itself
    with pytest.raises(ModelError) as raised:
        await model(REQUEST)
    assert raised.value is error


class Exploding(CircuitHooks):
    def after_change(self, event: CircuitChange) -> None:
        raise RuntimeError("boom")


def test_a_failing_hook_is_logged_and_skipped(caplog: pytest.LogCaptureFixture):
    seen: list[CircuitChange] = []

    class Keeping(CircuitHooks):
        def after_change(self, event: CircuitChange) -> None:
            seen.append(event)

    circuit = Circuit([Exploding(), Keeping()])
    circuit.hooks.emit_now(CircuitChange(provider="h/m", state="open"))

    assert [e.state for e in seen] == ["open"]
    assert "a circuit hook failed" in caplog.text
