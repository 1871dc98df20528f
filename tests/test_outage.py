"""Riding out a store that goes away for a while (accel.outage): which errors are an outage, the
wait and its window, and the fast failure for a store that never answered. The same seen across
real processes, with a real `mlflow server` and a real PostgreSQL stopped under a study, is in
tests/test_store_outages.py."""

from __future__ import annotations

import urllib.error

import pytest

from accel import outage


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(outage, "_reached", set())
    monkeypatch.setattr(outage, "_waiting", {})
    monkeypatch.setattr(outage, "FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(outage, "MAX_WAIT_S", 0.02)


def _raised_from(inner: BaseException, outer: type[BaseException], text: str) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer(text) from e
    except BaseException as e:
        return e


@pytest.mark.parametrize("error", [
    ConnectionRefusedError(111, "Connection refused"),
    urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
    RuntimeError("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed "
                 "with exception HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries "
                 "exceeded with url: ... (Caused by NewConnectionError(...))"),
    RuntimeError("(psycopg2.OperationalError) FATAL:  the database system is shutting down"),
    RuntimeError("(psycopg2.OperationalError) server closed the connection unexpectedly"),
    # Optuna's StorageInternalError says only that a commit failed; its cause says why.
    _raised_from(RuntimeError("FATAL: terminating connection due to administrator command"),
                 RuntimeError, "An exception is raised during the commit."),
])
def test_a_store_that_is_not_there_is_an_outage(error):
    assert outage.is_outage(error)


@pytest.mark.parametrize("error", [
    ValueError("Invalid value for param train.lr"),
    RuntimeError("(sqlite3.OperationalError) no such table: runs"),
    KeyError("run not found"),
    outage.StoreUnavailable("the MLflow server at http://x", 120,
                            ConnectionRefusedError(111, "Connection refused")),
])
def test_a_refusal_a_bug_or_a_store_already_given_up_on_is_not(error):
    assert not outage.is_outage(error)


class Flaky:
    """Fails with `error` `times` times, then answers."""

    def __init__(self, times: int, error: Exception):
        self.times, self.error, self.calls = times, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return "answer"


def test_a_store_reached_before_is_waited_for_with_a_line_when_it_goes_and_comes(capsys):
    outage.mark_reached("db")
    call = Flaky(4, ConnectionRefusedError(111, "Connection refused"))
    assert outage.ride_out(call, key="db", store="the Optuna storage db") == "answer"
    assert call.calls == 5
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2  # one line when it goes, one when it comes back: not one per try
    assert err[0].startswith("accel: the Optuna storage db does not answer (")
    assert "waiting up to 120 s" in err[0]
    assert err[1].startswith("accel: the Optuna storage db answers again after ")


def test_a_store_never_reached_fails_at_once():
    call = Flaky(1, ConnectionRefusedError(111, "Connection refused"))
    with pytest.raises(ConnectionRefusedError):
        outage.ride_out(call, key="db", store="db")
    assert call.calls == 1


def test_an_error_that_is_no_outage_is_raised_at_once():
    outage.mark_reached("db")
    call = Flaky(1, ValueError("bad value"))
    with pytest.raises(ValueError):
        outage.ride_out(call, key="db", store="db")
    assert call.calls == 1


def test_past_the_window_the_store_is_named_and_later_calls_do_not_wait_again(monkeypatch):
    monkeypatch.setenv("ACCEL_OUTAGE_S", "0.2")
    outage.mark_reached("srv")
    down = Flaky(10**6, ConnectionRefusedError(111, "Connection refused"))
    with pytest.raises(outage.StoreUnavailable) as raised:
        outage.ride_out(down, key="srv", store="the MLflow server at http://127.0.0.1:5000")
    assert str(raised.value).startswith("the MLflow server at http://127.0.0.1:5000 did not "
                                        "answer for 0 s ($ACCEL_OUTAGE_S=0)")
    assert down.calls > 2
    again = Flaky(10**6, ConnectionRefusedError(111, "Connection refused"))
    with pytest.raises(ConnectionRefusedError):  # the clean-up after it does not wait again
        outage.ride_out(again, key="srv", store="srv")
    assert again.calls == 1
    assert outage.ride_out(Flaky(0, ValueError()), key="srv", store="srv") == "answer"
    assert "srv" in outage._reached  # it answered: waited for again


def test_a_riding_object_waits_on_each_of_its_methods():
    class Client:
        def __init__(self):
            self.log = Flaky(2, ConnectionResetError(104, "Connection reset by peer"))
            self.name = "client"

        def log_batch(self, run_id, *, key):  # keyword names of the wrapped call pass through
            return self.log(), run_id, key

    outage.mark_reached("uri")
    riding = outage.Riding(Client(), key="uri", store="the MLflow store uri")
    assert riding.log_batch("r1", key="k") == ("answer", "r1", "k")
    assert riding.name == "client"


def test_a_stopped_trial_left_unqueued_is_queued_once_also_when_it_was_a_retry():
    """What a dead invocation left: a stopped retry (whose `failed_trial` names the first
    attempt, as Optuna's retry keeps it) is queued again once, however often an invocation
    looks; a trial that failed of its own error is not; the retry limit holds."""
    import optuna
    from optuna.storages import RetryFailedTrialCallback
    from optuna.trial import TrialState

    from accel.tune import study_record as record
    from accel.tune.workers import _queue_again, queue_unexplained

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    stopped = {record.ATTR_ERROR: "stopped by SIGTERM", record.ATTR_STOPPED: True}

    def fail(attrs: dict) -> optuna.trial.FrozenTrial:
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        study.tell(trial, state=TrialState.FAIL)
        return study.trials[trial.number]

    first = fail(stopped)
    assert _queue_again(study, first)  # trial 1, queued by the stop
    retry = fail(stopped)  # trial 1 ran and was stopped too; its process died before queuing
    assert retry.system_attrs["failed_trial"] == 0  # Optuna keeps the first attempt's number
    fail({record.ATTR_ERROR: "RuntimeError: CUDA out of memory"})  # trial 2: its own error
    fail({})  # trial 3: ended without a word (its process killed between FAIL and queuing)
    assert queue_unexplained(study, settle_s=3600) == []  # too recent: left to whoever failed it
    assert queue_unexplained(study, settle_s=0) == [1, 3]
    assert queue_unexplained(study, settle_s=0) == []  # once
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert sorted(RetryFailedTrialCallback.retry_history(t)[-1] for t in waiting) == [1, 3]
