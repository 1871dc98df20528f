"""Optuna tuning studies, one module per concern:

- `space`        the `search:` block: searched keys, ranges, choices; what defines a study
- `storage`      journal file or database storage; heartbeats and retry of a dead worker's trial
- `study`        sampler, pruner, and `prepare` (the study and its MLflow parent run, made once)
- `objective`    one trial = one `train()` run, closed in MLflow whatever its outcome
- `workers`      the worker loop, worker processes, Ctrl-C, closing orphaned trials
- `nodes`        which invocations work on a study (leases), so the last one finishes its parent run
- `study_record` the study's record in MLflow: parent run, trial runs, trials.csv, Optuna's plots
- `commands`     `accel tune`
- `best`         `accel best`; loading a study that must exist
- `slurm`        `accel tune --slurm N`: the workers as a Slurm job array (imported by the CLI)
"""

from accel.tune.best import cli_best
from accel.tune.commands import cli_tune
from accel.tune.space import PRUNERS, SAMPLERS, Dim, check_search, definition, trial_config
from accel.tune.storage import open_storage
from accel.tune.study import TuneJob, build_pruner, build_sampler, prepare

__all__ = ["PRUNERS", "SAMPLERS", "Dim", "TuneJob", "build_pruner", "build_sampler",
           "check_search", "cli_best", "cli_tune", "definition", "open_storage", "prepare",
           "trial_config"]
