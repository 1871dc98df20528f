"""A shared tracking server with a login: MLflow's basic-auth app, set up from the environment.

    python -m accel.tracking.auth serve [mlflow server options]   # the server, with a login
    python -m accel.tracking.auth account [--read-only]           # an account on it

`serve` writes the login's settings (users in the database ACCEL_AUTH_DATABASE_URI, every
logged-in user may read, nobody anonymous may, a password check trusted for
ACCEL_AUTH_CACHE_TTL_S, default 60 s) to a private file and becomes
`mlflow server --app-name basic-auth ...`. The admin is MLFLOW_AUTH_ADMIN_USERNAME (default
`admin`) with MLFLOW_AUTH_ADMIN_PASSWORD, made on the first start.

`account` makes, as that admin, the account MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD
name (or sets its password to that one): with EDIT on every experiment and registered model for
the nodes that run trials, or `--read-only` for a colleague who only browses. Passwords come
from the environment only, never from argv (visible in `ps`), and are never printed.
"""

from __future__ import annotations

import argparse
import configparser
import os
import secrets
import sys
import tempfile
from pathlib import Path

from accel.console import quiet_libraries
from accel.errors import ConfigError
from accel.tracking.store import check_reachable
from accel.uris import redact, resolve_uri, with_driver

DEFAULT_ADMIN = "admin"
# Logged-in users read everything; they edit what they created or were granted (an account
# made by `account` without --read-only is granted EDIT on every experiment and model).
DEFAULT_PERMISSION = "READ"
RESOURCES = ("experiment", "registered_model")
# MLflow checks the password of every request (PBKDF2: about 0.2 s of server CPU on a 2-core
# EPYC, 20x the request itself, bench/auth_overhead.py); a check that passed is trusted this
# long. A password changed or an account deleted through another server worker is then still
# accepted by this one for at most this long.
AUTH_CACHE_TTL_S = 60


def auth_settings(database_uri: str, admin: str, cache_ttl_s: int = AUTH_CACHE_TTL_S) -> str:
    """The basic-auth app's ini (its only way to take the user database). `%` is the ini's
    interpolation character: a password holding one is written doubled."""
    ini = configparser.ConfigParser(interpolation=None)
    ini["mlflow"] = {
        "default_permission": DEFAULT_PERMISSION,
        "database_uri": with_driver(database_uri).replace("%", "%%"),
        "admin_username": admin,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        "auth_cache_ttl_seconds": str(cache_ttl_s),
    }
    folder = Path(tempfile.mkdtemp(prefix="accel-auth-"))  # 0700: the database password
    path = folder / "basic_auth.ini"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        ini.write(f)
    return str(path)


def ensure_database(url: str) -> None:
    """A PostgreSQL database for the users, made on the same server when it is missing (MLflow
    does not make it, and a volume from before the login has none)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(with_driver(url))
    if not target.drivername.startswith("postgresql"):
        return  # SQLite makes its file itself
    engine = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as db:
            found = db.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                               {"name": target.database}).scalar()
            if found is None:
                db.execute(text(f'CREATE DATABASE "{target.database}"'))
    except Exception as e:
        raise ConfigError(f"cannot make the login's database {redact(url)}: "
                          f"{redact(str(e).splitlines()[0])}") from None
    finally:
        engine.dispose()


def serve(server_args: list[str]) -> None:
    """Become `mlflow server --app-name basic-auth SERVER_ARGS` (same process: signals reach it)."""
    database = os.environ.get("ACCEL_AUTH_DATABASE_URI")
    if not database:
        raise ConfigError("ACCEL_AUTH_DATABASE_URI is not set: the login's users need a "
                          "database, e.g. postgresql://user:pw@db:5432/mlflow_auth")
    if not os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD"):
        raise ConfigError("MLFLOW_AUTH_ADMIN_PASSWORD is not set: the server's first start "
                          "makes its admin with it (12 characters or more)")
    admin = os.environ.setdefault("MLFLOW_AUTH_ADMIN_USERNAME", DEFAULT_ADMIN)
    ensure_database(database)
    ttl = os.environ.get("ACCEL_AUTH_CACHE_TTL_S", str(AUTH_CACHE_TTL_S))
    if not ttl.isdigit():
        raise ConfigError(f"ACCEL_AUTH_CACHE_TTL_S={ttl!r}: seconds, 0 or more (0: every "
                          "request's password is checked)")
    os.environ["MLFLOW_AUTH_CONFIG_PATH"] = auth_settings(database, admin, int(ttl))
    # Signs the UI's sessions; one per start is enough for a login by password.
    os.environ.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(32))
    argv = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", *server_args]
    sys.stdout.flush()
    os.execv(sys.executable, argv)


def _environ(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{name} is not set")
    return value


def account(uri: str, read_only: bool) -> str:
    """Make (or update) the account MLFLOW_TRACKING_USERNAME names, as the admin. Returns what
    was done, in one line."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client

    user, password = _environ("MLFLOW_TRACKING_USERNAME"), _environ("MLFLOW_TRACKING_PASSWORD")
    admin = os.environ.get("MLFLOW_AUTH_ADMIN_USERNAME") or DEFAULT_ADMIN
    admin_password = _environ("MLFLOW_AUTH_ADMIN_PASSWORD")
    # MLflow's client takes the login from these two variables: the admin's, for now.
    os.environ.update(MLFLOW_TRACKING_USERNAME=admin, MLFLOW_TRACKING_PASSWORD=admin_password)
    try:
        check_reachable(uri)
        client = get_app_client("basic-auth", tracking_uri=uri)
        try:
            client.create_user(user, password)
            done = "made"
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            client.update_user_password(user, password)
            done = "password set"
        for resource in RESOURCES:
            if read_only:
                _revoke(client, user, resource)
            else:
                _grant(client, user, resource, "EDIT")
    finally:
        os.environ.update(MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=password)
    rights = "read-only" if read_only else "EDIT on every experiment and registered model"
    return f"account {user!r} on {redact(uri)}: {done}, {rights}"


def _grant(client, user: str, resource: str, permission: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.grant_user_permission(user, resource, "*", permission)
    except MlflowException as e:  # granted by an earlier start
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _revoke(client, user: str, resource: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.revoke_user_permission(user, resource, "*")
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel.tracking.auth",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="mlflow server --app-name basic-auth, set up from the "
                       "environment; other options go to mlflow server")
    a = sub.add_parser("account", help="make the account MLFLOW_TRACKING_USERNAME names, as "
                       "the admin (MLFLOW_AUTH_ADMIN_USERNAME / _PASSWORD)")
    a.add_argument("--read-only", action="store_true",
                   help="an account that browses: no grants beyond READ")
    a.add_argument("--tracking-uri", metavar="URL", help="the server (default "
                   "$MLFLOW_TRACKING_URI)")
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "serve":
            serve(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        uri = resolve_uri(args.tracking_uri)
        if not uri.startswith(("http://", "https://")):
            raise ConfigError(f"--tracking-uri {redact(uri)}: accounts live on a tracking "
                              "server (http://host:port)")
        quiet_libraries()
        print(account(uri, args.read_only))
        return 0
    except ConfigError as e:
        print(f"accel.tracking.auth: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
