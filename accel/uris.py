"""Store URLs: the default MLflow and Optuna stores, SQLite paths, and hiding passwords.

A storage or tracking URL may hold a password (`postgresql://user:pw@host/db`, `://:pw@host`,
`?password=pw`). It is never printed or logged as given: `redact` is applied to every URL that
reaches a message, a tag or a param.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"  # artifacts beside it, in mlruns/artifacts/
DEFAULT_STORAGE = "mlruns/optuna.journal"  # Optuna's journal file (accel.tune.storage)
SQLITE_PREFIX = "sqlite:///"


def resolve_uri(uri: str | None = None) -> str:
    """The MLflow store: the given URI, else $MLFLOW_TRACKING_URI, else the project's default."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


# `scheme://user:pw@host` and `scheme://:pw@host` (the user may be empty); no whitespace, so that
# in a message the match never runs past the URL.
_USERINFO = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
# `?password=pw` / `&password=pw`: libpq, SQLAlchemy and psycopg take the password as a query
# parameter too; so do some servers' tokens.
_QUERY = re.compile(r"([?&;](?:password|passwd|pwd|secret|token|access_token|api_key)=)[^&#\s]*",
                    re.IGNORECASE)


def redact(uri: str) -> str:
    """The URI (or a message holding one) with any password replaced, for messages and logs."""
    return _QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", uri))


def sqlite_path(uri: str) -> Path | None:
    """`sqlite:///mlruns/mlflow.db` -> Path("mlruns/mlflow.db"); None for any other URL."""
    if uri.startswith(SQLITE_PREFIX):
        return Path(uri[len(SQLITE_PREFIX) :])
    return None


def with_driver(url: str) -> str:
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3; use psycopg2 where only it is there."""
    import importlib.util

    prefix = "postgresql://"
    if (url.startswith(prefix) and importlib.util.find_spec("psycopg") is None
            and importlib.util.find_spec("psycopg2") is not None):
        return "postgresql+psycopg2://" + url[len(prefix):]
    return url
