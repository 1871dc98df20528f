"""The docker/ stack without docker: the compose files against the Compose specification's
schema, and the services' own commands, read from docker/compose.yaml, run as native processes:
`mlflow server` with its login (basic-auth, users in PostgreSQL) on a PostgreSQL backend, the
workers' account made, and two `accel tune` nodes on one study (PostgreSQL storage), started
together on a fresh database, then one of them killed mid-trial."""

from __future__ import annotations

import copy
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, cli_main

DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
BIN = Path(sys.executable).parent
PASSWORD = "pl4nted-s3cret"  # trust auth accepts any password: it is here to be looked for
# The MLflow server's login (docker/.env): planted too, and looked for in all the stack kept.
ADMIN_PASSWORD, WORKER_PASSWORD = "adm1n-pl4nted-s3cret", "w0rker-pl4nted-s3cret"
# A few-second trial: like tests/test_search.py's TINY (digits, test_resnet, CPU).
TINY = {
    "data": {"dataset": "digits", "num_workers": 0, "val_fraction": 0.05},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 2, "epoch_length": 3, "batch_size": 16, "device": "cpu", "amp": "off",
              "lr": 3.0e-3},
    "search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}}},
}


# --- the files ------------------------------------------------------------------------------


def test_compose_files_follow_the_compose_specification(tmp_path):
    files = [DOCKER / "compose.yaml", DOCKER / "compose.gpu.yaml"]
    check = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec"]
    proc = subprocess.run([*check, *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    typo = tmp_path / "compose.yaml"  # the schema is strict: a misspelt key is caught
    typo.write_text(COMPOSE.read_text().replace("depends_on:", "depend_on:", 1))
    assert subprocess.run([*check, str(typo)], capture_output=True).returncode != 0


def test_compose_stack_reads_like_a_recipe():
    stack = yaml.safe_load(COMPOSE.read_text())
    services = stack["services"]
    assert set(services) == {"db", "mlflow", "account", "study", "worker", "dashboard"}
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    assert services["mlflow"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert "/health" in " ".join(services["mlflow"]["healthcheck"]["test"])
    assert services["mlflow"]["command"][:4] == ["python", "-m", "accel.tracking.auth", "serve"]
    assert {"--artifacts-destination", "--allowed-hosts"} <= set(services["mlflow"]["command"])
    assert services["account"]["depends_on"]["mlflow"]["condition"] == "service_healthy"
    assert services["study"]["depends_on"]["account"]["condition"] == (
        "service_completed_successfully")
    # Each service holds only its own secrets: the admin's password reaches the server and the
    # account job, never a worker; nothing reads the whole docker/.env (env_file).
    assert not [name for name, spec in services.items() if "env_file" in spec]
    for name in ("study", "worker", "dashboard"):
        environment = services[name]["environment"]
        assert environment["MLFLOW_TRACKING_PASSWORD"] == "${ACCEL_WORKER_PASSWORD}"
        assert "ACCEL_ADMIN_PASSWORD" not in repr(environment), name
    assert services["mlflow"]["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"] == (
        "${ACCEL_ADMIN_PASSWORD}")
    assert services["study"]["command"][-2:] == ["--n-trials", "0"]  # creates, runs nothing
    assert services["worker"]["depends_on"]["study"]["condition"] == (
        "service_completed_successfully")
    assert services["dashboard"]["profiles"] == ["dashboard"]
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())
    device = gpu["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["count"] == 1
    # Credentials come from docker/.env (ignored by git); no tracked file holds a password.
    example = dict(line.split("=", 1) for line in (DOCKER / ".env.example").read_text()
                   .splitlines() if "=" in line and not line.startswith("#"))
    assert example["POSTGRES_PASSWORD"] == example["ACCEL_ADMIN_PASSWORD"] == ""
    assert example["ACCEL_WORKER_PASSWORD"] == ""
    assert "docker/.env" in (ROOT / ".gitignore").read_text().splitlines()
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=" in dockerfile and re.search(r"^USER (?!root)\w+", dockerfile, re.M)
    assert 'pip install ".' in dockerfile and "-e " not in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"mlruns", ".venv", "data"} <= set(ignored)


def test_the_login_settings_hold_any_password_and_stay_private(tmp_path, monkeypatch):
    """The basic-auth app reads its user database from an ini, where `%` is special: what MLflow
    reads back is the URL as given, from a file only its owner may read."""
    from mlflow.server.auth.config import read_auth_config

    from accel.tracking.auth import auth_settings

    url = "postgresql+psycopg2://accel:p%40ss%word@db:5432/mlflow_auth"
    path = Path(auth_settings(url, "boss"))
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    settings = read_auth_config()
    assert settings.database_uri == url
    assert (settings.admin_username, settings.default_permission) == ("boss", "READ")
    assert settings.auth_cache_ttl_seconds == 60  # bench/auth_overhead.py: 4.4x per call without
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    path.unlink()
    path.parent.rmdir()


def test_nodes_starting_together_on_a_fresh_database_all_open_the_storage(postgres_url):
    """Three processes create Optuna's tables at once; the losers of that race retry."""
    code = ("import sys; from accel.tune import open_storage; open_storage(sys.argv[1]); "
            "print('opened')")
    procs = [subprocess.Popen([sys.executable, "-c", code, postgres_url], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-1500:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["opened"] * 3


# --- the services' commands, natively -----------------------------------------------------------


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `$$`."""
    def value(match: re.Match) -> str:
        name, default = match.group(1), match.group(3)
        return env.get(name) or (default if default is not None else "")

    text = re.sub(r"\$\{(\w+)(:-([^}]*))?\}", value, text)
    return text.replace("$$", "$")


class Stack:
    """docker/compose.yaml's services as native processes: same commands and environment, with
    the service names, ports and volumes of the stack replaced by local ones."""

    def __init__(self, tmp: Path, mlflow_db: str, optuna_db: str, auth_db: str, port: int,
                 env: dict):
        self.services = yaml.safe_load(COMPOSE.read_text())["services"]
        self.env = env  # what docker/.env would hold
        self.port = port
        self.replace = {  # in this order: `.../mlflow` is a prefix of `.../mlflow_auth`
            "@db:5432/mlflow_auth": f"@127.0.0.1:5432/{auth_db}",
            "@db:5432/mlflow": f"@127.0.0.1:5432/{mlflow_db}",
            "@db:5432/optuna": f"@127.0.0.1:5432/{optuna_db}",
            "http://mlflow:5000": f"http://127.0.0.1:{port}",
            "0.0.0.0": "127.0.0.1",
            "/mlflow-artifacts": str(tmp / "artifacts"),
        }
        self.cwd = tmp
        self.procs: list[subprocess.Popen] = []

    def _local(self, text: str, env: dict[str, str]) -> str:
        text = interpolate(str(text), env)
        for old, new in self.replace.items():
            text = text.replace(old, new)
        return str(self.port) if text == "5000" else text

    def command(self, service: str, **env) -> tuple[list[str], dict[str, str]]:
        """The service's argv and environment; `env` adds to what docker/.env would hold."""
        spec, dotenv = self.services[service], {**self.env, **env}
        argv = [self._local(a, dotenv) for a in spec["command"]]
        if argv[0] in ("accel", "mlflow"):
            argv = [sys.executable, "-m", argv[0], *argv[1:]]
        elif argv[0] == "python":
            argv[0] = sys.executable
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))}
        if "env_file" in spec:
            environ.update(dotenv)
        environ.update(env)  # what the test adds to a service's environment
        environ.update({k: self._local(v, dotenv) for k, v in spec.get("environment", {}).items()})
        return argv, environ

    def start(self, service: str, log: Path, **env) -> subprocess.Popen:
        """The service's process in its own session (its whole group is stopped at the end)."""
        argv, environ = self.command(service, **env)
        out = log.open("w")
        proc = subprocess.Popen(argv, cwd=self.cwd, env=environ, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        proc.log = log
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with _suppress():
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is ProcessLookupError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.log.read_text()[-3000:]
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"mlflow server not healthy after {timeout} s")


@pytest.fixture
def stack(tmp_path, postgres_databases):
    exp = copy.deepcopy(TINY)
    exp["name"] = "nodes"
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(exp, sort_keys=False))
    env = {"POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": PASSWORD, "ACCEL_STUDY": "nodes",
           "ACCEL_CONFIG": str(tmp_path / "nodes.yaml"), "ACCEL_ADMIN_PASSWORD": ADMIN_PASSWORD,
           "ACCEL_WORKER_PASSWORD": WORKER_PASSWORD}
    # The login's database is not made beforehand: the server makes it, as on an old volume.
    s = Stack(tmp_path, postgres_databases(), postgres_databases(),
              postgres_databases(create=False), free_port(), env)
    # The job runner of `mlflow server` (GenAI jobs) is not needed and would take a core.
    server = s.start("mlflow", tmp_path / "mlflow.log", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    s.url = f"http://127.0.0.1:{s.port}"
    try:
        wait_healthy(s.url, server)
        argv, environ = s.command("account")
        made = subprocess.run(argv, cwd=tmp_path, env=environ, capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0, made.stderr[-2000:]
        assert made.stdout.strip() == (f"account 'worker' on {s.url}: made, EDIT on every "
                                       "experiment and registered model")
        s.shown = [made.stdout, made.stderr]
        yield s
    finally:
        s.stop()


def run_accel(stack: Stack, *args: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    """An `accel` command as a user on a node runs it (the worker service's environment)."""
    _, environ = stack.command("worker", **env)
    return subprocess.run([sys.executable, "-m", "accel", *args], cwd=stack.cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def load_study(stack: Stack):
    import optuna

    from accel.tune import open_storage

    _, environ = stack.command("worker")
    return optuna.load_study(study_name="nodes", storage=open_storage(environ["ACCEL_STORAGE"]))


def study_runs(client, role: str | None = None) -> list:
    exp = client.get_experiment_by_name("nodes")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return [r for r in runs if role is None or r.data.tags.get("accel.role") == role]


def finished(proc: subprocess.Popen, timeout: float = 600) -> int:
    code = proc.wait(timeout=timeout)
    assert code == 0, proc.log.read_text()[-3000:]
    return code


# make test covers it: two invocations on one study: test_search's worker and PostgreSQL tests
@pytest.mark.slow
def test_two_nodes_on_one_study_through_the_tracking_server(stack, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    # The server lets no one in without a login: not the REST API, not the artifacts.
    for path in ("/api/2.0/mlflow/experiments/search?max_results=1",
                 "/api/2.0/mlflow-artifacts/artifacts"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(stack.url + path, timeout=10)
        assert refused.value.code == 401, path
    # This test reads and checks as the admin (MLflow's client takes the login by environment).
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    client = MlflowClient(stack.url)
    # A run id inherited from the environment must not redirect any of accel's runs.
    decoy = client.create_run(client.create_experiment("decoy")).info.run_id
    node = {"OMP_NUM_THREADS": "1", "ACCEL_HEARTBEAT_S": "1", "ACCEL_GRACE_S": "6",
            "MLFLOW_RUN_ID": decoy}
    # Two nodes started together on a fresh storage: both race to create tables and study.
    a = stack.start("worker", tmp_path / "a.log", ACCEL_TRIALS="5", **node)
    b = stack.start("worker", tmp_path / "b.log", ACCEL_TRIALS="1", **node)
    finished(b)
    assert a.poll() is None, "node a should still be running its trials"
    [parent] = study_runs(client, "study")
    assert parent.info.status == "RUNNING", "a node ended while another still runs"
    finished(a)

    study = load_study(stack)
    trials = study.trials
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials)
    assert sum(bool(t.user_attrs.get("accel.baseline")) for t in trials) == 1
    assert len({t.user_attrs["accel.pid"] for t in trials}) == 2, "both nodes ran trials"
    [parent] = study_runs(client, "study")
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["n_complete"] == 6
    assert parent.data.metrics["best_value"] == study.best_value
    children = study_runs(client, "trial")
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == list(range(6))
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    for run in children:  # artifacts live behind the server, readable from any machine
        assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
        path = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
        assert "test_resnet" in Path(path).read_text()
    assert not [r for r in study_runs(client) if r.info.status == "RUNNING"]
    assert client.get_run(decoy).data.params == {} and not client.get_run(decoy).data.metrics

    best = run_accel(stack, "best", "--study", "nodes")
    assert best.returncode == 0, best.stderr[-2000:]
    command = next(line for line in best.stdout.splitlines() if line.startswith("reproduce:"))
    rerun = run_accel(stack, *command.split()[2:], OMP_NUM_THREADS="1")
    assert rerun.returncode == 0, rerun.stderr[-2000:] + rerun.stdout
    assert "config from config.yaml" in rerun.stdout and "(exactly)" in rerun.stdout
    stack.shown += [best.stdout, best.stderr, rerun.stdout, rerun.stderr]

    _a_colleague_who_browses(stack, client, monkeypatch)
    _a_wrong_password_is_one_line(stack)
    _kill_a_node_mid_trial(stack, client, tmp_path, node)
    _the_passwords_are_kept_nowhere(stack, tmp_path)


def _a_colleague_who_browses(stack: Stack, admin, monkeypatch) -> None:
    """An account made --read-only lists the study's runs but cannot log to them."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    argv, environ = stack.command("account")
    environ.update(MLFLOW_TRACKING_USERNAME="colleague", MLFLOW_TRACKING_PASSWORD="c0lleague-pw-x")
    made = subprocess.run([*argv, "--read-only"], cwd=stack.cwd, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.strip().endswith("made, read-only")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "colleague")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "c0lleague-pw-x")
    colleague = MlflowClient(stack.url)
    experiment = colleague.get_experiment_by_name("nodes").experiment_id
    seen = colleague.search_runs([experiment], max_results=1000)
    assert len(seen) == len(study_runs(admin)) > 0
    for write in (lambda: colleague.log_metric(seen[0].info.run_id, "x", 1.0),
                  lambda: colleague.create_run(experiment)):
        with pytest.raises(MlflowException) as refused:
            write()
        assert refused.value.error_code == "PERMISSION_DENIED"
    assert "x" not in admin.get_run(seen[0].info.run_id).data.metrics
    # Through accel: one line, exit 2, naming the account and what it was refused.
    code, _, err = cli_main("train", stack.env["ACCEL_CONFIG"], "--tracking-uri", stack.url)
    assert code == 2, err[-2000:]
    assert err.strip().splitlines() == [
        f"accel: error: the MLflow server at {stack.url} does not let 'colleague' write here "
        "(/api/2.0/mlflow/runs/create): runs are logged by an account with EDIT; ask its admin "
        "(docs/scale-out.md)"]
    assert len(study_runs(admin)) == len(seen)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)


def _a_wrong_password_is_one_line(stack: Stack) -> None:
    """A node with a wrong password (or none) stops at the probe: one line, exit 2, no retries."""
    for password, says in (("not-the-w0rker-password", "refused the credentials of 'worker'"),
                           ("", "asks for a login")):
        started = time.time()
        proc = run_accel(stack, "tune", stack.env["ACCEL_CONFIG"], "--study", "nodes",
                         "--n-trials", "1", ACCEL_WORKER_PASSWORD=password, timeout=120)
        took = time.time() - started
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and stack.url in lines[0], proc.stderr
        assert took < 30, f"{took:.0f} s: interpreter start-up included, the probe waits <= 10 s"
        stack.shown += [proc.stdout, proc.stderr]


def _the_passwords_are_kept_nowhere(stack: Stack, tmp_path: Path) -> None:
    """Neither the admin's nor the workers' password is in what the commands printed, in any
    node's log, in MLflow's params, tags and artifacts, or in Optuna's attrs."""
    from tests.test_secrets import everything_mlflow_holds, everything_optuna_holds

    _, environ = stack.command("worker")
    places = {
        "output": stack.shown + [p.log.read_text() for p in stack.procs],  # the server's too
        "MLflow": everything_mlflow_holds(stack.url, tmp_path / "held"),
        "Optuna": everything_optuna_holds(environ["ACCEL_STORAGE"]),
    }
    assert len(places["MLflow"]) > 100  # the search really read them
    for place, texts in places.items():
        for secret in (ADMIN_PASSWORD, WORKER_PASSWORD):
            assert not [t for t in texts if secret in t], f"a password leaked into {place}"


def _kill_a_node_mid_trial(stack: Stack, client, tmp_path: Path, node: dict) -> None:
    """SIGKILL a node inside a trial: the next node to start a trial once the dead one's
    heartbeats are stale fails it and runs it again with the same values; its MLflow run ends
    FAILED, as a dead worker's on every storage. (A node started beside it could finish all of
    its tiny trials within the grace period, and so never see the dead trial.)"""
    d = stack.start("worker", tmp_path / "d.log", ACCEL_TRIALS="3", **node)
    deadline = time.time() + 300
    while time.time() < deadline:
        running = [t for t in load_study(stack).trials  # inside the trial: its values drawn
                   if t.state.name == "RUNNING" and t.user_attrs.get("accel.pid") == d.pid
                   and t.params]
        if running:
            break
        assert d.poll() is None, d.log.read_text()[-3000:]
        time.sleep(0.3)
    else:
        raise AssertionError("node d never started a trial")
    os.killpg(d.pid, signal.SIGKILL)
    d.wait()
    stale = time.time() + float(node["ACCEL_GRACE_S"]) + 1
    while time.time() < stale:  # the dead trial's last heartbeat is older than the grace
        time.sleep(0.3)
    c = stack.start("worker", tmp_path / "c.log", ACCEL_TRIALS="2", **node)
    finished(c)

    study = load_study(stack)
    dead = study.trials[running[0].number]
    assert dead.state.name == "FAIL"
    [retried] = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retried.state.name == "COMPLETE" and retried.params == dead.params
    assert retried.user_attrs["accel.pid"] == c.pid
    runs = {r.data.tags["optuna.trial_number"]: r for r in study_runs(client, "trial")}
    assert runs[str(dead.number)].info.status == "FAILED"
    assert runs[str(dead.number)].data.tags["optuna.trial_state"] == "FAIL"
    assert len(runs) == len(study.trials)  # each trial exactly one run
    [parent] = study_runs(client, "study")
    assert parent.info.status == "FINISHED"
    assert not [r for r in study_runs(client) if r.info.status == "RUNNING"]
    assert not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]
