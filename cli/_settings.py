"""The settings a command runs with, checked up front: a bad value is one error line
naming its variable, never a traceback, and a URL is shown with its password hidden.
And the agent modules of RELAYQ_AGENTS, imported, each agent checked against them."""

from __future__ import annotations

import traceback

from kombu.transport import resolve_transport
from kombu.utils.url import maybe_sanitize_url, parse_url
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from cli._output import fail
from relayq.agents import AgentError, load_agents, registered_agents
from tasks.settings import Settings

__all__ = [
    "broker_shown",
    "database_shown",
    "known_agent",
    "load_agent_modules",
    "settings",
]


def settings() -> Settings:
    """The settings from the environment, their URLs checked for what can be told offline.

    Each refusal is one `relayq: error:` line naming the variable; a URL is shown
    with its password hidden.
    """
    try:
        current = Settings.from_env()
    except ValueError as exc:
        fail(str(exc))
    _check_database_url(current.database_url)
    if not current.embedded_broker:
        _check_broker_url(current.broker_url)
    return current


_DATABASE_EXAMPLE = "sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:5432/NAME"
_BROKER_EXAMPLE = "redis://HOST:6379/0, or leave it unset for the embedded Redis"


def _check_database_url(url: str) -> None:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # Not quoted: a URL that does not parse may show its password in the clear.
        fail(f"RELAYQ_DATABASE_URL is not a database URL; write {_DATABASE_EXAMPLE}")
    shown = database_shown(url)
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        fail(f"RELAYQ_DATABASE_URL ({shown}) names a database relayq cannot use; "
             f"write {_DATABASE_EXAMPLE}")  # fmt: skip
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        fail(f"RELAYQ_DATABASE_URL ({shown}) needs a driver that is not installed ({exc}); "
             f"relayq ships psycopg 3: write {_DATABASE_EXAMPLE}")  # fmt: skip


def _check_broker_url(url: str) -> None:
    scheme, sep, _ = url.partition("://")
    if not sep:
        fail(f"RELAYQ_BROKER_URL is not a URL; write {_BROKER_EXAMPLE}")
    try:
        for each in url.split(";"):  # sentinel://h1:26379;sentinel://h2:26379 names several
            parse_url(each)
    except ValueError as exc:  # not quoted, nor shown: its password may be in the clear
        fail(f"RELAYQ_BROKER_URL does not parse: {exc}; write {_BROKER_EXAMPLE}")
    shown = _broker_url_shown(url)
    try:
        # kombu's names: `redis+socket` is the redis transport on a Unix socket.
        resolve_transport(scheme.partition("+")[0])
    except KeyError:
        fail(f"RELAYQ_BROKER_URL ({shown}) names no broker kombu knows; write {_BROKER_EXAMPLE}")
    except ImportError as exc:
        fail(f"RELAYQ_BROKER_URL ({shown}) needs a library that is not installed ({exc})")


def database_shown(url: str) -> str:
    """The database URL with its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(a URL that does not parse)"


def broker_shown(current: Settings) -> str:
    """The broker as a person reads it: its URL with the password hidden."""
    if current.embedded_broker:
        return f"the embedded Redis on {current.socket_path}"
    return _broker_url_shown(current.broker_url)


def _broker_url_shown(url: str) -> str:
    try:
        return str(maybe_sanitize_url(url))
    except ValueError:
        return "(a URL that does not parse)"


def load_agent_modules(current: Settings) -> None:
    """Import RELAYQ_AGENTS's modules and check each agent fits these settings; one line if not."""
    try:
        load_agents(current.agents)
    except AgentError as exc:
        fail(f"RELAYQ_AGENTS: {exc}")
    except Exception as exc:  # a module that raises on import: where, not a traceback
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        fail(
            f"RELAYQ_AGENTS ({current.agents}): importing it raised {type(exc).__name__}: "
            f"{exc} ({frame.filename}, line {frame.lineno})"
        )
    for agent in registered_agents().values():
        try:
            current.check_agent(agent)
        except AgentError as exc:
            fail(str(exc))


def known_agent(name: str, current: Settings) -> str:
    """`name` if an agent module of RELAYQ_AGENTS registers it; else a one-line error.

    A run of an agent no worker knows would only fail later, on the worker.
    """
    if not current.agents:
        fail(
            f"cannot check agent {name!r}: RELAYQ_AGENTS is not set; set it to the module(s) "
            "that define your agents, as for the workers (e.g. RELAYQ_AGENTS=relayq.demo)"
        )
    load_agent_modules(current)
    known = registered_agents()
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        fail(f"unknown agent {name!r} (RELAYQ_AGENTS={current.agents} registers: {listed})")
    return name
