"""What the whole suite needs of the machine, and what happens where it is missing.

A test that needs a part some machines lack carries that part's marker
(`browser`, `postgres`, `node`), and its fixture calls `machine_parts.missing(part,
reason)` where the part is missing: the test skips, saying why, so `make test`
passes on a fresh machine and its summary says what it did not test.
`RELAYQ_REQUIRE` names parts that must be there (`.ci/run` sets
`RELAYQ_REQUIRE=browser,node,postgres,redis`): for those, `missing` fails the test
instead, and without `redis` the durable tests fail rather than fall back to
the embedded broker.

It also holds the fixtures that tests in more than one folder take (`spans`).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from tests.typescript_client import TypeScriptClient
from tests.typescript_client import missing as missing_typescript

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Every lane, and every process it starts, shares the machine's PostgreSQL (100
# connections by default) with the other lanes: each pool holds few (store.db). A run
# with 10 a pool peaked at 90 of the server's connections.
os.environ.setdefault("RELAYQ_STORE_CONNECTIONS", "6")

REQUIRE = "RELAYQ_REQUIRE"
PARTS = {
    "browser": "Debian's chromium (apt-get install chromium)",
    "postgres": "a PostgreSQL server (127.0.0.1:5432, or RELAYQ_TEST_POSTGRES)",
    "redis": "a Redis server on 127.0.0.1:6379",
    "node": "Node.js and npm, and the npm registry for `make test` (the TypeScript SDK's client)",
}


@dataclass
class Parts:
    """The parts `RELAYQ_REQUIRE` asks for, and what went missing in this session."""

    required: frozenset[str]
    reasons: dict[str, tuple[str, str]] = field(default_factory=dict)
    """A skip's or failure's message to the part it was for and why."""
    skipped: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Test id to (part, reason), for each test skipped for want of a part."""
    failed: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The same, for the tests `RELAYQ_REQUIRE` failed instead."""
    notes: dict[str, str] = field(default_factory=dict)
    """Part to what the suite did without it (no test skipped for it)."""

    def missing(self, part: str, reason: str) -> NoReturn:
        """Skip the test for want of `part`, or fail it where `RELAYQ_REQUIRE` names the part."""
        self._fail_if_required(part, reason)
        self.reasons[reason] = (part, reason)
        pytest.skip(reason)

    def lacking(self, part: str, reason: str, *, instead: str) -> None:
        """The suite does without `part` (`instead`, said in the summary), or the test
        fails where `RELAYQ_REQUIRE` names the part."""
        self._fail_if_required(part, reason)
        self.notes[part] = f"{reason}: {instead}"

    def _fail_if_required(self, part: str, reason: str) -> None:
        if part in self.required:
            message = f"{reason}, and {REQUIRE}={','.join(sorted(self.required))} requires {part}"
            self.reasons[message] = (part, reason)
            pytest.fail(message, pytrace=False)


_PARTS = pytest.StashKey[Parts]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--screenshots",
        action="store_true",
        help="the browser tests also save the inbox's pages as PNGs in docs/ (docs/approvals.md's)",
    )


def pytest_configure(config: pytest.Config) -> None:
    names = frozenset(n.strip() for n in os.environ.get(REQUIRE, "").split(",") if n.strip())
    unknown = sorted(names - PARTS.keys())
    if unknown:
        raise pytest.UsageError(
            f"{REQUIRE} names {', '.join(unknown)}; it takes {', '.join(PARTS)}"
        )
    config.stash[_PARTS] = Parts(required=names)
    config.pluginmanager.register(LongFirst(), "relayq-long-first")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep a module's tests on one xdist lane (per database) where it sets `ONE_LANE = True`:
    its module-scoped parts (a worker, Flower, the demo) are then made once, not once in
    every lane that meets one of its tests (`make test` runs `--dist loadgroup`)."""
    for item in items:
        module = getattr(item, "module", None)
        if module is None or not getattr(module, "ONE_LANE", False):
            continue
        callspec = getattr(item, "callspec", None)
        database = callspec.params.get("database_url", "") if callspec else ""
        # No "]" in the name: xdist takes an "@" before a "]" for a parameter's.
        item.add_marker(pytest.mark.xdist_group(f"{module.__name__}:{database or 'any'}"))


class LongFirst:
    """Lanes take tests in the order collected: the long ones first, so that no lane is
    still at one when the others have run out of work. Modules that keep to one lane go
    first (each is one unit of work), and of each kind those that set `START_EARLY = True`."""

    @pytest.hookimpl(trylast=True)  # after the fixtures' own reordering
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=lambda item: _rank(getattr(item, "module", None)))


def _rank(module: object) -> tuple[bool, bool]:
    return not getattr(module, "ONE_LANE", False), not getattr(module, "START_EARLY", False)


