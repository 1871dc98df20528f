"""`accel report`: one page per study, run or ablation, that says the question, the answer, how
sure it is and how to rerun it. One HTML file that needs no network (plotly.js inline) and its
Markdown twin, written locally and logged on the run as `report/`.

`study` and `trials` say what a study's page holds, `runs` a run's and an ablation's,
`figures` draws, `page` renders (`template` holds the HTML and Markdown), `write` writes and
logs (`accel tune` and `accel ablate` call it at their end), `command` is the CLI. Only
`command` is imported here: `accel --help` reads its arguments.
"""

from accel.report.command import cli_report

__all__ = ["cli_report"]
