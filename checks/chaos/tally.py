"""What the chaos left: the study's trials and MLflow's runs counted, and the table printed."""

from __future__ import annotations

from collections import Counter

from checks.chaos.faults import KINDS, STUDY, Chaos


def figures(chaos: Chaos) -> dict:
    """What the study and MLflow hold after the chaos."""
    from mlflow.tracking import MlflowClient
    from optuna.storages import RetryFailedTrialCallback

    from accel.tune.storage import MAX_RETRY

    trials = chaos.trials()
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    lost = [(t.number, t.user_attrs.get("accel.error", "no error recorded")) for t in trials
            if t.state.name == "FAIL" and t.number not in retried
            and len(RetryFailedTrialCallback.retry_history(t)) < MAX_RETRY]
    client = MlflowClient(chaos.server.url)
    exp = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    per_trial = Counter(r.data.tags.get("optuna.trial_number") for r in runs
                        if r.data.tags.get("accel.role") == "trial")
    parents = [r for r in runs if r.data.tags.get("accel.role") == "study"]
    return {
        "trials": Counter(t.state.name for t in trials), "retried": len(retried),
        "lost": lost, "running": [r.info.run_name for r in runs if r.info.status == "RUNNING"],
        "runs per trial": Counter(per_trial.get(str(t.number), 0) for t in trials
                                  if t.state.name != "WAITING"),
        "parent": [p.info.status for p in parents],
    }


def report(chaos: Chaos, found: dict, seconds: float, seed: int, took: float) -> bool:
    ok = (not found["lost"] and not found["running"] and set(found["runs per trial"]) == {1}
          and found["parent"] == ["FINISHED"] and not chaos.tracebacks)
    print(f"## chaos: seed {seed}, {seconds:.0f} s of faults, {took:.0f} s in all")
    print("| figure | value |\n| --- | --- |")
    print(f"| faults | {sum(chaos.faults.values())}: "
          + ", ".join(f"{chaos.faults[k]} {k}" for k in KINDS) + " |")
    print("| invocations (how ended: exit code) | "
          + ", ".join(f"{how}: {code}" for how, code, _ in chaos.exits) + " |")
    print(f"| trials | {sum(found['trials'].values())}: "
          + ", ".join(f"{n} {s}" for s, n in sorted(found["trials"].items())) + " |")
    print(f"| retried (queued again) | {found['retried']} |")
    print(f"| lost (FAIL, not retried, under the retry limit) | {len(found['lost'])} "
          f"{[n for n, _ in found['lost']] or ''} |")
    print(f"| runs RUNNING | {len(found['running'])} {found['running'] or ''} |")
    print("| runs per trial | " + ", ".join(f"{n} trial(s) with {k}" for k, n in
                                           sorted(found["runs per trial"].items())) + " |")
    print(f"| parent run | {', '.join(found['parent'])} |")
    print(f"| frozen workers back to a trial failed meanwhile (left to its retry) | "
          f"{chaos.lost_leases} |")
    print(f"| invocations with a traceback | {len(chaos.tracebacks)} "
          f"{chaos.tracebacks or ''} |")
    print(f"verdict: {'nothing lost' if ok else 'LOST, LEFT RUNNING OR A TRACEBACK'}")
    for number, error in found["lost"]:
        print(f"  lost trial {number}: {error}")
    for i, (how, code, last) in enumerate(chaos.exits):
        if last:
            print(f"  invocation {i} ({how}, exit {code}): {last}")
    return ok
