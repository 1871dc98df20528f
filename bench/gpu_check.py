"""A prepared GPU check: what a lent GPU machine should run, as one command and one report.

A GPU is lent to some tasks only, for minutes, with no network there, and its python3 (3.12, with
torch, timm, scikit-learn, pytest) lacks MLflow, Optuna and Ignite. So the check is prepared here
and only run there:

    make gpu-wheels                      # here: fills .gpu/ (git-ignored), checks the 64 MiB
    make gpu-check OUT=$OUT              # there: python3 bench/gpu_check.py $OUT
    .venv/bin/python bench/gpu_check.py --dry-run /tmp/gpu-check     # here: a rehearsal on CPU

`.gpu/` holds the wheels the machine lacks (`CARRIED`, pinned to the versions in .venv) and a copy
of the CIFAR-10 JPEG tarball; with the working tree it must stay within the 64 MiB that travels.
The device call names `.gpu` in `carry` and allows about 9 minutes (the check ends within 8).
There, the script refuses at once without CUDA; else it installs the wheels into a scratch folder,
extracts CIFAR-10 there and keeps MLflow in a throwaway SQLite store (never the repo's), then runs,
each step with its own timeout and all within `BUDGET_S` (8 minutes):

1. gpu_tests  the `gpu`-marked tests;
2. ablate     GA / AMP / PM / resident data on ResNet50, a CIFAR-10 subset, 3 epochs;
3. fast       experiments/cifar10_fast.yaml to 94% val accuracy (time_to_target_s);
4. ddp        where the machine has two or more GPUs: `accel ablate --techniques ddp,amp`, the
              same runs on one GPU and data parallel on all (`train.nproc_per_node`); with one
              GPU (or a dry run) a "skipped" row says why.

It writes OUT/gpu_check.md (date, device, versions, a row per step, the ablation's own table, the
fast recipe's numbers) and OUT/<step>.log, and exits 1 if any step failed or timed out.
`--dry-run` runs the same steps on this CPU with the current interpreter, no wheels and no CUDA:
the gpu tests are only collected, and the runs train accel_cnn_s on digits for 2 epochs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_DIR = ROOT / ".gpu"  # git-ignored; carried to the machine (`carry: [".gpu"]`)
WHEELS = GPU_DIR / "wheels"
TARBALL = GPU_DIR / "cifar10-jpeg.tar.gz"
TRAVEL_LIMIT = 64 * 2**20  # bytes: the working tree plus carried folders, per device call
PYTHON = "3.12"  # the GPU machine's python3
# pip matches platform tags exactly: every manylinux the machine's glibc (2.39) can load.
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64",
             "manylinux1_x86_64")

# What the machine's python3 lacks for `accel train`, `accel ablate` and the tests: the
# Requires-Dist closure of these, minus the packages /work/.library/device/KINDS.md lists there.
# mlflow-skinny and mlflow-tracing hold all of `mlflow`'s Python code; the full `mlflow` wheel
# adds the UI's JavaScript and server dependencies. The SQLite store needs sqlalchemy + alembic,
# and its model-registry tables import cryptography (a dependency of the full wheel only).
# mlflow imports pydantic, fastapi, opentelemetry and databricks (a find_spec) on the training
# path. Left behind: plotly (`accel tune`'s study plots) and psycopg2-binary (PostgreSQL).
CARRIED = (
    # the MLflow client and its SQLite store
    "mlflow-skinny", "mlflow-tracing", "sqlalchemy", "alembic", "mako", "sqlparse",
    "cryptography", "cffi", "pycparser", "cachetools", "gitpython", "gitdb", "smmap",
    "python-dotenv", "importlib-metadata", "databricks-sdk", "google-auth", "pyasn1",
    "pyasn1-modules", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core",
    "annotated-types", "typing-inspection", "opentelemetry-api", "opentelemetry-sdk",
    "opentelemetry-proto", "opentelemetry-semantic-conventions",
    # the training loop and the tuner (the tests import both)
    "pytorch-ignite", "optuna", "optuna-integration", "colorlog",
)

STEP_NAMES = ("gpu_tests", "ablate", "fast", "ddp")
BUDGET_S = 470  # the whole check on the GPU machine, setup included: it ends within 8 minutes
# seconds: gpu_tests, ablate, fast, ddp (setup takes about 30); ddp runs only on several GPUs,
# in what the others left of the budget
TIMEOUTS = (60, 230, 150, 100)
DRY_BUDGET_S, DRY_TIMEOUTS = 240, (60, 90, 60, 60)
GRACE_S = 10  # SIGTERM, then this long before SIGKILL: accel marks its MLflow run KILLED
# CIFAR-10 training images per ablation run: 12 runs (16 combinations, pm+resident n/a) x 3
# epochs, ResNet50 at 32 px; with GA its micro-batches of 32 are launch-bound on any GPU.
TRAIN_LIMIT = 5_000
TARGET = 0.94  # the fast recipe's val_accuracy target
DRY_TARGET = 0.5  # digits in 2 epochs: reached, so time_to_target_s is a real number
# The GPU run in the recipe's own header (experiments/cifar10_fast.yaml).
FAST_GPU = ("model.name=accel_cnn_m", "train.device=cuda", "train.epochs=16")
TECHNIQUES = "ga,amp,pm,resident"
ABLATE_CONFIG = "experiments/paper/cifar10_resnet50.yaml"
FAST_CONFIG = "experiments/cifar10_fast.yaml"
# 32 images a batch (4 x 8 with ga): enough updates in 2 epochs to learn digits. fp32: the fast
# recipe's bf16, at its lr 0.2 with 32 images a batch, diverges on 8 px digits (the GPU step
# trains CIFAR-10 at 256 a batch)
DRY_OVERRIDES = ("data.dataset=digits", "model.name=accel_cnn_s", "train.epochs=2",
                 "train.device=cpu", "data.num_workers=0", "train.batch_size=32", "train.amp=off")
READ_METRICS = ("import json, sys\nfrom mlflow.tracking import MlflowClient\n"
                "print(json.dumps(MlflowClient().get_run(sys.argv[1]).data.metrics))")


def norm(name: str) -> str:
    """A distribution's canonical name (PEP 503): 'Mako', 'pydantic_core' -> 'mako', ..."""
    return re.sub(r"[-_.]+", "-", name).lower()


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


