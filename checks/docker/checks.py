"""What the check asserts of a study that ran on the stack: its runs, the best trial and its
reproduction, the retried trial, the throughput, and nothing left behind."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from checks.docker.helpers import child_runs, client, in_worker, study_parents, trials_per_minute
from checks.docker.settings import PROJECT

if TYPE_CHECKING:
    from checks.docker.machine import Check


def check_runs(check: Check, name: str, trials: list[dict]) -> None:
    parents = study_parents(name)
    if not check.expect(len(parents) == 1, f"{name}: one parent run", f"{len(parents)} found"):
        return
    check.expect(parents[0].info.status == "FINISHED", f"{name}: parent run FINISHED",
                 parents[0].info.status)
    children = child_runs(name)
    numbers = sorted(int(r.data.tags["optuna.trial_number"]) for r in children)
    check.expect(numbers == [t["number"] for t in trials],
                 f"{name}: one child run per trial ({len(trials)})", f"{numbers}")
    uris = [r.info.artifact_uri for r in children]
    check.expect(all(u.startswith("mlflow-artifacts:") for u in uris),
                 f"{name}: artifacts stored as mlflow-artifacts: URIs", f"{uris[:2]}")
    with tempfile.TemporaryDirectory() as tmp:
        path = client().download_artifacts(children[0].info.run_id, "config.yaml", tmp)
        check.expect("accel_cnn_s" in Path(path).read_text(),
                     f"{name}: config.yaml downloaded from the server to the host")


def check_best_and_reproduce(check: Check, name: str) -> None:
    model = f"{name}-best"
    best = in_worker(check, "accel", "best", "--study", name, "--register", model)
    if not check.expect(best.returncode == 0, f"{name}: accel best --register {model}",
                        best.stderr[-1500:]):
        return
    versions = client().search_model_versions(f"name = '{model}'")
    check.expect(len(versions) == 1, f"{name}: model version registered on the server")
    lines = [ln for ln in best.stdout.splitlines() if ln.startswith("reproduce:")]
    if not check.expect(bool(lines), f"{name}: accel best prints the reproduce command",
                        best.stdout[-1000:]):
        return
    argv = lines[0].split()[1:]  # "reproduce: accel reproduce RUN_ID ..."
    rerun = in_worker(check, *argv, OMP_NUM_THREADS="1")
    check.expect(rerun.returncode == 0 and "(exactly)" in rerun.stdout,
                 f"{name}: accel reproduce of the best trial is exact",
                 rerun.stdout[-1000:] + rerun.stderr[-1000:])


def check_retry(check: Check, name: str, trials: list[dict]) -> None:
    failed = [t for t in trials if t["state"] == "FAIL"]
    if not check.expect(len(failed) == 1, f"{name}: the killed worker's trial FAIL",
                        f"{[(t['number'], t['state']) for t in trials]}"):
        return
    dead = failed[0]
    retried = [t for t in trials if t["failed_trial"] == dead["number"]]
    check.expect(len(retried) == 1 and retried[0]["state"] in ("COMPLETE", "PRUNED")
                 and retried[0]["params"] == dead["params"],
                 f"{name}: trial {dead['number']} retried with the same values by the other "
                 "worker", f"{retried}")
    runs = {r.data.tags["optuna.trial_number"]: r for r in child_runs(name)}
    run = runs.get(str(dead["number"]))
    check.expect(run is not None and run.info.status == "FAILED",
                 f"{name}: the dead trial's MLflow run FAILED",
                 run.info.status if run else "no run")
    check.expect(len(runs) == len(trials) and not [r for r in runs.values()
                                                    if r.info.status == "RUNNING"],
                 f"{name}: one run per trial, none left RUNNING")


def throughput(check: Check, name: str, workers: int, result: dict) -> None:
    spans = [(r.info.start_time / 1000, r.info.end_time / 1000) for r in child_runs(name)
             if r.info.end_time]
    rate = trials_per_minute(spans)
    n = len(result["trials"])
    whole = 60.0 * n / result["wall"]
    check.rows.append((f"trials per minute, {workers} worker{'s' * (workers > 1)}",
                       f"{rate:.1f} (first trial start to last end); {whole:.1f} counting "
                       f"container start-up ({n} trials in {result['wall']:.0f} s)"))


def leftovers(check: Check) -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    found = []
    for kind in ("container", "network", "volume"):
        argv = ["docker", kind, "ls", "-q", "--filter", label]
        if kind == "container":
            argv.insert(3, "-a")
        out = check.run(argv).stdout.split()
        found += [f"{kind} {x[:12]}" for x in out]
    return found