@pytest.fixture(scope="module", autouse=True)
def collected() -> Iterator[None]:
    """What a module left unclosed (a store's pool, a socket) is collected as the module
    ends, so the warning fails that module's last test, not a later one at random.

    What outlives its module (imports, caches, session fixtures) then lives about as long
    as the lane: it is frozen out of later collections, which walk only what came since.
    A walk of the whole heap took half a second, at every switch of a lane from one
    module to another: a fifth of the suite's time. The lane unfreezes it at its end."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def thawed() -> Iterator[None]:
    """At the lane's end, what `collected` froze is collected too, if it became garbage."""
    yield
    gc.unfreeze()
    gc.collect()


@pytest.fixture(autouse=True)
def relayq_environment_kept() -> Iterator[None]:
    """A test leaves the process's RELAYQ_* variables as it found them (`monkeypatch.setenv`
    restores them): one it left changed sends the tests after it on its lane, and only
    on that lane, to another log, store or broker."""
    before = _relayq_environment()
    yield
    after = _relayq_environment()
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        pytest.fail(f"the test left {', '.join(changed)} changed in os.environ")


def _relayq_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("RELAYQ_")}


@pytest.fixture(scope="session", autouse=True)
def lane_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """RELAYQ_HOME for whatever a test starts without a home of its own: this lane's
    folder (tests.lanes), not the checkout's `.relayq` that every lane would share."""
    home = tmp_path_factory.mktemp("relayq-home")
    before = os.environ.get("RELAYQ_HOME")
    os.environ["RELAYQ_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("RELAYQ_HOME", None)
    else:
        os.environ["RELAYQ_HOME"] = before


@pytest.fixture
def leaves_no_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process's temporary folders, while the test runs, made in a folder of its own,
    and none left there when it ends (a benchmark removes its stores and logs)."""
    folder = Path(tempfile.mkdtemp(prefix="relayq-test-tmp-"))
    folder.chmod(0o755)  # open to the `postgres` user, for a PostgreSQL of a test's own
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    try:
        yield folder
        assert sorted(p.name for p in folder.iterdir()) == [], "temporary folders left behind"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def machine_parts(pytestconfig: pytest.Config) -> Parts:
    """What the session requires and found missing: `machine_parts.lacking(...)`."""
    return pytestconfig.stash[_PARTS]


@pytest.fixture
def typescript(machine_parts: Parts) -> TypeScriptClient:
    """The official TypeScript SDK's MCP client (`tests.typescript_client`)."""
    why = missing_typescript()
    if why is not None:
        machine_parts.missing("node", why)
    return TypeScriptClient()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """relayq's spans in this process, in memory (the tracing tests of tests/tasks and
    tests/durable)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tasks.observability import tracing

    monkeypatch.delenv(tracing.OTEL_ENV, raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def pytest_report_header(config: pytest.Config) -> str:
    required = ",".join(sorted(config.stash[_PARTS].required))
    if required:
        return f"relayq: {REQUIRE}={required}: tests that need these fail instead of skipping"
    return f"relayq: tests that need {', '.join(PARTS)} skip where they are missing"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Count the tests `Parts.missing` or `Parts.lacking` skipped or failed, per part.

    A session fixture's skip is raised again, not called again, for every test
    after the first: the message says which part it was for.
    """
    report = yield
    parts = item.config.stash[_PARTS]
    if not parts.reasons or hasattr(report, "wasxfail"):
        return report
    if report.skipped and isinstance(report.longrepr, tuple):
        found = parts.reasons.get(str(report.longrepr[2]).removeprefix("Skipped: "))
        if found is not None:
            parts.skipped[item.nodeid] = found
    elif report.failed:
        text = report.longreprtext
        for message, found in parts.reasons.items():
            if found[1] != message and message in text:
                parts.failed[item.nodeid] = found
                break
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(
    terminalreporter: Any, config: pytest.Config
) -> Generator[None, None, None]:
    # Outermost, so this comes after -ra's list of every skip, just above the counts.
    yield
    parts = config.stash[_PARTS]
    if parts.skipped or parts.failed or parts.notes:
        _summarise(parts, terminalreporter)


def _summarise(parts: Parts, terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    terminalreporter.section("relayq: what this machine lacks")
    required = f"{REQUIRE}={','.join(sorted(parts.required))}"
    for title, entries in (
        ("skipped", parts.skipped),
        (f"failed instead of skipping, as {required} asks", parts.failed),
    ):
        if entries:
            write(f"{len(entries)} test{'s' if len(entries) != 1 else ''} {title}:")
            for (part, reason), n in sorted(Counter(entries.values()).items()):
                write(f"  {n} need {part}: {reason}")
    for part, note in sorted(parts.notes.items()):
        write(f"{part}: {note}")
    if parts.skipped or parts.notes:
        lacking = sorted({p for p, _ in parts.skipped.values()} | parts.notes.keys())
        write(
            f"To test them too, give this machine {'; '.join(PARTS[p] for p in lacking)}. "
            f"CI has them and sets {REQUIRE}={','.join(PARTS)}, so there they cannot skip."
        )