# --- here: make gpu-wheels ------------------------------------------------------------------


def prepare() -> int:
    """Fill .gpu/ with one pinned wheel per CARRIED name and the tarball, within TRAVEL_LIMIT."""
    from importlib import metadata

    from accel.shared_data import SHA256, sha256
    from accel.shared_data import TARBALL as SHARED

    try:
        pins = [f"{name}=={metadata.version(name)}" for name in CARRIED]
    except metadata.PackageNotFoundError as e:
        return fail(f"{e.name} is not installed in this interpreter: run with .venv/bin/python")
    fresh = GPU_DIR / "wheels.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--python-version", PYTHON, "--implementation",
           "cp", *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(fresh), *pins]
    if subprocess.run(cmd).returncode != 0:
        return fail("pip download failed (its message is above)")
    problem = wheel_problem(fresh)
    if problem:
        return fail(problem)
    shutil.rmtree(WHEELS, ignore_errors=True)
    fresh.rename(WHEELS)  # never a mix of old and new versions: two of one name stop the install
    if not TARBALL.exists() or sha256(TARBALL) != SHA256:
        if sha256(SHARED) != SHA256:
            return fail(f"{SHARED}: sha256 differs from {SHA256}")
        shutil.copyfile(SHARED, TARBALL)
    wheels = sum(p.stat().st_size for p in WHEELS.glob("*.whl"))
    print(f"{len(CARRIED)} wheels: {mib(wheels)}; {TARBALL.name}: {mib(TARBALL.stat().st_size)}")
    tree, carried = travel_bytes()
    print(f"travels: working tree {mib(tree)} + .gpu {mib(carried)} = {mib(tree + carried)} "
          f"of {mib(TRAVEL_LIMIT)}")
    if tree + carried > TRAVEL_LIMIT:
        return fail(f"working tree + .gpu = {mib(tree + carried)}, over {mib(TRAVEL_LIMIT)}")
    return 0


