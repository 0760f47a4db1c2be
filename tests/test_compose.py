"""compose.yaml and the Dockerfile: the rules a deployment relies on, each checked alone.

Every rule is a function that lists what breaks it; the tests run each on the
real file, and on a copy broken on purpose, so a rule that could never fail
would show.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
APP_SERVICES = ("worker", "beat", "api", "flower")
SERVICES = ("redis", "postgres", *APP_SERVICES)
SUBSTITUTION = re.compile(r"^\$\{[A-Z][A-Z0-9_]*:\?[^}]*\}$")
CREDENTIAL = re.compile(r"PASSWORD|TOKEN|AUTH|SECRET")
URL_PASSWORD = re.compile(r"://[^:/@]+:([^@]*)@")

Compose = dict[str, Any]
Rule = Callable[[Compose], list[str]]


@pytest.fixture(scope="module")
def compose() -> Compose:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _services(compose: Compose) -> dict[str, Any]:
    return dict(compose.get("services") or {})


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _health(service: dict[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test") or []
    return test if isinstance(test, str) else " ".join(str(t) for t in test)


# --- the rules ---------------------------------------------------------------


def six_services(compose: Compose) -> list[str]:
    names = sorted(_services(compose))
    return [] if names == sorted(SERVICES) else [f"services are {names}"]


def one_image_built_once(compose: Compose) -> list[str]:
    services = _services(compose)
    problems = []
    builders = [name for name, s in services.items() if "build" in s]
    if len(builders) != 1 or builders[0] not in APP_SERVICES:
        problems.append(f"services that build: {builders}")
    else:
        build = services[builders[0]]["build"]
        context = build if isinstance(build, str) else build.get("context")
        if context not in (".", "./"):
            problems.append(f"{builders[0]} builds {context!r}, not the repository")
    images = {services.get(name, {}).get("image") for name in APP_SERVICES}
    if len(images) != 1 or None in images:
        problems.append(f"the app services run images {images}")
    return problems


def each_app_service_runs_its_command(compose: Compose) -> list[str]:
    services = _services(compose)
    return [
        f"{name} runs {_command(services.get(name, {}))}"
        for name in APP_SERVICES
        if _command(services.get(name, {}))[:1] != [name]
    ]


def app_services_share_the_settings(compose: Compose) -> list[str]:
    services = _services(compose)
    problems = []
    for name in APP_SERVICES:
        env = _env(services.get(name, {}))
        if not env.get("RELAYQ_DATABASE_URL", "").startswith("postgresql+psycopg://"):
            problems.append(f"{name}: RELAYQ_DATABASE_URL is not postgresql+psycopg://...")
        elif "@postgres:5432/" not in env["RELAYQ_DATABASE_URL"]:
            problems.append(f"{name}: RELAYQ_DATABASE_URL does not name the postgres service")
        if env.get("RELAYQ_BROKER_URL") != "redis://redis:6379/0":
            problems.append(f"{name}: RELAYQ_BROKER_URL is {env.get('RELAYQ_BROKER_URL')!r}")
        if "RELAYQ_AGENTS" not in env:
            problems.append(f"{name}: no RELAYQ_AGENTS")
    return problems


def secrets_go_where_they_are_used(compose: Compose) -> list[str]:
    services = _services(compose)
    wanted = {"api": "RELAYQ_API_TOKENS", "flower": "RELAYQ_FLOWER_AUTH"}
    problems = [
        f"{name} lacks {var}"
        for name, var in wanted.items()
        if var not in _env(services.get(name, {}))
    ]
    for name in APP_SERVICES:
        for var in wanted.values():
            if var in _env(services.get(name, {})) and wanted.get(name) != var:
                problems.append(f"{name} gets {var}, which it does not use")
    return problems


def ports(compose: Compose) -> list[str]:
    services = _services(compose)
    expected = {"api": ["8000:8000"], "flower": ["5555:5555"]}
    return [
        f"{name} publishes {services.get(name, {}).get('ports')}"
        for name in SERVICES
        if [str(p) for p in services.get(name, {}).get("ports") or []] != expected.get(name, [])
    ]


def health_checks(compose: Compose) -> list[str]:
    services = _services(compose)
    expected = {
        "redis": ["redis-cli", "ping"],
        "postgres": ["pg_isready"],
        "worker": ["inspect ping"],
        "beat": ["ensure_connection"],
        "api": ["http://127.0.0.1:8000/openapi.json"],
        "flower": ["http://127.0.0.1:5555/healthcheck"],
    }
    problems = []
    for name, needles in expected.items():
        test = _health(services.get(name, {}))
        if not all(n in test for n in needles):
            problems.append(f"{name}'s health check is {test!r}")
    return problems


def redis_is_durable(compose: Compose) -> list[str]:
    command = " ".join(_command(_services(compose).get("redis", {})))
    return [
        f"redis runs {command!r} without {flag!r}"
        for flag in ("--appendonly yes", "--maxmemory-policy noeviction")
        if flag not in command
    ]


def depends_on_healthy(compose: Compose) -> list[str]:
    services = _services(compose)
    needs = {
        "worker": {"redis", "postgres"},
        "beat": {"redis"},
        "api": {"redis", "postgres"},
        "flower": {"redis"},
    }
    problems = []
    for name, wanted in needs.items():
        depends = services.get(name, {}).get("depends_on") or {}
        if not isinstance(depends, dict):
            problems.append(f"{name}: depends_on has no conditions")
            continue
        if not wanted <= set(depends):
            problems.append(f"{name} depends on {sorted(depends)}, not {sorted(wanted)}")
        for dep, spec in depends.items():
            if (spec or {}).get("condition") != "service_healthy":
                problems.append(f"{name} does not wait for {dep} to be healthy")
    return problems


def worker_scales(compose: Compose) -> list[str]:
    problems = []
    for name, service in _services(compose).items():
        if "container_name" in service:
            problems.append(f"{name} has a fixed container_name")
    worker = _services(compose).get("worker", {})
    if worker.get("ports"):
        problems.append("the worker publishes a host port")
    replicas = (worker.get("deploy") or {}).get("replicas")
    if not isinstance(replicas, int) or replicas < 1:
        problems.append(f"the worker's deploy.replicas is {replicas!r}")
    return problems


def no_secret_literals(compose: Compose) -> list[str]:
    problems = []
    for name, service in _services(compose).items():
        for var, value in _env(service).items():
            if CREDENTIAL.search(var) and not SUBSTITUTION.match(value):
                problems.append(f"{name}: {var} is written in the file")
            match = URL_PASSWORD.search(value)
            if match and not SUBSTITUTION.match(match.group(1)):
                problems.append(f"{name}: {var} holds a password")
    return problems


RULES: dict[str, Rule] = {
    "six services": six_services,
    "one image built once": one_image_built_once,
    "each app service runs its command": each_app_service_runs_its_command,
    "app services share the settings": app_services_share_the_settings,
    "secrets go where they are used": secrets_go_where_they_are_used,
    "ports": ports,
    "health checks": health_checks,
    "redis is durable": redis_is_durable,
    "depends on healthy": depends_on_healthy,
    "worker scales": worker_scales,
    "no secret literals": no_secret_literals,
}


def _breakages() -> list[tuple[str, Callable[[Compose], None]]]:
    def svc(c: Compose, name: str) -> dict[str, Any]:
        return dict(c["services"][name])

    def put(c: Compose, name: str, **changes: Any) -> None:
        c["services"][name] = {**svc(c, name), **changes}

    def env(c: Compose, name: str, **changes: str) -> None:
        put(c, name, environment={**_env(svc(c, name)), **changes})

    def drop_env(c: Compose, name: str, var: str) -> None:
        put(c, name, environment={k: v for k, v in _env(svc(c, name)).items() if k != var})

    return [
        ("six services", lambda c: c["services"].pop("beat")),
        ("one image built once", lambda c: put(c, "api", build=".")),
        ("one image built once", lambda c: put(c, "flower", image="other:latest")),
        ("each app service runs its command", lambda c: put(c, "beat", command=["worker"])),
        (
            "app services share the settings",
            lambda c: env(c, "worker", RELAYQ_BROKER_URL="redis://localhost:6379/0"),
        ),
        ("app services share the settings", lambda c: drop_env(c, "api", "RELAYQ_AGENTS")),
        ("secrets go where they are used", lambda c: drop_env(c, "api", "RELAYQ_API_TOKENS")),
        (
            "secrets go where they are used",
            lambda c: env(c, "worker", RELAYQ_FLOWER_AUTH="${RELAYQ_FLOWER_AUTH:?x}"),
        ),
        ("ports", lambda c: put(c, "redis", ports=["6379:6379"])),
        ("ports", lambda c: put(c, "api", ports=["80:8000"])),
        ("health checks", lambda c: put(c, "beat", healthcheck=None)),
        ("health checks", lambda c: put(c, "api", healthcheck={"test": ["CMD", "true"]})),
        ("redis is durable", lambda c: put(c, "redis", command=["redis-server"])),
        ("depends on healthy", lambda c: put(c, "worker", depends_on=["redis", "postgres"])),
        (
            "depends on healthy",
            lambda c: put(c, "api", depends_on={"redis": {"condition": "service_started"}}),
        ),
        ("worker scales", lambda c: put(c, "worker", container_name="relayq-worker")),
        ("worker scales", lambda c: put(c, "worker", deploy={})),
        ("no secret literals", lambda c: env(c, "flower", RELAYQ_FLOWER_AUTH="ops:hunter2")),
        (
            "no secret literals",
            lambda c: env(
                c, "api", RELAYQ_DATABASE_URL="postgresql+psycopg://relayq:relayq@postgres:5432/x"
            ),
        ),
        ("no secret literals", lambda c: env(c, "postgres", POSTGRES_PASSWORD="relayq")),
    ]


@pytest.mark.parametrize("rule", RULES)
def test_compose_keeps_the_rule(compose: Compose, rule: str):
    assert RULES[rule](compose) == []


@pytest.mark.parametrize(
    ("rule", "breakage"),
    [
        pytest.param(rule, breakage, id=f"{rule}-{n}")
        for n, (rule, breakage) in enumerate(_breakages())
    ],
)
def test_a_compose_file_that_breaks_the_rule_is_caught(
    compose: Compose, rule: str, breakage: Callable[[Compose], None]
):
    broken = copy.deepcopy(compose)
    breakage(broken)
    assert RULES[rule](broken) != []


def test_the_app_services_get_their_settings_from_one_anchor():
    text = (ROOT / "compose.yaml").read_text()
    assert "x-relayq-env: &relayq-env" in text
    assert text.count("<<: *relayq-env") == len(APP_SERVICES)


def test_the_dockerfile_runs_the_relayq_script_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip()]
    instructions = [line for line in lines if not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim"
    assert any(re.match(r"RUN pip install \.( |$)", line) for line in instructions)
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users
    assert users[-1] not in ("root", "0")
    entrypoints = [line for line in instructions if line.startswith("ENTRYPOINT ")]
    assert entrypoints == ['ENTRYPOINT ["relayq"]']
    # ... and `relayq` is the package's console script.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "relayq" in project["scripts"]


def test_the_image_holds_every_package_the_script_imports():
    dockerfile = (ROOT / "Dockerfile").read_text()
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = [p.rstrip("*") for p in setup["packages"]["find"]["include"]]
    for package in packages:
        assert f"COPY {package} ./{package}" in dockerfile


def test_every_rule_is_shown_to_catch_a_breakage():
    assert {rule for rule, _ in _breakages()} == set(RULES)
