"""Where this process stands in a data-parallel run (train.nproc_per_node), and the few
exchanges its ranks make: rank 0's decisions, sums, gathered states, the model's wrapper and
each rank's share of the training images. One process: every helper is the identity.
(The ranks are started by accel.train.launch.)"""

from __future__ import annotations

from typing import Any

import torch

from accel.errors import ConfigError


class Stopped(Exception):
    """Rank 0 ended the run early (its trial was pruned): a follower's run ends with it."""


def rank() -> int:
    import ignite.distributed as idist

    return idist.get_rank()


def world_size() -> int:
    import ignite.distributed as idist

    return idist.get_world_size()


def rank_zero_decides(flag: bool) -> bool:
    """Rank 0's `flag` on every rank (one broadcast; one process: the flag itself)."""
    if world_size() == 1:
        return flag
    import ignite.distributed as idist

    return bool(idist.broadcast(torch.tensor(int(flag)), src=0).item())


def gathered(obj: Any) -> list[Any] | None:
    """Every rank's `obj`, in rank order (each rank calls it); None for one process."""
    if world_size() == 1:
        return None
    import torch.distributed as dist

    objects: list[Any] = [None] * world_size()
    dist.all_gather_object(objects, obj)
    return objects


def from_rank_zero(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (each rank calls it; one process: `obj`)."""
    if world_size() == 1:
        return obj
    import torch.distributed as dist

    box = [obj if rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_over_ranks(value: float) -> float:
    if world_size() == 1:
        return value
    import ignite.distributed as idist

    return float(idist.all_reduce(torch.tensor(float(value), dtype=torch.float64)))


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel around `model` when the run has several ranks."""
    if world_size() == 1:
        return model
    kwargs = {"device_ids": [device]} if device.type == "cuda" else {}
    return torch.nn.parallel.DistributedDataParallel(model, **kwargs)


def shards(n: int, generator: torch.Generator, batch_size: int) -> ShardedShuffle | None:
    """This rank's sampler of the training images; None for one process (torch's shuffle)."""
    if world_size() == 1:
        return None
    check_fits(n, batch_size)
    return ShardedShuffle(n, generator, rank(), world_size(), batch_size)


def check_fits(n: int, batch_size: int) -> None:
    """Refuses a global batch (world x batch_size) larger than the `n` training images."""
    if n < world_size() * batch_size:
        raise ConfigError(f"train.nproc_per_node={world_size()} x train.batch_size={batch_size}"
                          f" is more than the {n} training images")


def eval_shard(n: int) -> range | None:
    """This rank's share of an evaluation split: every world-th image, none twice (Ignite's
    metrics add the ranks' counts up); None for one process."""
    return range(rank(), n, world_size()) if world_size() > 1 else None


class ShardedShuffle(torch.utils.data.Sampler):
    """One rank's part of each shuffled pass over `n` training images. The pass's order is the
    permutation torch's RandomSampler draws from the same generator (two draws a pass, as it
    makes), cut to whole global batches (world x batch_size) and dealt out position by position:
    rank r takes positions r, r + world, ... So every update of W ranks at batch b sees the
    images one process at batch W x b sees in that update."""

    def __init__(self, n: int, generator: torch.Generator, rank: int, world: int,
                 batch_size: int):
        self.n, self.generator, self.rank, self.world = n, generator, rank, world
        self.used = n - n % (world * batch_size)

    def __len__(self) -> int:
        return self.used // self.world

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator).tolist()
        torch.randperm(self.n, generator=self.generator)  # RandomSampler's draw at a pass's end
        yield from order[self.rank:self.used:self.world]