def wheel_problem(folder: Path) -> str | None:
    """None when `folder` holds exactly one wheel for each CARRIED name, else what is wrong."""
    found = [norm(p.name.split("-")[0]) for p in folder.glob("*.whl")]
    missing = sorted(set(map(norm, CARRIED)) - set(found))
    extra = sorted(set(found) - set(map(norm, CARRIED)))
    twice = sorted({n for n in found if found.count(n) > 1})
    if missing or extra or twice:
        return (f"{folder}: wheels missing {missing or '-'}, unexpected {extra or '-'}, "
                f"more than one version of {twice or '-'} (run `make gpu-wheels`)")
    return None


def travel_bytes() -> tuple[int, int]:
    """(the working tree that travels: tracked + untracked-not-ignored files, .gpu's files)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tree = sum(p.lstat().st_size for p in (ROOT / f for f in set(listed.split("\0")) if f)
               if p.is_file() or p.is_symlink())
    carried = sum(p.stat().st_size for p in GPU_DIR.rglob("*") if p.is_file())
    return tree, carried


def fail(message: str) -> int:
    print(f"gpu_check: {message}", file=sys.stderr)
    return 1


# --- there: the steps -----------------------------------------------------------------------


@dataclass
class Summary:
    ok: bool
    numbers: str  # the key numbers, one table cell
    section: str = ""  # markdown for the report's own part on this step


@dataclass
class Step:
    name: str  # also its log's name: letters, digits, '_'
    argv: list[str]
    timeout: float
    summarize: Callable[[str, dict], Summary]  # (its log, the env) -> what it showed
    skip: str = ""  # why this machine does not run it (a "skipped" row), or "" to run it


@dataclass
class Row:
    step: str
    command: str
    status: str  # "ok", "FAILED" or "skipped"
    seconds: float
    numbers: str
    tail: list[str] = field(default_factory=list)  # a failed step's last output lines
    section: str = ""


def steps(py: str, dry: bool, data_root: Path, train_limit: int,
          fast_config: str, gpus: int = 1) -> list[Step]:
    """The four steps: full size on the GPU, tiny on CPU for a dry run; ddp with `gpus` >= 2."""
    if dry:
        tests = [py, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                 "tests"]
        ablate_data = [*DRY_OVERRIDES, "data.train_limit=512"]
        fast_data, target, timeouts = [*DRY_OVERRIDES], DRY_TARGET, DRY_TIMEOUTS
    else:
        tests = [py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "tests"]
        ablate_data = ["data.dataset=imagefolder", f"data.root={data_root}",
                       "data.val_fraction=0.1", f"data.train_limit={train_limit}",
                       "train.epochs=3"]
        fast_data = [f"data.root={data_root}", *FAST_GPU]
        target, timeouts = TARGET, TIMEOUTS
    ablate = [py, "-m", "accel", "ablate", ABLATE_CONFIG, "--techniques", techniques(dry),
              *ablate_data, "--repeats", "1"]
    fast = [py, "-m", "accel", "train", fast_config, *fast_data,
            f"train.target={{metric: val_accuracy, value: {target}}}", "train.stop_at_target=true"]
    ddp = [py, "-m", "accel", "ablate", ABLATE_CONFIG, "--techniques", "ddp,amp", *ablate_data,
           "--repeats", "1"]
    one = "a dry run on CPU" if dry else "this machine has one GPU"
    return [Step("gpu_tests", tests, timeouts[0], lambda text, env: summarize_tests(text, dry)),
            Step("ablate", ablate, timeouts[1], lambda text, env: summarize_ablation(text)),
            Step("fast", fast, timeouts[2], lambda text, env: summarize_fast(text, env, target)),
            Step("ddp", ddp, timeouts[3], lambda text, env: summarize_ablation(text),
                 skip="" if gpus >= 2 else f"skipped: {one}; ddp needs two or more GPUs")]


def techniques(dry: bool) -> str:
    """TECHNIQUES; a dry run leaves out any this checkout's `accel ablate` does not know yet."""
    if not dry:
        return TECHNIQUES
    from accel.ablation.plan import TECHNIQUES as KNOWN

    return ",".join(t for t in TECHNIQUES.split(",") if t in KNOWN)


