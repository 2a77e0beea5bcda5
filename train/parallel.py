"""Data parallelism across a run's Ray Train workers: which rows of a batch a rank trains, and the
collectives that make N workers take the steps one worker would.

Where it sits: train/launcher.py builds the `Group` of its worker (Ray Train has already joined
the torch process group: gloo on CPU, NCCL on GPU); the loop (train/loop.py) and the recipes' evals
call it. `SINGLE` (one worker, tests, benches) does no collective at all, so a one-worker run
computes exactly what it did before data parallelism existed.

Every rank builds the same global batch order (same rows, same seed) and trains `shard(batch)`,
a contiguous slice of it: a length-grouped batch is sorted by length, so a slice pads little. The
loss of a step is the mean over the global batch's trained tokens (SFT) or pairs (DPO): each rank
runs backward on its summed loss over the global count (`sum` first), and `sum_gradients` adds
the ranks' gradients, so the step's gradient is that of sum(loss sums) / global count whatever the
split. A rank whose slice is empty (a batch smaller than the group) adds zeros.

Why not torch's DistributedDataParallel: the losses (train/losses.py) call the base model's decoder
and LM head directly, never the wrapper's forward, where DDP prepares its gradient hooks; and the
LoRA gradients are a few MB, so one flat all-reduce per step is all DDP's buckets would do.

Whatever decides when the loop stops (the owner's pause or cancel, the time limit) is read on rank 0
and broadcast (`from_rank0`): two processes polling the database or a clock would disagree, and a
rank that stops alone leaves the others waiting in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Group:
    rank: int
    size: int
    device: torch.device  # where collective tensors live: the GPU under NCCL, else the CPU

    @classmethod
    def of_ray_train_worker(cls) -> "Group":
        import ray.train
        import torch.distributed as dist

        context = ray.train.get_context()
        size = context.get_world_size()
        if size == 1:
            return SINGLE
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        return cls(context.get_world_rank(), size, device)

    @property
    def leader(self) -> bool:
        """Rank 0: the only rank that writes to the store and reports."""
        return self.rank == 0

    def shard(self, batch: list[int]) -> list[int]:
        """This rank's contiguous slice of `batch`; slice sizes differ by at most one."""
        if self.size == 1:
            return batch
        per, extra = divmod(len(batch), self.size)
        start = self.rank * per + min(self.rank, extra)
        return batch[start : start + per + (self.rank < extra)]

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64, so token counts stay exact)."""
        if self.size == 1:
            return values
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def from_rank0(self, value: int) -> int:
        """Rank 0's `value` on every rank."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.broadcast(tensor, src=0)
        return int(tensor.item())

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the ranks (a rank that ran no
        backward this step counts zeros)."""
        if self.size == 1:
            return
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.device)
            offset += n


SINGLE = Group(0, 1, torch.device("cpu"))
