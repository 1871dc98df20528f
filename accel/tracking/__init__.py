"""MLflow: writing runs (`client`), where a run ran (`environment`), and reading an existing
store back (`store`). Study and ablation runs build on these; see `accel.tune.study_record`."""

from accel.tracking.client import Tracker, retry_locked, scratch_dir, tracker_for
from accel.tracking.environment import cpu_name, environment, environment_diff
from accel.uris import DEFAULT_URI, redact, resolve_uri

__all__ = ["DEFAULT_URI", "Tracker", "cpu_name", "environment", "environment_diff", "redact",
           "resolve_uri", "retry_locked", "scratch_dir", "tracker_for"]