def run_step(step: Step, env: dict, out: Path, deadline: float) -> Row:
    """Run one step into OUT/<name>.log; a failure or a timeout is a FAILED row, never a skip."""
    command = shown(step.argv, env)
    timeout = min(step.timeout, deadline - time.monotonic() - GRACE_S)
    log = out / f"{step.name}.log"
    if step.skip:
        log.write_text(f"{step.skip}\n")
        return Row(step.name, command, "skipped", 0.0, step.skip)
    if timeout < 5:
        log.write_text("not started: the check's time budget was spent\n")
        return Row(step.name, command, "FAILED", 0.0, "not started: no time left")
    started = time.monotonic()
    with log.open("w") as f:
        f.write(f"$ {command}\n")
        f.flush()
        proc = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: a timeout ends it all
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
            stop(proc)
            f.write(f"\n[gpu_check: timed out after {timeout:.0f} s; its process group ended]\n")
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    if code is None:
        summary = Summary(False, f"timed out after {timeout:.0f} s")
    else:
        try:
            summary = step.summarize(text, env)
        except Exception as e:  # an output the parser does not know is a failed check too
            summary = Summary(False, f"could not read its output: {e!r}")
        if code != 0:
            summary.ok, summary.numbers = False, f"exit {code}; {summary.numbers}"
    status = "ok" if summary.ok else "FAILED"
    tail = [] if summary.ok else text.rstrip().splitlines()[-15:]
    return Row(step.name, command, status, seconds, summary.numbers, tail, summary.section)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the step's process group (accel ends its run KILLED), SIGKILL what outlives it."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def shown(argv: list[str], env: dict) -> str:
    """The command as a reader would type it: python3, and $WORK for the scratch folder."""
    text = shlex.join(["python3" if argv[0] == sys.executable else argv[0], *argv[1:]])
    return text.replace(env["ACCEL_WORK"], "$WORK")


# --- what each step showed --------------------------------------------------------------------


COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def summarize_tests(text: str, dry: bool) -> Summary:
    """pytest's last summary line; on the GPU at least one gpu test must pass, none fail."""
    lines = [ln for ln in text.splitlines()
             if re.search(r" in [\d.]+s", ln) and (COUNTS.search(ln) or "collected" in ln)]
    if not lines:
        return Summary(False, "no pytest summary line")
    last = lines[-1].strip("= ")
    if dry:
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", last)
        n = int(collected.group(1)) if collected else 0
        return Summary(n > 0, f"{n} gpu test(s) collected (not run: no GPU)")
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
              for n, kind in COUNTS.findall(last)}
    ok = counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error")
    return Summary(ok, ", ".join(f"{n} {kind}" for kind, n in counts.items()))


def summarize_ablation(text: str) -> Summary:
    """`accel ablate`'s table (stdout) and its closing line: every run must succeed."""
    lines = text.splitlines()
    closing = [ln for ln in lines if ln.startswith("MLflow: parent run ")]
    heads = [i for i, ln in enumerate(lines) if ln.startswith("| combination |")]
    if not closing or not heads:
        return Summary(False, "no ablation table in the output")
    start = heads[-1]
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    # stdout: header, blank, table, blank, footer; the header went to stderr once before too
    first = max((i for i in range(start) if lines[i].startswith("ablation of ")), default=start)
    footer = [ln for ln in lines[end:end + 3] if ln.strip() and not ln.startswith("MLflow:")]
    section = "\n".join([*lines[first:end], "", *footer, closing[-1]])
    failed = int(re.search(r"(\d+) failed", closing[-1]).group(1))
    runs = int(re.search(r"(\d+) runs", closing[-1]).group(1))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = [dict(zip(names, (c.strip() for c in ln.strip("|").split("|")), strict=False))
            for ln in lines[start + 2:end]]
    base = rows[0]  # the all-off baseline comes first
    try:
        best = max(rows[1:] or rows, key=lambda r: speedup(r["speed-up (min–max)"]))
        numbers = (f"{runs} runs, {failed} failed; baseline "
                   f"{base['steady s/epoch (min–max)'].split()[0]} s/epoch, val acc "
                   f"{base['val acc']}; best other {best['combination']} "
                   f"{best['speed-up (min–max)'].split()[0]}")
    except KeyError as e:  # the table's columns were renamed: the table below still says it all
        numbers = f"{runs} runs, {failed} failed (no column {e} in the table)"
    return Summary(failed == 0 and base.get("status") == "ok", numbers, section)


