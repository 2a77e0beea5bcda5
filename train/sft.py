"""Supervised fine-tuning with a LoRA or QLoRA adapter: the recipe, top to bottom.

Where it sits: the Ray Train worker (train/launcher.py) reads the tokenized rows and calls
`train_sft`; tests and benches call it directly with rows from `pipelines.tokenize.read_tokenized`.

setup  -> base + adapter (train/lora.py), rows split into train / eval, the loop (train/loop.py);
          on resume, the latest checkpoint replaces the fresh adapter, optimizer and position
train  -> eval loss before, then length-grouped batches (train/data.py); each step's loss is the
          mean cross-entropy over the batch's trained tokens (assistant turns of weight 1, up to
          and including their end-of-turn token); bf16 autocast on GPU
save   -> eval loss after, adapter_model.safetensors + adapter_config.json under output_prefix

Eval: the validation file's rows, or the training file's holdout (`train.data.split_holdout`,
never trained on), mean cross-entropy over all their trained tokens; none left -> both losses None.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from openft.errors import TrainingError
from train.config import TrainJob, TrainOutcome
from train.data import eval_batches, length_grouped_batches, pad_batch
from train.loop import StepResult, run_recipe
from train.lora import autocast
from train.losses import cross_entropy_sum
from train.parallel import SINGLE, Group
from train.progress import Reporter

RESULT_KEYS = ("eval_loss_before", "eval_loss", "eval_rows", "eval_source", "train_loss", "steps", "seconds", "trained_tokens")


class SFTSteps:
    def __init__(self, job: TrainJob, model, device: torch.device, pad_id: int, train_rows: list[dict], eval_rows: list[dict]):
        self.job, self.model, self.device, self.pad_id = job, model, device, pad_id
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.lengths = [len(r["input_ids"]) for r in train_rows]

    def _batch(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch([r["input_ids"] for r in rows], [r["labels"] for r in rows], self.pad_id)
        return {k: v.to(self.device) for k, v in batch.items()}

    def prepare(self, progress) -> None:
        pass  # nothing precomputed: the loss needs only the adapted model

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return length_grouped_batches(self.lengths, self.job.batch_size, self.job.seed, epoch)

    def train_step(self, batch: list[int]) -> StepResult:
        rows = [self.train_rows[i] for i in batch]
        with autocast(self.device):
            loss_sum, count = cross_entropy_sum(self.model, self._batch(rows))
        tokens = sum(len(r["input_ids"]) for r in rows)
        return StepResult(loss_sum, count, tokens, tokens)

    @torch.no_grad()
    def evaluate(self, shard: Callable[[list[int]], list[int]]) -> tuple[float, int]:
        total, count = 0.0, 0
        for batch in eval_batches([len(r["input_ids"]) for r in self.eval_rows], self.job.batch_size):
            if not (batch := shard(batch)):
                continue
            with autocast(self.device):
                loss_sum, n = cross_entropy_sum(self.model, self._batch([self.eval_rows[i] for i in batch]))
            total, count = total + loss_sum.item(), count + n
        return total, count


def train_sft(
    job: TrainJob,
    reporter: Reporter,
    train_rows: list[dict],
    eval_rows: list[dict],
    *,
    on_checkpoint: Callable[[str | None], None] | None = None,
    group: Group = SINGLE,
) -> TrainOutcome:
    """Train on `train_rows` (tokenized chat rows), measure on `eval_rows`; see the module docstring.
    Under data parallelism every rank passes the same rows and its `group` (train/parallel.py)."""
    if job.method_type != "supervised":
        raise ValueError("train_sft runs supervised jobs; DPO jobs go to train.dpo.train_dpo")
    if not train_rows:
        raise TrainingError("context_too_long", "No training row keeps an assistant token within max_seq_length.")
    return run_recipe(
        job, reporter,
        lambda model, device, pad_id: SFTSteps(job, model, device, pad_id, train_rows, eval_rows),
        f"Training {len(train_rows)} rows for {job.n_epochs} epoch(s), evaluating on {len(eval_rows)} rows ({job.eval_source}).",
        len(train_rows), len(eval_rows), on_checkpoint, group,
    )  # fmt: skip
