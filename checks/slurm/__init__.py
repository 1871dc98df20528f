"""`make slurm-check` (`python -m checks.slurm`), one module per concern: `settings` (the
study's file and name, the PostgreSQL, the log line), `cluster` (the one-node Slurm: installed,
started, stopped), `study` (the job array, the requeue, the time limit, what is checked of the
study and its runs), `__main__` (the command line and the clean-up)."""
