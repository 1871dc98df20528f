"""`accel` command line. Each command imports its own module (and through it torch, MLflow,
Optuna) inside its `cmd_*` function, so that `--help` and a bad argument answer at once; only
light modules are imported here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from accel import config, console, foreground, signals, usage
from accel.config import DEFAULT_CONFIG, Config
from accel.console import program, quiet_libraries
from accel.errors import ConfigError, NonFiniteLoss, RankFailed, first_line, one_line
from accel.outage import StoreUnavailable
from accel.report import command as report
from accel.uris import DEFAULT_STORAGE, DEFAULT_URI, redact, resolve_uri, with_driver


class Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = usage.readable(self, message)  # what a typo meant; optional is optional
        print(f"accel: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def load_config(items: list[str]) -> Config:
    """`[CONFIG] [KEY=VALUE ...]`: the first item is the config file unless it is an override."""
    path: str | Path | None = None
    if items and "=" not in items[0]:
        path, items = items[0], items[1:]
        if not Path(path).exists() and Path(path).suffix not in (".yaml", ".yml"):
            raise ConfigError(f"'{path}' is neither a config file nor a KEY=VALUE override "
                              "(e.g. train.lr=3e-3)")
    elif DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    return config.load(path, items)


def cmd_train(args: argparse.Namespace) -> int:
    # a named experiment keeps its name on other data
    named = [f"tracking.experiment={args.experiment}"] if args.experiment else []
    cfg = load_config([*args.items, *named, *_nproc(args)])  # checked before torch loads
    from accel.train import launch, result_line, train

    if args.tracking_uri:
        cfg.tracking.uri = args.tracking_uri
    result = train(cfg)
    if not launch.torchrun_follower():  # under torchrun, rank 0 alone reports
        print(result_line(result))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    # --study names the experiment (accel.tune.study): no note of a name derived from the data
    named = [f"tracking.experiment={args.study}"] if args.study else []
    cfg = load_config([*args.items, *named, *_nproc(args)])  # checked before torch loads
    from accel import tune
    from accel.train import launch

    if launch.torchrun():
        raise ConfigError("accel tune starts each trial's ranks itself: run it without torchrun,"
                          " with --nproc-per-node N")
    if args.slurm is not None:
        from accel.tune import slurm

        return slurm.cli_submit(args, cfg)
    from accel.report.write import after_study

    return tune.cli_tune(args, cfg, page=after_study)


def _nproc(args: argparse.Namespace) -> list[str]:
    n = args.nproc_per_node
    return [f"train.nproc_per_node={n}"] if n is not None else []


def _nproc_arg(p: Parser) -> None:
    p.add_argument("--nproc-per-node", type=int, metavar="N", help="processes training each "
                   "run together, data parallel (train.nproc_per_node; one GPU each on CUDA)")


def cmd_best(args: argparse.Namespace) -> int:
    from accel import tune

    return tune.cli_best(args)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from accel import reproduce

    return reproduce.cli_reproduce(args)


def cmd_resume(args: argparse.Namespace) -> int:
    from accel import resume

    return resume.cli_resume(args)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from accel import evaluate

    items = list(args.items)
    args.config = items.pop(0) if items and "=" not in items[0] else None
    return evaluate.cli_evaluate(args, items)


def cmd_verify(args: argparse.Namespace) -> int:
    from accel import verify

    return verify.cli_verify(args)


def cmd_report(args: argparse.Namespace) -> int:
    from accel.report import cli_report

    return cli_report(args)


def cmd_ablate(args: argparse.Namespace) -> int:
    """One experiment file, or several (the paper's grid: one parent, one summary); the
    overrides apply to every file."""
    files = [item for item in args.items if "=" not in item]
    overrides = [item for item in args.items if "=" in item]
    cfgs = [load_config([f, *overrides]) for f in files] or [load_config(overrides)]
    from accel import ablation  # after the configs are checked: torch loads here
    from accel.report.write import after_ablation

    if len(cfgs) > 1:
        return ablation.cli_grid(args, cfgs, page=after_ablation)
    return ablation.cli_ablate(args, cfgs[0], page=after_ablation)


def cmd_ui(args: argparse.Namespace) -> int:
    from accel.tracking import Tracker
    from accel.tracking.store import ui_pages

    tracker = Tracker(args.tracking_uri)  # creates the local store if it is missing
    # The store goes by environment, not argv: a URL's password never shows in `ps`.
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": with_driver(tracker.uri)}
    # MLflow's job runner (a huey runner and its consumer processes) serves GenAI features accel
    # does not use: off, unless asked for.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    # One worker: MLflow's default of 4 uvicorn processes is a server's, not a laptop's.
    cmd = [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(args.port),
           "--workers", str(args.workers)]
    if tracker.artifact_root:
        cmd += ["--default-artifact-root", tracker.artifact_root]
    base = f"http://127.0.0.1:{args.port}"
    first, pages = ui_pages(tracker, base)
    print(f"MLflow UI on {base} (Ctrl-C stops it)", file=sys.stderr)
    # Only a link with workflowType=machine_learning leaves MLflow 3's GenAI view; the browser
    # then keeps that view.
    print(f"open first: {first}", file=sys.stderr)
    for name, page in pages:
        print(f"  {name}: {page}", file=sys.stderr)
    if not args.no_browser:
        console.open_when_serving(base, first)
    return foreground.run_group(cmd, env)  # any stop of accel stops the whole server


def cmd_dashboard(args: argparse.Namespace) -> int:
    """optuna-dashboard (the `dashboard` extra) on the study storage, bound to 127.0.0.1."""
    import importlib.util
    import subprocess

    from accel.tune.storage import default_storage, is_journal

    if importlib.util.find_spec("optuna_dashboard") is None:
        raise ConfigError("optuna-dashboard is not installed: pip install -e '.[dashboard]'")
    storage = args.storage or default_storage()
    if is_journal(storage) and not Path(storage).is_file():
        raise ConfigError(f"no Optuna storage at {storage}: run `accel tune` first, or pass "
                          "--storage")
    print(f"optuna-dashboard on http://127.0.0.1:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    # The storage goes by environment, not argv: a URL's password never shows in `ps`.
    code = ("import os, optuna_dashboard, optuna.storages.journal as j;"
            "s = os.environ['ACCEL_DASHBOARD_STORAGE'];"
            "s = s if '://' in s else j.JournalStorage(j.JournalFileBackend(s));"
            f"optuna_dashboard.run_server(s, host='127.0.0.1', port={int(args.port)})")
    env = {**os.environ, "ACCEL_DASHBOARD_STORAGE": with_driver(storage)}
    return subprocess.call([sys.executable, "-c", code], env=env)


def _config_args(p: Parser) -> None:
    p.add_argument("items", nargs="*", metavar="[CONFIG] [KEY=VALUE]",
                   help=f"experiment YAML (default {DEFAULT_CONFIG}) then dotted overrides, "
                   "e.g. train.lr=3e-3 model.name=resnet18")


def _tracking_arg(p: Parser) -> None:
    p.add_argument("--tracking-uri", metavar="URI",
                   help=f"MLflow store (default $MLFLOW_TRACKING_URI or {DEFAULT_URI})")


def _storage_arg(p: Parser) -> None:
    p.add_argument("--storage", metavar="URL",
                   help=f"Optuna storage: a journal file path or an RDB URL "
                   f"(default $ACCEL_STORAGE or {DEFAULT_STORAGE})")


def build_parser() -> tuple[Parser, dict[str, Parser]]:
    """The `accel` parser and one parser per command (options may come anywhere: see parse)."""
    parser = Parser(prog="accel", description=__doc__.split(".")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    commands: dict[str, Parser] = {}

    def command(name: str, help: str, func, *common) -> Parser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        for add in common:
            add(p)
        commands[name] = p
        return p

    _training_commands(command)
    _run_commands(command)
    return parser, commands


def _training_commands(command) -> None:
    """train, tune, best, ablate: the commands that train."""
    p = command("train", "train one model and log the run to MLflow", cmd_train,
                _config_args, _tracking_arg, _nproc_arg)
    p.add_argument("--experiment", metavar="NAME", help="MLflow experiment (default: config name)")

    p = command("tune", "run an Optuna study; every trial is one tracked training run", cmd_tune,
                _config_args, _storage_arg, _tracking_arg, _nproc_arg)
    p.add_argument("--study", metavar="NAME", help="study name (default: config name)")
    p.add_argument("--n-trials", type=int, metavar="N", help="trials for this invocation")
    p.add_argument("--timeout", type=float, metavar="S", help="stop starting trials after S s")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes")
    p.add_argument("--enqueue", nargs="+", default=[], metavar="RUN_ID",
                   help="queue the searched values of these logged runs as the next trials")
    p.add_argument("--from-study", metavar="OTHER", help="copy the finished trials of study "
                   "OTHER (same objectives, values inside this space) as prior knowledge")
    p.add_argument("--from-storage", metavar="URL",
                   help="where --from-study lives (default: this study's storage)")
    _slurm_args(p)

    p = command("best", "print a study's best trial, its MLflow run and how to reproduce it",
                cmd_best, _storage_arg, _tracking_arg)
    p.add_argument("--study", required=True, metavar="NAME")
    p.add_argument("--register", metavar="NAME", help="log the best trial's weights as an "
                   "MLflow model and register it as a new version of NAME")
    p.add_argument("--alias", default="champion", metavar="ALIAS",
                   help="alias moved to that version (default champion)")
    p.add_argument("--verified", action="store_true", help="name (and with --register, "
                   "register) the trial `accel verify` found best over seeds")
    p.add_argument("--pick", metavar="METRIC", help="a multi-objective study: the Pareto "
                   "front's best trial on METRIC (default: the whole front)")
    p.add_argument("--brief", action="store_true", help="three lines: the study's trials and "
                   "best value, how to browse it, how to reproduce the best trial")
    p.add_argument("--force", action="store_true", help="with --register: register a best "
                   "trial whose accuracy is within noise of chance (refused otherwise)")

    p = command("verify", "rerun a study's top trials and its baseline over fresh seeds: "
                "intervals, the probability of staying best", cmd_verify, _storage_arg,
                _tracking_arg)
    p.add_argument("--study", required=True, metavar="NAME")
    p.add_argument("--top", type=int, default=3, metavar="K", help="best trials to rerun "
                   "(the baseline trial is added when not among them; default 3)")
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="fresh seeds, the same "
                   "for every trial (default 5)")
    p.add_argument("--workers", type=int, default=1, metavar="W", help="worker processes")

    p = command("ablate", "time every on/off combination of GA, AMP, pinned memory, resident "
                "data, channels_last, compile or data parallel on every GPU; several config "
                "files: one ablation each under one parent, with a summary across them",
                cmd_ablate, _config_args, _tracking_arg)
    p.add_argument("--techniques", default="ga,amp,pm", metavar="LIST",
                   help="comma list from ga, amp, pm, resident, channels_last, compile, ddp "
                   "(default ga,amp,pm)")
    p.add_argument("--repeats", type=int, default=3, metavar="R",
                   help="runs of every combination, paired by repeat (default 3)")


def _slurm_args(p: Parser) -> None:
    """`accel tune --slurm N`: accel/tune/slurm.py submits the job array."""
    g = p.add_argument_group("Slurm (workers as a job array; PostgreSQL storage only)")
    g.add_argument("--slurm", type=int, metavar="N", help="submit N workers as one Slurm job "
                   "array, each `accel tune` on its share of --n-trials, instead of running here")
    g.add_argument("--slurm-time", metavar="T", help="each task's time limit (sbatch --time)")
    g.add_argument("--slurm-partition", metavar="P", help="sbatch --partition")
    g.add_argument("--slurm-account", metavar="A", help="sbatch --account")
    g.add_argument("--slurm-gpus", type=int, metavar="G", help="GPUs per task (--gres=gpu:G)")
    g.add_argument("--slurm-cpus", type=int, metavar="C", help="CPUs per task "
                   "(--cpus-per-task)")
    g.add_argument("--slurm-warn", type=int, metavar="S", help="stop the trial and requeue the "
                   "task S s before its time limit (default 300)")
    g.add_argument("--slurm-dir", metavar="DIR", help="the batch script, task logs and pid "
                   "files, on a filesystem every node sees (default mlruns/slurm/STUDY-TIME)")
    g.add_argument("--sbatch", action="append", default=[], metavar="ARG", help="an extra "
                   "sbatch argument, repeatable: --sbatch=--qos=high")


def _run_commands(command) -> None:
    """reproduce, resume, evaluate, report, ui, dashboard: the commands about what was logged."""
    p = command("reproduce", "rerun a logged run from MLflow and compare the numbers",
                cmd_reproduce, _tracking_arg)
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--seeds", type=int, default=1, metavar="K", help="logged seed + K-1 more")
    p.add_argument("--tolerance", type=float, default=0.005, metavar="T",
                   help="allowed absolute difference on the search metric")

    p = command("resume", "carry an interrupted run on from its last-epoch checkpoint, in the "
                "same MLflow run", cmd_resume, _tracking_arg)
    p.add_argument("run_id", metavar="RUN_ID")

    p = command("evaluate", "evaluate a logged or registered model on a test split and log "
                "the evaluation as a run", cmd_evaluate, _tracking_arg)
    p.add_argument("model_uri", metavar="MODEL_URI",
                   help="models:/NAME@ALIAS, models:/NAME/VERSION or runs:/RUN_ID/model")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [KEY=VALUE]",
                   help="the data (default: the config of the run that logged the model)")
    p.add_argument("--split", choices=("test", "val", "train"),
                   help="the split to score (default: test; an image folder without test/ "
                   "gives val/, else all of train/, else its class folders)")

    report.arguments(command("report", report.HELP, cmd_report, _storage_arg, _tracking_arg))

    p = command("ui", "open the MLflow UI on the project's store (bound to 127.0.0.1)", cmd_ui,
                _tracking_arg)
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--workers", type=int, default=1, metavar="W",
                   help="server processes (default 1; MLflow's own default is 4)")
    p.add_argument("--no-browser", action="store_true",
                   help="do not open a browser (by default one opens at the model-training view "
                   "where a display is available)")

    p = command("dashboard", "open optuna-dashboard on a study's storage (bound to 127.0.0.1)",
                cmd_dashboard, _storage_arg)
    p.add_argument("--port", type=int, default=8080)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Options before, between or after the config and the overrides: each command parses its
    arguments intermixed (`accel tune --study x FILE k=v` == `accel tune FILE k=v --study x`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, commands = build_parser()
    if argv and argv[0] in commands:
        args = commands[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    return parser.parse_args(argv)  # argparse answers --help, no command or an unknown one


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    # The command as typed, passwords hidden: what a stopped `accel tune` prints to carry on.
    args.command_line = [program(), *(redact(a) for a in argv)]
    # accel opens its own runs by id; a run id inherited from a parent process (an `mlflow run`
    # project, a notebook) must not redirect anything into that run.
    os.environ.pop("MLFLOW_RUN_ID", None)
    # With a tracking server, MLflow prints two "View run at" lines per finished run to stdout,
    # where accel's results go; accel names its runs itself.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # A checkpoint downloaded on resume is one file: no progress bar on stderr for it.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    quiet_libraries()
    previous = signals.handle_stops()  # Ctrl-C and SIGTERM end the running work KILLED
    try:
        return args.func(args) or 0
    except ConfigError as e:
        print(f"accel: error: {first_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        left = signals.left_behind()
        print(f"accel: stopped by {signals.stopped_by()}" + (f"; {left}" if left else ""),
              file=sys.stderr)
        return signals.exit_code()
    except (NonFiniteLoss, RankFailed, StoreUnavailable) as e:
        print(f"accel: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, say, or an artifact folder that cannot be written
        print(f"accel: error: {one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a tracking server's login that refuses what was asked is bad input
        from accel.tracking.client import store_refusal

        refusal = store_refusal(e, resolve_uri(getattr(args, "tracking_uri", None)))
        if refusal is None:
            raise
        print(f"accel: error: {refusal}", file=sys.stderr)
        return 2
    finally:
        signals.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
