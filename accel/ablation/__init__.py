"""`accel ablate`: time every on/off combination of GA, AMP and PM (and channels_last, compile).

The paper's question, for your model and machine: how much faster does each technique make
training, alone and combined? Within a repeat every combination trains with the same data, seed,
epochs and effective batch size, through the same `train(cfg)` as everything else; each repeat
has its own seed. Over several experiment files (`grid`), one ablation each and a summary.

`plan` says which runs and what each switch means, `runs` runs them (and records them in MLflow),
`report` turns them into tables and a figure, `command` is the CLI.
"""

from accel.ablation.command import cli_ablate, cli_grid
from accel.ablation.plan import (
    BASELINE,
    DEFAULT_GA_STEPS,
    TECHNIQUES,
    AblationPlan,
    combination_config,
    combinations,
    make_plan,
    not_applicable,
    parse_techniques,
    schedule,
)
from accel.ablation.record import RunRecord, record_from_history
from accel.ablation.report import Ablation, Row, csv_table, markdown_table, summarize
from accel.ablation.runs import reset_peak_memory, run_ablation

__all__ = ["BASELINE", "DEFAULT_GA_STEPS", "TECHNIQUES", "Ablation", "AblationPlan", "Row",
           "RunRecord", "cli_ablate", "cli_grid", "combination_config", "combinations", "csv_table",
           "make_plan", "markdown_table", "not_applicable", "parse_techniques",
           "record_from_history", "reset_peak_memory", "run_ablation", "schedule", "summarize"]