def speedup(cell: str) -> float:
    """'1.84x (1.80–1.90)' -> 1.84; anything else (failed, n/a) sorts last."""
    found = re.match(r"([\d.]+)x", cell)
    return float(found.group(1)) if found else -1.0


RUN_LINE = re.compile(r"^run (\w+): (\d+) epochs in ([\d.]+)s\s+(.*)$", re.M)


def summarize_fast(text: str, env: dict, target: float) -> Summary:
    """`accel train`'s closing line, plus time_to_target_s / epochs_to_target from the store."""
    found = RUN_LINE.findall(text)
    if not found:
        return Summary(False, "no `run ...: N epochs` line in the output")
    run_id, epochs, wall, rest = found[-1]
    last = dict(kv.split("=", 1) for kv in rest.split())
    read = subprocess.run([env["ACCEL_PYTHON"], "-c", READ_METRICS, run_id], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if read.returncode != 0:
        return Summary(False, f"could not read run {run_id}: {read.stderr.strip()[-200:]}")
    metrics = json.loads(read.stdout)
    shown_keys = ("val_accuracy", "test_accuracy", "train_throughput", "peak_memory_mb")
    numbers = {k: float(last[k]) for k in shown_keys if k in last}
    reached = "time_to_target_s" in metrics
    if reached:
        numbers = {"time_to_target_s": metrics["time_to_target_s"],
                   "epochs_to_target": metrics["epochs_to_target"], **numbers}
    cells = ", ".join(f"{k} {v:.4g}" for k, v in numbers.items())
    verdict = "" if reached else f"target val_accuracy >= {target} NOT reached; "
    section = "\n".join([f"- run {run_id}: {epochs} epochs in {wall} s (wall, data and model "
                         f"build included); target val_accuracy >= {target}: "
                         f"{'reached' if reached else 'NOT reached'}",
                         *(f"- {k}: {v:.4g}" for k, v in numbers.items())])
    # A missed target is a result, not a broken GPU path: the row says so and stays ok.
    return Summary(True, verdict + cells, section)


# --- there: setup, report, main ---------------------------------------------------------------


def child_env(work: Path, dry: bool) -> dict:
    """The steps' environment: the installed wheels and the repo on PYTHONPATH, CIFAR-10 and the
    MLflow store in the scratch folder, nothing written into the repo."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    paths = ([] if dry else [str(work / "site")]) + [str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), ACCEL_CACHE=str(work / "cache"),
               MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg", ACCEL_WORK=str(work),
               ACCEL_PYTHON=sys.executable, MLFLOW_DISABLE_TELEMETRY="true")  # no network there
    if dry:  # docs/results.md: loaded 2-core machine, 1 OpenMP thread beats 2 spinning
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def setup(work: Path, dry: bool, out: Path, env: dict) -> Row:
    """The plan (wheels, size); on the GPU also: install the wheels, extract CIFAR-10."""
    started = time.monotonic()
    log = [f"wheels planned ({len(CARRIED)}): {', '.join(CARRIED)}"]
    notes = [f"{len(CARRIED)} wheels planned"]
    ok = plan_ok(dry, notes) and bool(CARRIED)
    if not dry:
        ok = install(work, env, log, notes) and ok
        ok = extract(work, log, notes) and ok
    log += notes
    (out / "setup.log").write_text("\n".join(log) + "\n")
    command = ("check .gpu/ and the size that travels" if dry else
               "install .gpu/wheels into $WORK/site; extract CIFAR-10 into $WORK/cache")
    return Row("setup", command, "ok" if ok else "FAILED", time.monotonic() - started,
               "; ".join(notes), [] if ok else log[-15:])


def plan_ok(dry: bool, notes: list[str]) -> bool:
    """.gpu/wheels holds one wheel per CARRIED name (needed on the GPU; checked here where it
    exists), and here: the working tree plus .gpu fit in what travels."""
    if not WHEELS.is_dir():
        notes.append(f"no {WHEELS.relative_to(ROOT)}/ (run make gpu-wheels)")
        return dry
    problem = wheel_problem(WHEELS)
    if problem:
        notes.append(problem)
        return False
    if not dry:
        return True
    tree, carried = travel_bytes()
    notes.append(f"travels {mib(tree + carried)} of {mib(TRAVEL_LIMIT)} (.gpu {mib(carried)})")
    return tree + carried <= TRAVEL_LIMIT


def install(work: Path, env: dict, log: list[str], notes: list[str]) -> bool:
    """pip install --target $WORK/site (no network, no deps), then `pip check` for the carried."""
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target",
           str(work / "site"), *wheels]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    log += [f"$ pip install ... ({len(wheels)} wheels): exit {done.returncode}", done.stdout,
            done.stderr]
    if done.returncode != 0:
        notes.append(f"pip install failed: {done.stderr.strip().splitlines()[-1:]}")
        return False
    check = subprocess.run([sys.executable, "-m", "pip", "check"], env=env, capture_output=True,
                           text=True, timeout=120)
    carried = set(map(norm, CARRIED))
    unmet = [ln for ln in check.stdout.splitlines() if ln and norm(ln.split()[0]) in carried]
    log += ["$ pip check", check.stdout]
    notes.append(f"{len(wheels)} wheels installed; pip check: "
                 + (f"{len(unmet)} unmet needs of carried wheels: {'; '.join(unmet[:2])[:160]}"
                    if unmet else "the carried wheels' needs are met"))
    return True


def extract(work: Path, log: list[str], notes: list[str]) -> bool:
    from accel.shared_data import cifar10_jpeg

    try:
        root = cifar10_jpeg(TARBALL, work / "cache")
    except (OSError, ValueError) as e:
        notes.append(f"CIFAR-10 not extracted: {e}")
        return False
    n = sum(1 for _ in root.glob("*/*/*.jpg"))
    log.append(f"extracted {n} images into {root}")
    notes.append(f"CIFAR-10: {n} images")
    return True


def cuda_problem() -> str | None:
    """Why this machine cannot run the real check, or None."""
    try:
        import torch
    except ImportError as e:
        return f"CUDA is not available: torch does not import ({e})"
    if not torch.cuda.is_available():
        return ("CUDA is not available (torch.cuda.is_available() is False): this check needs "
                "a GPU; --dry-run rehearses it on a CPU")
    return None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def machine(dry: bool) -> list[str]:
    """Date, device, versions, commit: the report's provenance lines."""
    import torch

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"- date: {now}; host python {platform.python_version()}, torch {torch.__version__}"]
    if dry:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                    .splitlines() if ln.startswith("model name")), platform.processor())
        lines += [f"- device: cpu ({cpu}, {os.cpu_count()} cores)",
                  "- **dry run on CPU** (`--dry-run`): no wheels, no CUDA; digits and "
                  "accel_cnn_s for 2 epochs, the gpu tests only collected. No number here is a "
                  "GPU result."]
    else:
        props = torch.cuda.get_device_properties(0)
        lines.append(f"- device: {torch.cuda.get_device_name(0)}, {props.total_memory / 2**30:.0f}"
                     f" GiB, {props.multi_processor_count} SMs; CUDA {torch.version.cuda}, "
                     f"cuDNN {torch.backends.cudnn.version()}")
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on the machine
        commit = ""
    lines.append(f"- commit: {commit or 'unknown (no git or no .git here)'}")
    return lines


