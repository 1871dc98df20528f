"""Which `accel tune` invocations ("nodes", on this host or others) are working on a study.

Each invocation keeps a lease in the study's user attrs (`accel.node.<invocation>`: host, pid,
last beat, ended), renewed by a background thread every heartbeat. The study's MLflow parent run
is FINISHED by the last node to end: a node that ends while another node's lease is live leaves
it RUNNING. A node that died (SIGKILL, a lost machine) stops beating and its lease expires after
the grace period, like its trials' heartbeats; a parent run left RUNNING when every lease has
ended or expired is finished by the next `accel best` (`finish_abandoned_parent`) or `accel tune`.
A node's lease begins before it reopens the parent run (study set-up) and ends after it closed
its trials.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from accel.console import warn
from accel.errors import one_line
from accel.tracking import retry_locked
from accel.tune import study_record as record
from accel.tune.storage import grace_s, heartbeat_s

ATTR_NODE = "accel.node."  # + invocation id: a study user attr per node


class NodeLease:
    """`with NodeLease(study, invocation):` the node is live while the block runs."""

    def __init__(self, study, invocation: str):
        self.study, self.invocation = study, invocation
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="accel-node-lease", daemon=True)

    def __enter__(self) -> NodeLease:
        write_lease(self.study, self.invocation)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        end_lease(self.study, self.invocation)

    def _beat(self) -> None:
        while not self._stop.wait(heartbeat_s()):
            try:
                write_lease(self.study, self.invocation)
            except Exception as e:  # a storage hiccup: the next beat tries again
                warn(f"could not renew this node's lease on the study: {one_line(e)}")


def write_lease(study, invocation: str, ended: bool = False) -> None:
    study.set_user_attr(ATTR_NODE + invocation, {
        "host": socket.gethostname(), "pid": os.getpid(), "beat": time.time(), "ended": ended,
    })


def end_lease(study, invocation: str) -> None:
    write_lease(study, invocation, ended=True)


def live_nodes(study, exclude: str | None = None) -> list[str]:
    """Invocation ids of the nodes whose lease is live (not ended, beat within the grace
    period, and, on this host, a process that still exists)."""
    now, grace, host = time.time(), grace_s(), socket.gethostname()
    live = []
    for key, lease in study.user_attrs.items():
        if not key.startswith(ATTR_NODE) or not isinstance(lease, dict):
            continue
        invocation = key[len(ATTR_NODE):]
        if invocation == exclude or lease.get("ended"):
            continue
        fresh = now - float(lease.get("beat", 0)) <= grace
        if fresh and (lease.get("host") != host or process_alive(lease.get("pid"))):
            live.append(invocation)
    return live


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return True


def finish_abandoned_parent(study, tracker) -> str | None:
    """End the study's parent run FAILED when it is RUNNING and no node's lease is live: its
    last node died (SIGKILL, a lost machine) after another node had left it RUNNING. Returns
    the run id when it did so."""
    run_id = study.user_attrs.get(record.ATTR_PARENT)
    if not run_id or live_nodes(study):
        return None
    try:
        if retry_locked(tracker.client.get_run, run_id).info.status != "RUNNING":
            return None
    except Exception:  # the parent run is in another MLflow store
        return None
    reason = (f"every node's lease on the study ended or expired (grace {grace_s():.0f} s) "
              "while this run was RUNNING: its last node stopped without ending it")
    retry_locked(tracker.set_tags, run_id, {record.ATTR_ERROR: reason})
    record.update_parent(tracker, study, run_id, plots=False)
    retry_locked(tracker.end_run, run_id, "FAILED")
    return run_id
