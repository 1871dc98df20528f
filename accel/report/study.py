"""A study's page, first half: what the study read (Optuna's record and MLflow's), the question
it asked, its answer and how sure that answer is."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from accel.config import param_text
from accel.report import records as rec
from accel.report.page import Section, Table, cell
from accel.tracking import retry_locked
from accel.tune import pareto, study_record
from accel.tune.storage import default_storage
from accel.uris import redact


@dataclass
class StudyFacts:
    """Everything the page says, read once."""

    study: Any
    tracker: Any
    uri: str
    storage: str
    names: list[str]  # the objectives' metrics
    directions: list[str]  # maximize / minimize, one per objective
    runs: dict[int, Any]  # trial number -> its MLflow run
    parent: Any  # the study's parent run, or None
    experiment_id: str | None
    complete: list = field(default_factory=list)
    front: list = field(default_factory=list)
    best: Any = None  # the answer: the best trial (multi-objective: the front's best on the first)

    @property
    def name(self) -> str:
        return self.study.study_name

    @property
    def multi(self) -> bool:
        return len(self.names) > 1

    def run_id(self, trial) -> str | None:
        run = self.runs.get(trial.number)
        return trial.user_attrs.get(study_record.ATTR_RUN) or (run.info.run_id if run else None)


def gather(study, tracker, uri: str, storage: str) -> StudyFacts:
    from optuna.trial import TrialState

    runs: dict[int, Any] = {}
    for run in study_record.search_runs(tracker, study.study_name, "tags.`accel.role` = 'trial'"):
        number = run.data.tags.get("optuna.trial_number", "")
        if number.isdigit():
            runs[int(number)] = run  # oldest first: a trial's latest run wins
    parent = _run_or_none(tracker, study.user_attrs.get(study_record.ATTR_PARENT))
    exp = retry_locked(tracker.client.get_experiment_by_name, study.study_name)
    facts = StudyFacts(study, tracker, uri, storage, pareto.objective_names(study),
                       [d.name.lower() for d in study.directions], runs, parent,
                       exp.experiment_id if exp else None)
    facts.complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if facts.multi:
        facts.front = pareto.front(study)
        facts.best = pareto.pick(study, facts.front, facts.names[0]) if facts.front else None
    else:
        facts.best = study_record.best_trial(study)
        facts.front = [facts.best] if facts.best else []
    return facts


def _run_or_none(tracker, run_id: str | None):
    if not run_id:
        return None
    try:
        return retry_locked(tracker.client.get_run, run_id)
    except Exception:  # deleted, or another store: the page goes on without it
        return None


def _storage_flag(storage: str) -> str:
    return "" if storage == default_storage() else f" --storage {shlex.quote(redact(storage))}"


def _space_table(space: dict) -> Table:
    rows = []
    for key, dim in space.items():
        if dim.get("type") == "categorical":
            where = ", ".join(cell(c) for c in dim.get("choices", []))
        else:
            where = f"{cell(dim.get('low'))} to {cell(dim.get('high'))}"
            where += " (log scale)" if dim.get("log") else ""
            where += f", step {cell(dim['step'])}" if dim.get("step") else ""
        rows.append([key, str(dim.get("type", "?")), where,
                     f"when {dim['when']}" if dim.get("when") else ""])
    return Table(["parameter", "type", "values searched", "condition"], rows,
                 "The search space (the study's definition in Optuna's storage)")


def question(f: StudyFacts) -> Section:
    definition = f.study.user_attrs.get("accel.definition") or {}
    tags = f.parent.data.tags if f.parent else {}
    params = f.parent.data.params if f.parent else {}
    objectives = ", ".join(f"{n} ({d})" for n, d in zip(f.names, f.directions, strict=True))
    s = Section("question", "The question")
    s.text.append(f"Which values of the {len(definition.get('space', {}))} searched "
                  f"parameter(s) give the best {objectives} for experiment "
                  f"'{params.get('name', f.name)}'?")
    s.facts += [("experiment", f"{params.get('name', '?')} (model {params.get('model.name', '?')}"
                               f", data {params.get('data.dataset', '?')}, "
                               f"{params.get('train.epochs', '?')} epochs); its whole config "
                               "is the parent run's config.yaml, below"),
                ("objective" + ("s" if f.multi else ""), objectives),
                ("sampler and pruner", f"{tags.get('optuna.sampler', '?')}, "
                                       f"{tags.get('optuna.pruner', '?')}"),
                ("storage", f"{redact(f.storage)} (study {f.name})"),
                ("MLflow", f"{redact(f.uri)} (experiment {f.name})")]
    source = f.runs.get(f.best.number) if f.best else next(iter(f.runs.values()), None)
    if source is not None:
        s.facts += rec.data_facts(source)
        s.facts += rec.machine_facts(rec.environment(f.tracker, source.info.run_id))
    s.tables.append(_space_table(definition.get("space", {})))
    config = rec.artifact_text(f.tracker, f.parent.info.run_id, "config.yaml") if f.parent \
        else None
    if config:
        s.blocks.append(("The study's base config (config.yaml of its parent run)", config))
    return s


def _commands(f: StudyFacts, trial) -> list[tuple[str, str]]:
    run_id = f.run_id(trial)
    flag = rec.store_flag(f.uri)
    return [(f"Rerun trial {trial.number} from MLflow and compare its numbers",
             f"accel reproduce {run_id}{flag}"),
            (f"Train trial {trial.number}'s exact config again (written beside this page)",
             f"accel train {config_name(trial)}{flag}"),
            ("The same answer on the terminal",
             f"accel best --study {f.name}{_storage_flag(f.storage)}"
             + (f" --pick {f.names[0]}" if f.multi else ""))]


def config_name(trial) -> str:
    return f"trial-{trial.number:03d}.yaml"


def answer(f: StudyFacts) -> tuple[Section, dict[str, str]]:
    """The best trial: its value(s), its params as Optuna and MLflow hold them, its run and the
    commands that rerun it; its config.yaml, to be written beside the page."""
    s = Section("answer", "The answer")
    if f.best is None:
        s.text.append(f"No trial of study {f.name} has completed yet: there is no answer.")
        return s, {}
    t, run = f.best, f.runs.get(f.best.number)
    which = (f"the Pareto front's best on {f.names[0]} (as `accel best --pick "
             f"{f.names[0]}`): the front has {len(f.front)} trial(s), listed below"
             if f.multi else "the best complete trial")
    s.text.append(f"Trial {t.number} is {which}.")
    s.facts += [("best trial", str(t.number)),
                *((name, cell(v, 6)) for name, v in zip(f.names, t.values, strict=True)),
                ("MLflow run", f.run_id(t) or "none found")]
    logged = run.data.params if run else {}
    s.tables.append(Table(["parameter", "value (Optuna)", "logged in MLflow"],
                          [[k, param_text(v), logged.get(k, "not logged")]
                           for k, v in t.params.items()],
                          f"Trial {t.number}'s searched values"))
    if run is not None and f.experiment_id:
        url, served = rec.run_page(f.uri, f.experiment_id, run.info.run_id)
        s.links.append((f"Trial {t.number}'s run in the MLflow UI (served by {served})", url))
    s.commands += _commands(f, t)
    if f.multi:
        s.tables.append(Table(["trial", *f.names, "MLflow run", "reproduce"],
                              [[str(x.number), *(cell(v) for v in x.values), f.run_id(x) or "",
                                f"accel reproduce {f.run_id(x)}{rec.store_flag(f.uri)}"]
                               for x in f.front], "The Pareto front"))
    config = rec.artifact_text(f.tracker, run.info.run_id, "config.yaml") if run else None
    return s, ({config_name(t): config} if config else {})


def how_sure(f: StudyFacts) -> Section:
    """`accel verify`'s table, intervals and probability of being best, or how to get them."""
    s = Section("sure", "How sure")
    run = study_record.latest_verification(f.tracker, f.name)
    command = f"accel verify --study {f.name}{_storage_flag(f.storage)}{rec.store_flag(f.uri)}"
    if run is None:
        s.text.append("Not verified yet. The best value above is one run with one seed, picked "
                      "as the best of many noisy runs, so it tends to flatter its trial. "
                      "`accel verify` reruns the top trials and the experiment's own values "
                      "over fresh seeds and gives each a 95% interval and the probability of "
                      "staying best.")
        s.commands.append(("Verify the study", command))
        return s
    tags = run.data.tags
    s.text.append(f"Verified by accel verify (run {run.info.run_id}) over seeds "
                  f"{tags.get('accel.verify.seeds', '?')}.")
    s.facts += [("verdict", tags.get("accel.verdict", "?")),
                ("verified best", f"trial {tags.get('accel.verified_best', '?')}"),
                ("probability", f"{tags.get('accel.p_best', '?')} "
                                + ("of staying non-dominated" if f.multi else "of being best"))]
    table = rec.artifact_text(f.tracker, run.info.run_id, "verify.md")
    if table:
        s.tables.append(_markdown_table(table))
    s.commands.append(("Verify again (finished reruns are reused)", command))
    return s


def _markdown_table(text: str) -> Table:
    """A Markdown table (verify.md) as a Table; the lines after it become its caption."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in lines if line.startswith("|")]
    rows = [r for r in rows if not all(set(c) <= {"-", ":"} for c in r)]
    rest = " ".join(line for line in lines if not line.startswith("|"))
    return Table(rows[0] if rows else [], rows[1:], rest)

