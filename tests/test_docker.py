"""What `make docker-check` relies on, checked without a docker daemon: the compose file as
Debian's docker-compose 1.29 reads it, the Dockerfile's extra-CA argument, the stand-in images'
recipe, the check's own helpers (checks/docker/), and bench/stack_capacity.py on a tiny scale."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from bench import stack_capacity as sc
from checks.docker.helpers import (
    debootstrap_argv,
    parse_dotenv,
    prune_paths,
    read_extra_ca,
    trials_per_minute,
)
from checks.docker.settings import OVERRIDE, PG_BIN, POSTGRES_BASE, PROJECT, PYTHON_BASE, STANDINS
from tests.conftest import ROOT

DOCKER = ROOT / "docker"


def test_compose_file_is_read_by_compose_v1_and_v2():
    stack = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    # docker-compose 1.29 refuses a top-level `name:`; the project name comes from .env or -p.
    assert "name" not in stack
    example = parse_dotenv((DOCKER / ".env.example").read_text())
    assert example["COMPOSE_PROJECT_NAME"] == PROJECT
    args = stack["x-accel"]["build"]["args"]
    assert args["EXTRA_CA_CERT"] == "${EXTRA_CA_CERT:-}"


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose (v1) not installed")
def test_docker_compose_v1_accepts_the_stack_and_the_checks_override(tmp_path):
    copy = tmp_path / "docker"
    shutil.copytree(DOCKER, copy, ignore=shutil.ignore_patterns(".env"))
    (copy / ".env").write_text((DOCKER / ".env.example").read_text().replace(
        "POSTGRES_PASSWORD=\n", "POSTGRES_PASSWORD=not-a-secret\n"))
    override = tmp_path / "override.yaml"
    override.write_text(OVERRIDE)
    proc = subprocess.run(["docker-compose", "-p", PROJECT, "-f", str(copy / "compose.yaml"),
                           "-f", str(override), "config"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    merged = yaml.safe_load(proc.stdout)
    assert merged["services"]["worker"]["environment"]["ACCEL_GRACE_S"] == "10"
    assert merged["services"]["worker"]["environment"]["MLFLOW_TRACKING_URI"] == (
        "http://mlflow:5000")  # the override adds to the service's environment, replaces none
    # Two machines: docker/.env publishes the stores on a private address, MLflow answers to it.
    with (copy / ".env").open("a") as env:
        env.write("ACCEL_DB_BIND=10.0.0.5\nACCEL_MLFLOW_BIND=10.0.0.5\n"
                  "ACCEL_ALLOWED_HOSTS=mlflow,mlflow:*,10.0.0.5,10.0.0.5:*\n")
    proc = subprocess.run(["docker-compose", "-p", PROJECT, "-f", str(copy / "compose.yaml"),
                           "config"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    assert services["db"]["ports"] == ["10.0.0.5:5432:5432/tcp"]  # v1 writes the short form
    assert services["mlflow"]["ports"] == ["10.0.0.5:5000:5000/tcp"]
    assert "mlflow,mlflow:*,10.0.0.5,10.0.0.5:*" in services["mlflow"]["command"]


def test_every_setting_the_stack_reads_is_in_the_env_example():
    """docker/.env.example names every variable compose.yaml reads; the ports a node on
    another machine needs are published on 127.0.0.1 unless .env says otherwise."""
    import re

    used = set(re.findall(r"\$\{(\w+)", (DOCKER / "compose.yaml").read_text()))
    text = (DOCKER / ".env.example").read_text()
    assert sorted(v for v in used if v not in text) == []
    example = parse_dotenv(text)
    assert example["ACCEL_DB_BIND"] == example["ACCEL_MLFLOW_BIND"] == "127.0.0.1"
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    assert services["db"]["ports"] == ["${ACCEL_DB_BIND:-127.0.0.1}:${ACCEL_DB_PORT:-5432}:5432"]
    assert services["mlflow"]["ports"] == [
        "${ACCEL_MLFLOW_BIND:-127.0.0.1}:${ACCEL_MLFLOW_PORT:-5000}:5000"]
    command = services["mlflow"]["command"]
    hosts = command[command.index("--allowed-hosts") + 1]
    assert hosts == "${ACCEL_ALLOWED_HOSTS:-" + example["ACCEL_ALLOWED_HOSTS"] + "}"


def test_dockerfile_takes_an_extra_ca_for_the_build():
    text = (DOCKER / "Dockerfile").read_text()
    # Declared after FROM: an ARG before FROM is not seen by the build steps.
    assert text.index("ARG EXTRA_CA_CERT") > text.index("FROM ${BASE_IMAGE}")
    install = text[text.index("ARG EXTRA_CA_CERT"):]
    assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in install
    assert install.index("PIP_CERT") < install.index('pip install ".[dashboard,auth]"')


def test_extra_ca_comes_from_a_file_or_the_hosts_local_certificates(tmp_path):
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    assert read_extra_ca(str(pem)) == pem.read_text().strip()


def test_standins_match_what_the_stack_calls():
    python = STANDINS[PYTHON_BASE]
    # The Dockerfile and the healthchecks call `python`; Debian names it python3.
    assert "python-is-python3" in python["packages"]
    assert "/usr/lib/python3.11/EXTERNALLY-MANAGED" in prune_paths(PYTHON_BASE)
    postgres = STANDINS[POSTGRES_BASE]
    assert any(c.startswith(f"ENV PATH={PG_BIN}:") for c in postgres["changes"])  # pg_isready
    argv = debootstrap_argv(ROOT / "rootfs", python["packages"])
    assert argv[argv.index("--variant=minbase") + 1].startswith("--include=python3,")


def test_postgres_standin_entrypoint_keeps_the_official_contract():
    script = DOCKER / "standin" / "postgres-entrypoint.sh"
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for word in ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB",
                 "/docker-entrypoint-initdb.d", "scram-sha-256"):
        assert word in text
    assert "--pwfile" in text  # the password never reaches a command line


def test_trials_per_minute_counts_from_first_start_to_last_end():
    assert trials_per_minute([(0.0, 10.0), (5.0, 30.0)]) == pytest.approx(4.0)
    assert trials_per_minute([]) == 0.0


def test_capacity_levels_and_saturation():
    assert sc.worker_counts(32) == [1, 2, 4, 8, 16, 32]
    assert not sc.saturated([10.0, 19.0])
    assert sc.saturated([10.0, 19.0, 20.0])
    assert sc.percentile([5.0, 1.0, 3.0], 0.5) == 3.0


@pytest.mark.slow
def test_capacity_bench_runs_against_a_native_stack(postgres_databases, capsys):
    rows = sc.main(["--max-workers", "2", "--seconds", "3", "--epoch-s", "0.05", "--epochs", "1",
                    "--checkpoint-kb", "1"])
    assert [r["workers"] for r in rows] == [1, 2]
    assert all(r["trials"] > 0 and r["p95_ms"] >= r["p50_ms"] > 0 for r in rows)
    assert "| 2 |" in capsys.readouterr().out
