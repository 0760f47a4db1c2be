"""The transport under `ProviderModel`: connections per event loop, closing, deadlines,
broken connections, proxies, redirects and certificates."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from relayq import ModelError
from relayq.providers import ProviderConfig, ProviderModel
from tests.ports import free_port
from tests.provider_server import API_KEY, Reply

from .plain_server import PlainServer
from .wire import text_reply

ROOT = Path(__file__).resolve().parents[3]
HI = [{"role": "user", "content": "hi"}]
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def plain() -> Iterator[PlainServer]:
    with PlainServer() as server:
        yield server


def model_on(base: str, *, retries: int = 0, **options: Any) -> ProviderModel:
    """A model on `{base}/v1`, with no retries unless asked."""
    config = ProviderConfig(base_url=f"{base}/v1", model="m", **options)
    return ProviderModel(config, api_key=API_KEY, retries=retries)


def settles(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Whether `check` holds within `seconds` (the server sees a close a moment later)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- connections per event loop ---------------------------------------------------------------


async def test_calls_on_one_event_loop_share_one_kept_alive_connection(plain, close_later):
    model = close_later(model_on(plain.base))

    for _ in range(5):
        reply = await model.complete(HI)

    assert reply.response.content == "plain"
    assert plain.connections == 1


async def test_an_idle_connection_is_closed_before_a_five_second_keep_alive_closes_it(
    plain, close_later
):
    """A server closing idle connections after 5 s (uvicorn's, Node's) races a client that
    keeps them as long: a call sent on one it just closed fails "Server disconnected".
    Under load, in a busy worker, that failed a fifth of the turns."""
    model = close_later(model_on(plain.base))
    await model.complete(HI)
    assert plain.open == 1

    deadline = time.monotonic() + 4.5
    while plain.open and time.monotonic() < deadline:  # noqa: ASYNC110 (the server counts)
        await asyncio.sleep(0.05)  # the client's loop runs: it closes what sat idle too long
    assert plain.open == 0, "the client still holds an idle connection after 4.5 s"

    await model.complete(HI)
    assert plain.connections == 2


async def test_each_event_loop_has_its_own_connections_and_one_ending_leaves_the_others(
    plain, close_later
):
    # Given a model with a connection open on this loop
    model = close_later(model_on(plain.base))
    await model.complete(HI)

    # When another loop, in another thread, calls it and ends without closing anything
    async def elsewhere() -> str:
        return (await model.complete(HI)).response.content

    assert await asyncio.to_thread(asyncio.run, elsewhere()) == "plain"

    # Then that loop had a connection of its own, closed as its loop ended; this one's still serves
    assert plain.connections == 2
    assert await asyncio.to_thread(settles, lambda: plain.open == 1)
    assert (await model.complete(HI)).response.content == "plain"
    assert plain.connections == 2


async def test_aclose_closes_the_loops_connections_and_a_later_call_opens_new_ones(plain):
    model = model_on(plain.base)
    await model.complete(HI)

    await model.aclose()

    assert await asyncio.to_thread(settles, lambda: plain.open == 0)
    await model.complete(HI)
    assert plain.connections == 2
    await model.aclose()


def test_a_loop_that_ends_without_aclose_closes_its_connections_without_warnings(plain, caplog):
    # Given a model called on a loop that ends without closing it (asyncio.run, a script)
    async def call(model: ProviderModel) -> None:
        await model.complete(HI)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(call(model_on(plain.base)))
        # When the model and its loop are gone
        gc.collect()

    # Then its connection was closed as the loop ended, and nothing complained
    assert settles(lambda: plain.open == 0)
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert "Unclosed" not in caplog.text


def test_a_loop_still_running_at_exit_has_its_session_closed_quietly(plain):
    # A worker's loop runs in a daemon thread until the process exits; -X dev shows every
    # unclosed session, connector and socket that the garbage collector meets.
    script = textwrap.dedent(
        f"""
        import asyncio, threading
        from relayq.providers import ProviderConfig, ProviderModel

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        config = ProviderConfig(base_url="{plain.base}/v1", model="m")
        model = ProviderModel(config, api_key="{API_KEY}")
        hi = [{{"role": "user", "content": "hi"}}]
        reply = asyncio.run_coroutine_threadsafe(model.complete(hi), loop).result(10)
        print(reply.response.content)
        """
    )
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}

    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "plain"
    assert "Unclosed" not in done.stderr
    assert "ResourceWarning" not in done.stderr


# -- deadlines and broken connections ---------------------------------------------------------


async def test_the_callers_deadline_is_a_timeout_error_not_a_model_error(plain, close_later):
    # A turn's own deadline (asyncio.timeout) must stay a TimeoutError: the worker tells it
    # from a provider's timeout by its type.
    model = close_later(model_on(plain.base, timeout=30))
    plain.mode = "hang"

    with pytest.raises(TimeoutError) as raised:
        async with asyncio.timeout(0.3):
            await model.complete(HI)

    assert not isinstance(raised.value, ModelError)
    plain.mode = "answer"
    assert (await model.complete(HI)).response.content == "plain", "the next call still works"


async def test_a_server_that_never_takes_the_connection_is_a_retryable_timeout(close_later):
    # A listener that never accepts, its backlog filled: the kernel drops further handshakes.
    with socket.socket() as listener, contextlib.ExitStack() as stack:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        for _ in range(3):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
        model = close_later(model_on(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.3))

        started = time.monotonic()
        with pytest.raises(ModelError) as raised:
            await model.complete(HI)

    assert time.monotonic() - started < 2
    assert raised.value.retryable is True
    assert "timed out after 0.3 s" in str(raised.value)


async def test_a_connection_dropped_before_the_answer_is_retryable_and_retried(plain, close_later):
    model = close_later(model_on(plain.base, retries=2))
    plain.mode = "drop"

    with pytest.raises(ModelError) as raised:
        await model.complete(HI)

    assert raised.value.retryable is True
    assert raised.value.status is None
    assert "openai endpoint 127.0.0.1" in str(raised.value)
    assert "unreachable" in str(raised.value)
    assert len(plain.request_lines) == 3, "one call and two retries"


async def test_a_refused_connection_is_a_retryable_unreachable_error(close_later):
    port = free_port()  # nothing listens there
    model = close_later(model_on(f"http://127.0.0.1:{port}"))

    with pytest.raises(ModelError) as raised:
        await model.complete(HI)

    assert raised.value.retryable is True
    assert "unreachable" in str(raised.value)
    assert API_KEY not in str(raised.value)


# -- what the transport does as httpx did -----------------------------------------------------


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
async def test_a_proxy_named_by_the_environment_carries_the_call(
    variable, no_proxies, monkeypatch, plain, close_later
):
    # Given a proxy (the plain server answers whatever it is asked) and a host that
    # resolves nowhere: only through the proxy can the call succeed
    monkeypatch.setenv(variable, plain.base)
    model = close_later(model_on("http://provider.invalid"))

    reply = await model.complete(HI)

    assert reply.response.content == "plain"
    assert plain.request_lines == ["POST http://provider.invalid/v1/chat/completions HTTP/1.1"]


async def test_credentials_in_the_proxys_url_go_to_the_proxy_only(
    no_proxies, monkeypatch, plain, close_later
):
    monkeypatch.setenv("HTTP_PROXY", plain.base.replace("http://", "http://ann:s3cret@"))
    model = close_later(model_on("http://provider.invalid"))

    await model.complete(HI)

    assert plain.headers[0]["proxy-authorization"] == "Basic YW5uOnMzY3JldA=="  # ann:s3cret
    assert plain.headers[0]["authorization"] == f"Bearer {API_KEY}"


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1", "*"])
async def test_no_proxy_covering_the_host_sends_the_call_direct(
    no_proxy, no_proxies, monkeypatch, plain, close_later
):
    with PlainServer() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base)
        monkeypatch.setenv("NO_PROXY", no_proxy)
        model = close_later(model_on(plain.base))

        await model.complete(HI)

        assert proxy.request_lines == []
        assert plain.request_lines == ["POST /v1/chat/completions HTTP/1.1"]
        await model.aclose()


async def test_a_redirect_is_not_followed(server, close_later):
    # Following one would send the key wherever the Location header points.
    moved = Reply({}, status=307, headers={"Location": f"{server.openai_url}/chat/completions"})
    server.script += [moved, text_reply("openai", "followed")]
    model = close_later(model_on(server.base))

    with pytest.raises(ModelError, match="unreadable"):
        await model.complete(HI)

    assert len(server.seen) == 1


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_a_certificate_that_certifi_does_not_vouch_for_is_refused(self_signed, close_later):
    with PlainServer(tls=self_signed) as tls_server:
        model = close_later(model_on(tls_server.base))

        with pytest.raises(ModelError) as raised:
            await model.complete(HI)

        assert raised.value.retryable is True
        assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)
        assert tls_server.request_lines == [], "nothing was sent over the unverified connection"


async def test_the_error_log_of_a_failed_call_holds_no_key(plain, close_later, caplog):
    caplog.set_level(logging.DEBUG)
    model = close_later(model_on(plain.base))
    plain.mode = "drop"

    with pytest.raises(ModelError):
        await model.complete(HI)

    assert API_KEY not in caplog.text
