"""Settings from the Celery app's configuration as well as the environment, in one order;
an agent's own policy checked against them; its queue declared like relayq's."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from relayq import Agent, AgentError, InProcessResponse
from tasks import DurableClient, Settings
from tasks.broker.publish import sender_app
from tasks.settings import queue_named
from workers.config import celery_config

ROOT = Path(__file__).resolve().parents[2]


def model(req):
    return InProcessResponse(content="hi")


def agent(**policy) -> Agent:
    return Agent(f"policy-{uuid.uuid4().hex[:8]}", model, register=False, **policy)


def test_settings_come_from_the_apps_configuration_under_lowercase_relayq_names(tmp_path):
    app = Celery("mine", set_as_current=False)
    app.conf.update(
        relayq_home=str(tmp_path),
        relayq_database_url="postgresql+psycopg://u@h/db",
        relayq_broker_url="redis://h:6379/3",
        relayq_turn_time_limit=timedelta(minutes=2),
        relayq_model_retries=1,
        relayq_concurrency=7,
        relayq_task_events=True,
        relayq_sweep_every="3",
    )

    s = Settings.load(env={}, conf=app.conf)

    assert (s.home, s.database_url, s.broker_url, s.embedded_broker) == (
        tmp_path,
        "postgresql+psycopg://u@h/db",
        "redis://h:6379/3",
        False,
    )
    assert (s.turns.time_limit, s.turns.model_retries) == (timedelta(seconds=120), 1)
    assert (s.worker.concurrency, s.worker.task_events) == (7, True)
    assert celery_config(s)["beat_schedule"]["relayq-sweep"]["schedule"] == 3


def test_the_environment_beats_the_configuration_which_beats_the_default():
    conf = {"relayq_database_url": "sqlite:///from-conf.db", "relayq_retry_base": 0.5}
    env = {"RELAYQ_DATABASE_URL": "sqlite:///from-env.db", "RELAYQ_RETRY_BASE": ""}

    s = Settings.load(env=env, conf=conf)

    assert s.database_url == "sqlite:///from-env.db", "the environment first"
    assert s.turns.retry_base == timedelta(seconds=0.5), (
        "an empty variable counts as unset: the configuration next"
    )
    assert s.turns.model_retries == 5, "the default last"


def test_settings_from_env_reads_the_environment_alone():
    assert Settings.from_env({"RELAYQ_MODEL_RETRIES": "3"}).turns.model_retries == 3


def test_an_explicit_keyword_beats_both(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYQ_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    app = Celery("mine", set_as_current=False)
    app.conf.relayq_database_url = f"sqlite:///{tmp_path / 'conf.db'}"
    app.conf.relayq_key_prefix = "conf:"

    explicit = DurableClient(app=app, database_url=f"sqlite:///{tmp_path / 'kw.db'}")
    from_app = DurableClient(app=app)
    try:
        assert explicit.settings.database_url.endswith("kw.db")
        assert from_app.settings.database_url.endswith("env.db")
        assert from_app.settings.key_prefix == "conf:", "the client reads the app's configuration"
    finally:
        explicit.close()
        from_app.close()


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"relayq_turn_time_limit": "soon"}, "relayq_turn_time_limit must be a number"),
        ({"relayq_sweep_every": timedelta(0)}, "relayq_sweep_every must be more than 0"),
        ({"relayq_model_retries": 1.5}, "relayq_model_retries must be a whole number"),
        ({"relayq_concurrency": 0}, "relayq_concurrency must be a whole number of at least 1"),
    ],
)
def test_a_bad_configured_value_is_refused_naming_its_key(conf, message):
    with pytest.raises(ValueError, match=message):
        Settings.load(env={}, conf=conf)


def test_the_worker_reads_a_config_module_named_the_celery_way(tmp_path):
    # Given a config module named by CELERY_CONFIG_MODULE, and one variable in the environment
    (tmp_path / "myconfig.py").write_text(
        "from datetime import timedelta\n"
        f"relayq_database_url = 'sqlite:///{tmp_path / 'conf.db'}'\n"
        "relayq_turn_time_limit = timedelta(minutes=3)\n"
        "relayq_key_prefix = 'conf:'\n"
    )
    code = (
        "import json\n"
        "from workers.app import app, settings\n"
        "from tasks.runner.process import current_runtime\n"
        "rt = current_runtime(app)\n"
        "limit = settings.turns.time_limit.total_seconds()\n"
        "print(json.dumps([settings.database_url, limit, settings.key_prefix,\n"
        "    app.conf.task_soft_time_limit, rt.settings.database_url, rt.settings.key_prefix]))\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "CELERY_CONFIG_MODULE": "myconfig",
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_KEY_PREFIX": "env:",
    }

    # When the worker's app and its runtime load their settings
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )

    # Then the module's relayq_* settings apply, below the environment's
    assert out.returncode == 0, out.stderr
    database, limit, prefix, soft, rt_database, rt_prefix = json.loads(out.stdout)
    assert database == rt_database == f"sqlite:///{tmp_path / 'conf.db'}"
    assert limit == soft == 180
    assert prefix == rt_prefix == "env:"


# -- an agent's policy against the worker's settings --------------------------------------------


def test_an_agents_retries_and_time_limit_default_to_the_workers():
    s = Settings.load(env={"RELAYQ_MODEL_RETRIES": "4", "RELAYQ_TURN_TIME_LIMIT": "60"})

    assert s.retries_of(agent()) == 4
    assert s.retries_of(None) == 4, "an agent this process does not know"
    assert s.time_limit_of(agent()) == 60
    assert s.retries_of(agent(retries=0)) == 0
    assert s.time_limit_of(agent(turn_time_limit=timedelta(seconds=20))) == 20


@pytest.mark.parametrize("seconds", [60, 90])
def test_an_agents_turn_time_limit_must_stay_below_the_workers(seconds):
    s = Settings.load(env={"RELAYQ_TURN_TIME_LIMIT": "60"})

    with pytest.raises(AgentError, match="must stay below the worker's RELAYQ_TURN_TIME_LIMIT"):
        s.check_agent(agent(turn_time_limit=timedelta(seconds=seconds)))


# -- queues --------------------------------------------------------------------------------------


def test_an_agents_queue_is_declared_like_relayqs_by_a_sender_and_a_worker(tmp_path):
    settings = Settings.from_env({"RELAYQ_HOME": str(tmp_path)})
    expected = queue_named("relayq.turns.vip")
    relayq_turns = sender_app(settings).amqp.queues["relayq.turns"]

    # A sender meets it in a send: Celery declares it as relayq declares its own
    declared = sender_app(settings).amqp.queues["relayq.turns.vip"]

    for queue in (declared, expected):
        assert (queue.name, queue.routing_key, queue.exchange.name) == ("relayq.turns.vip",) * 3
        assert queue.exchange.type == relayq_turns.exchange.type == "direct"


def test_a_worker_declares_the_queues_its_q_option_names(tmp_path):
    code = (
        "from workers.app import app, _declare_queues\n"
        "_declare_queues(options={'queues': ['relayq.turns.vip', 'relayq.answers']})\n"
        "q = app.amqp.queues\n"
        "print(sorted(q), q['relayq.turns.vip'].exchange.name)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RELAYQ_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )

    assert out.returncode == 0, out.stderr
    assert out.stdout.split("] ")[1].strip() == "relayq.turns.vip"
    assert "'relayq.turns.vip'" in out.stdout


def test_the_sweeper_reads_the_backlog_of_its_agents_queues_too(tmp_path):
    from tasks.runner.housekeeping import peeked_queues
    from tasks.runner.runtime import Runtime

    vip = agent(queue="relayq.turns.vip")
    settings = Settings.from_env({"RELAYQ_HOME": str(tmp_path)})
    rt = Runtime(settings, agents={vip.name: vip, "plain": agent()})
    try:
        assert peeked_queues(rt) == ("relayq.turns", "relayq.answers", "relayq.turns.vip")
    finally:
        rt.db.dispose()


async def test_a_client_starting_an_agent_by_name_imports_relayq_agents_to_find_its_queue(
    tmp_path, monkeypatch
):
    # Given a module defining an agent on its own queue, named by RELAYQ_AGENTS only
    name = f"by-name-{uuid.uuid4().hex[:8]}"
    module = f"agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from relayq import Agent, InProcessResponse\n"
        f"a = Agent({name!r}, lambda req: InProcessResponse(content='x'), queue='q.own')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = Settings.from_env({"RELAYQ_HOME": str(tmp_path), "RELAYQ_AGENTS": module})
    client = DurableClient(settings=settings)
    try:
        # When a run of it is started by name, the host finds the agent and its queue
        spec = await client._starts.spec(name, started_by=None, batch_id=None, budget=None)
    finally:
        client.close()
        sys.modules.pop(module, None)
    assert (spec.agent, spec.queue) == (name, "q.own")
    assert spec.tools_digest is not None


def test_an_agent_whose_queue_looks_like_a_batch_queue_is_refused():
    from relayq import Agent, AgentError, InProcessResponse

    odd = Agent(
        f"odd-{uuid.uuid4().hex[:6]}",
        lambda req: InProcessResponse(content="x"),
        queue="relayq.turns.batch.mine",
        register=False,
    )
    with pytest.raises(AgentError, match="names batch queues"):
        Settings.from_env({}).check_agent(odd)