def report(out: Path, rows: list[Row], provenance: list[str], wall: float) -> Path:
    """OUT/gpu_check.md: provenance, the steps' table, failures' last lines, each step's part."""
    cell = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["# GPU check", "", *provenance, f"- wall time: {wall:.0f} s", "",
             "| step | command | status | seconds | key numbers |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r.step} | `{cell(r.command)}` | {r.status} | {r.seconds:.1f} | "
              f"{cell(r.numbers)} |" for r in rows]
    for r in rows:
        if r.tail:
            lines += ["", f"## {r.step}: FAILED, last lines of {r.step}.log", "", "```",
                      *r.tail, "```"]
    titles = {"ablate": "Ablation (step ablate)", "fast": "Fast recipe (step fast)",
              "ddp": "Several GPUs (step ddp)"}
    for r in rows:
        if r.step in titles:
            none = f"({r.numbers})" if r.status == "skipped" else "(no numbers: the step failed)"
            lines += ["", f"## {titles[r.step]}", "", r.section or none]
    path = out / "gpu_check.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def check(out: Path, dry: bool, train_limit: int, fast_config: str,
          only: tuple[str, ...] = ()) -> int:
    """Setup and the three steps (or `only` these) within the budget, then the report; 1 if
    anything failed."""
    began = time.monotonic()
    deadline = began + (DRY_BUDGET_S if dry else BUDGET_S)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="accel-gpu-check-"))
    try:
        env = child_env(work, dry)
        rows = [setup(work, dry, out, env)]
        data_root = work / "cache" / "cifar10-jpeg"  # what accel.shared_data extracts
        gpus = 0 if dry else gpu_count()
        for step in steps(sys.executable, dry, data_root, train_limit, fast_config, gpus):
            if only and step.name not in only:
                continue
            rows.append(run_step(step, env, out, deadline))
            print(f"{step.name}: {rows[-1].status} in {rows[-1].seconds:.0f} s: {rows[-1].numbers}",
                  file=sys.stderr, flush=True)
        path = report(out, rows, machine(dry), time.monotonic() - began)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = [r.step for r in rows if r.status == "FAILED"]
    skipped = [r.step for r in rows if r.status == "skipped"]
    print(f"{path}: {sum(r.status == 'ok' for r in rows)} of {len(rows)} steps ok"
          + (f"; skipped: {', '.join(skipped)}" if skipped else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="folder for gpu_check.md and the logs")
    ap.add_argument("--dry-run", action="store_true", help="rehearse on CPU: no wheels, no CUDA")
    ap.add_argument("--prepare", action="store_true", help="here: fill .gpu/ (make gpu-wheels)")
    ap.add_argument("--train-limit", type=int, default=TRAIN_LIMIT, metavar="N",
                    help=f"CIFAR-10 training images per ablation run (default {TRAIN_LIMIT})")
    ap.add_argument("--steps", default="", metavar="NAMES",
                    help=f"run only these steps, comma-separated ({', '.join(STEP_NAMES)}): "
                         "a rerun of what failed")
    ap.add_argument("--fast-config", default=FAST_CONFIG, metavar="YAML",
                    help=f"the fast recipe (default {FAST_CONFIG})")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # accel.shared_data, accel.ablation.plan: stdlib and yaml only
    if args.prepare:
        return prepare()
    if args.out is None:
        ap.error("OUT is required (the folder for gpu_check.md)")
    only = tuple(s for s in args.steps.split(",") if s)
    if set(only) - set(STEP_NAMES):
        ap.error(f"--steps {args.steps}: unknown step(s); choose from {', '.join(STEP_NAMES)}")
    if not args.dry_run:
        problem = cuda_problem()
        if problem:
            return fail(problem)
    return check(args.out, args.dry_run, args.train_limit, args.fast_config, only)


if __name__ == "__main__":
    sys.exit(main())
