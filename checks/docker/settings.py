"""The docker check's fixed settings: the project, its images and the stand-ins' recipes."""

from __future__ import annotations

from checks.common import ROOT, stamped

DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_FILE = DOCKER / ".env"
PROJECT = "accel"
IMAGE = "accel:cpu"
PYTHON_BASE, POSTGRES_BASE = "python:3.11-slim", "postgres:17"
MLFLOW_URL = "http://127.0.0.1:5000"
# docker/.env's passwords, made at random where the check makes docker/.env.
PASSWORDS = ("POSTGRES_PASSWORD", "ACCEL_ADMIN_PASSWORD", "ACCEL_WORKER_PASSWORD")
MIRROR = "http://deb.debian.org/debian"
PG_BIN = "/usr/lib/postgresql/15/bin"  # bookworm's PostgreSQL
# What each stand-in holds, and the image settings `docker import` gives it (what the official
# image's Dockerfile would have set).
STANDINS = {
    PYTHON_BASE: {
        "packages": ["python3", "python3-venv", "python3-pip", "python-is-python3",
                     "ca-certificates"],
        "changes": ["ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "ENV LANG=C.UTF-8", 'CMD ["python3"]'],
    },
    POSTGRES_BASE: {
        "packages": ["postgresql", "postgresql-client", "ca-certificates"],
        "changes": [f"ENV PATH={PG_BIN}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "ENV LANG=C.UTF-8", "ENV PGDATA=/var/lib/postgresql/data",
                    'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]', "EXPOSE 5432"],
    },
}
# The check's own settings for the services (a second compose file; compose.yaml is unchanged).
OVERRIDE = """\
x-check: &check
  environment:
    OMP_NUM_THREADS: "1"
    ACCEL_HEARTBEAT_S: "2"
    ACCEL_GRACE_S: "10"
services:
  study: *check
  worker: *check
"""

log = stamped("docker-check")

