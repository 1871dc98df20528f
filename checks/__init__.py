"""System checks: each brings up a real system, runs accel on it, checks what it promised and
removes what it made (docs/architecture.md, "Outbuildings"). One package per check, `common` at
the bottom:

- `docker`  `make docker-check`: the docker/ stack built and run;
- `slurm`   `make slurm-check`: a study as a Slurm job array on a one-node Slurm;
- `chaos`   `python -m checks.chaos`: faults at random under a running study;
- `gpu`     `make gpu-check`, `make gpu-wheels`: the prepared GPU check;
- `common`  what they share (a free port, a bounded wait, a stamped log line).

A check package imports accel, `checks.common` and its own modules: no other check, nothing of
bench/."""
