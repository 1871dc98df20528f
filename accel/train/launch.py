"""Starting one run on several processes, data parallel (`train.nproc_per_node`), through
`ignite.distributed`: gloo on CPU, nccl on CUDA. (What each rank then does: accel.ranks.)

The process that calls `train()` is rank 0: it alone holds the MLflow run, the Optuna trial and
the signal handlers, exactly as a one-process run does. It starts ranks 1..N-1 as fresh
interpreters (`spawn`), handing each the config object itself (pickled: every float exact, unlike
a broadcast of float32s) and the checkpoint a resumed run starts from (which holds every rank's
random states). Every rank then runs the
same `train()`: the same model from the same seed, its shard of every batch, the gradients
averaged by DistributedDataParallel, the metrics reduced by Ignite across ranks, so each rank
computes the same history and best epoch; only rank 0 logs. What rank 0 alone decides (a pruned
trial) is broadcast at the end of each epoch. A rank that fails ends the others: rank 0 names
its error and ends the run FAILED; rank 0 stopped (a signal, or killed) ends its followers.

Under `torchrun` the ranks exist already (its environment names them): each runs the accel
command itself and rank 0 logs. `idist.Parallel` spawns every rank as a child, so the process
holding the trial and the run would be none of them; that is why rank 0 is the caller here.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import socket
import sys

import torch

from accel.config import Config, ConfigError
from accel.errors import RankFailed
from accel.ranks import Stopped, world_size


def backend(device: str) -> str:
    from accel.engine import resolve_device

    return "nccl" if resolve_device(device).type == "cuda" else "gloo"


def torchrun() -> bool:
    """Whether torchrun started this process as one rank of several (its environment says)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def torchrun_follower() -> bool:
    """A rank other than 0 of a torchrun group: it trains, rank 0 logs and speaks."""
    return torchrun() and os.environ["RANK"] != "0"


def _torchruns_world(cfg: Config) -> None:
    """torchrun's world size as the run's `train.nproc_per_node` (what it logs and a reproduce
    reruns: one process per rank on one node); a config that asked for another is refused."""
    world, asked = int(os.environ["WORLD_SIZE"]), cfg.train.nproc_per_node
    if asked not in (1, world):
        raise ConfigError(f"train.nproc_per_node={asked} but torchrun started {world} ranks: "
                          f"leave it out under torchrun, or set it to {world}")
    cfg.train.nproc_per_node = world


@contextlib.contextmanager
def ranks(cfg: Config, resume=None):
    """The process group of a run: none for one process; under torchrun the one its environment
    names; else rank 0 here and N-1 spawned followers, all gone when the block ends."""
    import ignite.distributed as idist

    n = cfg.train.nproc_per_node
    if idist.get_world_size() > 1:  # a follower, or a process that made its group itself
        yield
        return
    if torchrun():
        _torchruns_world(cfg)
        idist.initialize(backend(cfg.train.device))
        try:
            yield
        finally:
            idist.finalize()
        return
    if n == 1:
        yield
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()
    port = _free_port()
    followers = [context.Process(target=_follow, name=f"accel-rank-{r}",
                                 args=(r, n, port, cfg, resume, errors))
                 for r in range(1, n)]
    for p in followers:
        p.start()
    try:
        with _named(0, n, port):
            idist.initialize(backend(cfg.train.device))
            try:
                yield
            except Exception as e:
                failed = _follower_error(followers, errors)
                if failed:
                    raise RankFailed(failed) from e
                raise
            finally:
                idist.finalize()
        for p in followers:
            p.join()
        failed = _follower_error(followers, errors)
        if failed:
            raise RankFailed(failed)
    finally:
        _end(followers)


def _rank_environment(r: int, n: int, port: int) -> dict[str, str]:
    """What torchrun would set for rank `r` of `n` on one node."""
    return {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


@contextlib.contextmanager
def _named(r: int, n: int, port: int):
    """Rank 0's environment while its group exists, then the one it had (a study trains its
    next trial in this process)."""
    kept = dict(os.environ)
    os.environ.update(_rank_environment(r, n, port))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(kept)


def _follower_error(followers, errors, wait_s: float = 10.0) -> str | None:
    """A follower's own error, once it has exited (a collective failed in rank 0 because a
    follower died): 'rank R: ERROR', or how it ended."""
    for p in followers:
        p.join(timeout=wait_s)
    said = {}
    while not errors.empty():
        r, message = errors.get()
        said[r] = message
    for r, p in enumerate(followers, start=1):
        if r in said:
            return f"rank {r} of {len(followers) + 1}: {said[r]}"
        if p.exitcode not in (0, None):
            how = (f"killed by {signal.Signals(-p.exitcode).name}" if p.exitcode < 0
                   else f"exit code {p.exitcode}")
            return f"rank {r} of {len(followers) + 1} ended ({how})"
    return None


def _end(followers) -> None:
    for p in followers:
        if p.is_alive():
            p.terminate()
    for p in followers:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _follow(r: int, n: int, port: int, cfg: Config, resume, errors) -> None:
    """A follower rank: the same run as rank 0, untracked; ends when rank 0 ends."""
    import ignite.distributed as idist

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the group: end quietly
    from accel.errors import one_line
    from accel.train import train

    os.environ.update(_rank_environment(r, n, port))
    code = 0
    try:
        idist.initialize(backend(cfg.train.device))
        # Tensors handed to a spawned process arrive in memory shared with rank 0 (torch's
        # pickling): the checkpoint's optimizer state would be stepped by both ranks. A copy.
        train(cfg, track=False, resume=copy.deepcopy(resume))
    except Stopped:
        pass
    except BaseException as e:
        errors.put((r, one_line(e)))
        code = 1
    finally:
        with contextlib.suppress(Exception):
            idist.finalize()
    leave(code)


def leave(code: int) -> None:
    """End a follower now, its output flushed, without the interpreter's teardown: its work is
    done and reported, and the C++ objects a run leaves (the process group's and the thread
    pools' threads) can abort while they are destroyed ('terminate called without an active
    exception'), which rank 0 would read as a rank that failed a finished run."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when rank 0 dies (a killed worker leaves no follower
    waiting in a collective)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def device_of(name: str) -> torch.device:
    """This rank's device: cuda:LOCAL_RANK when several ranks share a node's GPUs."""
    from accel.engine import resolve_device

    device = resolve_device(name)
    if device.type == "cuda" and world_size() > 1 and device.index is None:
        import ignite.distributed as idist

        device = torch.device("cuda", idist.get_local_rank())
        if device.index >= torch.cuda.device_count():
            raise ConfigError(f"train.nproc_per_node={world_size()} but only "
                              f"{torch.cuda.device_count()} CUDA device(s) are visible")
        torch.cuda.set_device(device)
    return device
