"""`python -m checks.chaos`: faults at random under a running study, then what was lost, one
module per concern: `services` (a PostgreSQL cluster and an `mlflow server` of the check's own),
`faults` (the study, its invocations and each kind of fault), `tally` (the trials and runs
counted, the table), `__main__` (the command line)."""
