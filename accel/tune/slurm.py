"""`accel tune ... --slurm N`: a study's workers as one Slurm job array, submitted with `sbatch`.

The submitting process sets the study up once (study, parent run, queued and copied trials: the
`accel tune --n-trials 0` of the compose stack's one-shot `study` job), writes the batch script,
prints it, keeps it under `--slurm-dir` and logs it on the study's parent run, then submits it.
Each array task runs `accel tune --study S` on its share of the trials.

Plain `sbatch`, not submitit: the job is a shell script the user can read, keep and resubmit, and
accel keeps its own stop handling (submitit installs its own SIGTERM/SIGUSR2 handlers and
pickles the function it runs).

Preemption and time limits: the script asks Slurm for SIGUSR1 `--slurm-warn` seconds before the
time limit (`--signal=B:USR1@S`, to the batch shell), passes it to accel as SIGTERM (a stop: the
running trial ends FAIL, its run KILLED, and it is queued again) and then requeues the task
(`scontrol requeue`). A preempted or requeued task gets SIGTERM from Slurm itself, the same stop.
A requeued task runs what its earlier attempts left of its share: each attempt appends its host
and accel's pid to `task-<i>.pids`, and `python -m accel.tune.slurm left` counts the trials that
those processes finished (their node leases name host and pid).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accel.console import progress, quiet_libraries, warn
from accel.errors import ConfigError, one_line
from accel.tracking import retry_locked, tracker_for
from accel.tune import study_record as record
from accel.tune.commands import cli_tune
from accel.tune.nodes import ATTR_NODE
from accel.tune.storage import default_storage, open_storage
from accel.uris import redact, resolve_uri

WARN_S = 300  # SIGUSR1 this long before the time limit: a stop's clean-up takes seconds
TASK_LOG = "%x-%A_%a.out"  # Slurm's filename pattern: job name, array job id, task index


@dataclass
class SlurmJob:
    """What the batch script is made from (no storage or tracking URI: they go by environment,
    so a password never lands in the script, the job's argv or the logged artifact)."""

    study: str
    tasks: int
    n_trials: int
    tune_args: list[str]  # `accel tune` arguments besides --study and --n-trials
    folder: Path  # the script, the task logs and the tasks' pid files
    workdir: Path
    python: str = sys.executable
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    warn_s: int = WARN_S
    sbatch: list[str] = field(default_factory=list)


def share(n_trials: int, tasks: int, index: int) -> int:
    """Task `index`'s trials: an equal share, one more for the first `n_trials % tasks`."""
    return n_trials // tasks + (1 if index < n_trials % tasks else 0)


def check_launch(storage: str, tracking_uri: str, tasks: int) -> None:
    """The refusals before anything is made: one line each (exit 2)."""
    if tasks < 1:
        raise ConfigError(f"--slurm {tasks}: must be >= 1 (array tasks)")
    scheme = storage.split("://", 1)[0].split("+", 1)[0] if "://" in storage else "journal"
    if scheme != "postgresql":
        kind = "a journal file" if scheme == "journal" else f"{scheme}://"
        raise ConfigError(f"--slurm: the storage {redact(storage)} is {kind}; a study across "
                          "nodes needs --storage postgresql://user@host/db (SQLite and journal "
                          "files on a shared filesystem lock or corrupt)")
    if not tracking_uri.startswith(("http://", "https://", "postgresql")):
        raise ConfigError(f"--slurm: the MLflow store {redact(tracking_uri)} is local to this "
                          "machine; give every node the same one: --tracking-uri "
                          "http://host:5000 (an MLflow server) or postgresql://...")
    if shutil.which("sbatch") is None:
        raise ConfigError("--slurm: no `sbatch` on PATH; run this on a Slurm login node "
                          "(or load the Slurm module first)")


def batch_script(job: SlurmJob) -> str:
    """The job array's batch script."""
    q = shlex.quote
    base, extra = divmod(job.n_trials, job.tasks)
    options = [f"--job-name=accel-{job.study}", f"--array=0-{job.tasks - 1}", "--requeue",
               f"--signal=B:USR1@{job.warn_s}", "--open-mode=append",
               f"--output={job.folder / TASK_LOG}", f"--chdir={job.workdir}"]
    for flag, value in (("--time", job.time), ("--partition", job.partition),
                        ("--account", job.account), ("--cpus-per-task", job.cpus)):
        if value is not None:
            options.append(f"{flag}={value}")
    if job.gpus:
        options.append(f"--gres=gpu:{job.gpus}")
    options += job.sbatch
    tune = shlex.join([job.python, "-m", "accel", "tune", *job.tune_args, "--study", job.study])
    helper = shlex.join([job.python, "-m", "accel.tune.slurm", "left", "--study", job.study])
    lines = [
        "#!/bin/bash",
        f"# accel tune --slurm: study {job.study}, {job.n_trials} trial(s) over {job.tasks} "
        "array task(s).",
        "# The Optuna storage and the MLflow store come from the environment sbatch exports",
        "# (ACCEL_STORAGE, MLFLOW_TRACKING_URI): no password in this file.",
        *(f"#SBATCH {shlex.quote(o)}" for o in options),
        "set -u",
        f"# This task's share: {base} trial(s), one more for the first {extra} task(s).",
        f"share=$(( {base} + (SLURM_ARRAY_TASK_ID < {extra} ? 1 : 0) ))",
        f"pids={q(str(job.folder))}/task-$SLURM_ARRAY_TASK_ID.pids",
        "left=$share",
        "if [ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ]; then  # requeued: what earlier attempts left",
        f"  left=$({helper} --share \"$share\" --pids \"$pids\") || exit 1",
        "fi",
        "echo \"accel: array task $SLURM_ARRAY_TASK_ID on $(hostname), attempt "
        "${SLURM_RESTART_COUNT:-0}: $left of $share trial(s)\"",
        "[ \"$left\" -gt 0 ] || exit 0",
        "# Slurm's warning before the time limit (USR1) or a preemption/requeue/cancel (TERM):",
        "# accel gets SIGTERM, a stop (the trial FAIL and queued again, its run KILLED).",
        "warned=0 child=",
        "trap 'warned=1; [ -n \"$child\" ] && kill -TERM \"$child\" 2>/dev/null' USR1",
        "trap '[ -n \"$child\" ] && kill -TERM \"$child\" 2>/dev/null' TERM",
        f"{tune} --n-trials \"$left\" &",
        "child=$!",
        "echo \"$(hostname) $child\" >> \"$pids\"",
        "while :; do  # wait returns early when a trap runs: wait again until accel has ended",
        "  wait \"$child\"; code=$?",
        "  kill -0 \"$child\" 2>/dev/null || break",
        "done",
        "if [ \"$warned\" = 1 ] && [ \"$code\" -ne 0 ]; then  # warned: run again later",
        "  scontrol requeue \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"",
        "fi",
        "exit \"$code\"",
    ]
    return "\n".join(lines) + "\n"


def task_args(args: argparse.Namespace) -> list[str]:
    """The `accel tune` arguments every task repeats: config, overrides, per-task options.
    Not --enqueue or --from-study: the submitting process has queued and copied those."""
    out = list(args.items)
    if args.workers != 1:
        out += ["--workers", str(args.workers)]
    if args.nproc_per_node is not None:
        out += ["--nproc-per-node", str(args.nproc_per_node)]
    if args.timeout is not None:
        out += ["--timeout", str(args.timeout)]
    return out


def cli_submit(args: argparse.Namespace, cfg) -> int:
    """`accel tune ... --slurm N`: set the study up, write and log the script, submit it."""
    storage = args.storage or default_storage()
    tracking_uri = resolve_uri(args.tracking_uri or cfg.tracking.uri)
    check_launch(storage, tracking_uri, args.slurm)
    n_trials = args.n_trials if args.n_trials is not None else cfg.search.n_trials
    if n_trials < 1:
        raise ConfigError(f"--n-trials {n_trials}: --slurm needs at least one trial")
    if args.slurm > n_trials:
        raise ConfigError(f"--slurm {args.slurm}: more array tasks than the {n_trials} "
                          f"trial(s); use --slurm {n_trials} or fewer")
    warn_s = WARN_S if args.slurm_warn is None else args.slurm_warn
    if warn_s < 1:
        raise ConfigError(f"--slurm-warn {warn_s}: must be >= 1 second")
    study = args.study or cfg.name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = Path(args.slurm_dir or Path("mlruns") / "slurm" / f"{study}-{stamp}").absolute()
    for what, path in (("--slurm-dir", folder), ("the working directory", Path.cwd())):
        if any(c.isspace() for c in str(path)):  # an #SBATCH line cannot quote a path
            raise ConfigError(f"{what} {path}: has a space; sbatch's --output and --chdir "
                              "need a path without one")
    job = SlurmJob(study=study, tasks=args.slurm, n_trials=n_trials, tune_args=task_args(args),
                   folder=folder, workdir=Path.cwd(), time=args.slurm_time,
                   partition=args.slurm_partition, account=args.slurm_account,
                   gpus=args.slurm_gpus, cpus=args.slurm_cpus, warn_s=warn_s,
                   sbatch=list(args.sbatch))
    setup = argparse.Namespace(**{**vars(args), "n_trials": 0, "storage": storage,
                                  "tracking_uri": tracking_uri, "study": study})
    code = cli_tune(setup, cfg)  # the study and its parent run, made once, before any task
    if code != 0:
        return code
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "submit.sh"
    script.write_text(batch_script(job))
    print(script.read_text(), end="")
    job_id = _sbatch(script, storage, tracking_uri)
    try:
        _log_script(study, storage, tracking_uri, script, job_id)
    except Exception as e:  # the job is submitted: say so, and keep going
        warn(f"could not log the batch script on the study's parent run: {one_line(e)}")
    progress(f"submitted job array {job_id}: {job.tasks} task(s), {n_trials} trial(s) of study "
             f"{study}; script and task logs in {folder}; watch: squeue -j {job_id}; then: "
             f"accel best --study {study}")
    return 0


def _sbatch(script: Path, storage: str, tracking_uri: str) -> str:
    """Submit; the stores go to the job by environment (sbatch exports it), not by argv."""
    import subprocess

    env = {**os.environ, "ACCEL_STORAGE": storage, "MLFLOW_TRACKING_URI": tracking_uri}
    proc = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch refused {script}: {proc.stderr.strip() or proc.stdout}")
    return proc.stdout.strip().split(";", 1)[0]


def _log_script(study_name: str, storage: str, tracking_uri: str, script: Path,
                job_id: str) -> None:
    """The script as an artifact of the study's parent run (`slurm/`), the job id as a tag."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    run_id = study.user_attrs[record.ATTR_PARENT]
    tracker = tracker_for(tracking_uri)
    retry_locked(tracker.client.log_artifact, run_id, str(script), f"slurm/{job_id}")
    retry_locked(tracker.set_tags, run_id, {"accel.slurm_job": job_id})


# --- in a task: what a requeued task has left --------------------------------------------------


def finished_by(study, processes: set[tuple[str, int]]) -> int:
    """Trials that the `accel tune` processes (host, pid) finished: COMPLETE, PRUNED, or FAIL
    and not queued again (a stopped or dead worker's trial queued again is the retry's)."""
    invocations = {key[len(ATTR_NODE):] for key, lease in study.user_attrs.items()
                   if key.startswith(ATTR_NODE) and isinstance(lease, dict)
                   and (lease.get("host"), lease.get("pid")) in processes}
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return sum(1 for t in trials if t.user_attrs.get(record.ATTR_INVOCATION) in invocations
               and t.state.name in ("COMPLETE", "PRUNED", "FAIL") and t.number not in retried)


def read_pids(path: Path) -> set[tuple[str, int]]:
    """`host pid` lines, one per attempt of the task (a missing file: none yet)."""
    if not path.is_file():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        host, _, pid = line.strip().rpartition(" ")
        if host and pid.isdigit():
            out.add((host, int(pid)))
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m accel.tune.slurm left --study S --share K --pids FILE`: prints K minus what
    the task's earlier attempts finished (at least 0)."""
    p = argparse.ArgumentParser(prog="python -m accel.tune.slurm")
    p.add_argument("what", choices=["left"])
    p.add_argument("--study", required=True)
    p.add_argument("--share", type=int, required=True)
    p.add_argument("--pids", type=Path, required=True)
    args = p.parse_args(argv)
    import optuna

    quiet_libraries(study=True)
    study = optuna.load_study(study_name=args.study, storage=open_storage(default_storage()))
    print(max(0, args.share - finished_by(study, read_pids(args.pids))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
