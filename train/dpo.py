"""Preference fine-tuning (DPO) with a LoRA or QLoRA adapter: the recipe, top to bottom.

Where it sits: like train/sft.py, called by the Ray Train worker with tokenized preference rows
(`prompt_ids`, `chosen_ids`, `rejected_ids`).

setup  -> base + adapter, the loop; on resume the latest checkpoint
ref    -> the reference policy is the policy the job starts from: the base itself with the adapter
          disabled (peft's `disable_adapter()`; no second copy of the model), or, for a job that
          continues from an ft: model (jobs/lineage.py), that model, as DPO's reference is the SFT
          model it starts from (Rafailov et al. 2023, arXiv:2305.18290, section 4). Each pair's
          reference log-probs are computed once, before the first step, and kept in the loop's
          progress, so a checkpoint carries them and a resumed run never recomputes them
train  -> eval loss before, then length-grouped batches of pairs; each step runs the chosen and the
          rejected sequences of its pairs as one padded batch; loss = mean over pairs of
          -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), with the log-probs summed over the
          completion tokens (up to and including the end-of-turn token)
save   -> eval loss after, the adapter files

Eval loss is the DPO loss on the eval pairs: exactly ln 2 before training, since the policy starts
equal to the reference (a fresh adapter is the identity, lora_B = 0; a parent's is the reference).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from openft.errors import TrainingError
from pipelines.tokenize import IGNORE_INDEX
from train.config import TrainJob, TrainOutcome
from train.data import eval_batches, length_grouped_batches, pad_batch
from train.loop import Progress, StepResult, run_recipe
from train.lora import autocast
from train.losses import dpo_losses, sequence_logprobs
from train.parallel import SINGLE, Group
from train.progress import Reporter


def _pair_length(row: dict) -> int:
    return len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))


class DPOSteps:
    def __init__(self, job: TrainJob, model, device: torch.device, pad_id: int, train_rows: list[dict], eval_rows: list[dict]):
        self.job, self.model, self.device, self.pad_id = job, model, device, pad_id
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.lengths = [_pair_length(r) for r in train_rows]
        self.reference: dict[str, torch.Tensor] = {}  # "train" / "eval": [rows, 2] (chosen, rejected)

    def _batch(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        """Chosen sequences first, then rejected; labels on the completion tokens only."""
        sequences, labels = [], []
        for key in ("chosen_ids", "rejected_ids"):
            for r in rows:
                sequences.append(r["prompt_ids"] + r[key])
                labels.append([IGNORE_INDEX] * len(r["prompt_ids"]) + r[key])
        batch = pad_batch(sequences, labels, self.pad_id)
        return {k: v.to(self.device) for k, v in batch.items()}

    def _logprobs(self, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.device):
            logprobs = sequence_logprobs(self.model, self._batch(rows)).float()
        return logprobs[: len(rows)], logprobs[len(rows) :]

    @torch.no_grad()
    def prepare(self, progress: Progress) -> None:
        """Reference log-probs of every pair, once per run (kept in `progress.extra` across resumes)."""
        if "reference" not in progress.extra:
            # Before the first step the adapter holds the parent's weights, when the job has one.
            starting = contextlib.nullcontext() if self.job.init_adapter_prefix else self.model.disable_adapter()
            with starting:
                progress.extra["reference"] = {
                    name: self._reference_of(rows) for name, rows in (("train", self.train_rows), ("eval", self.eval_rows))
                }
        self.reference = progress.extra["reference"]

    def _reference_of(self, rows: list[dict]) -> torch.Tensor:
        out = torch.zeros(len(rows), 2, dtype=torch.float64)
        for batch in eval_batches([_pair_length(r) for r in rows], self.job.batch_size):
            chosen, rejected = self._logprobs([rows[i] for i in batch])
            out[batch, 0], out[batch, 1] = chosen.double().cpu(), rejected.double().cpu()
        return out

    def _losses(self, rows: list[dict], reference: torch.Tensor) -> torch.Tensor:
        chosen, rejected = self._logprobs(rows)
        reference = reference.to(self.device)
        return dpo_losses(chosen.double(), rejected.double(), reference[:, 0], reference[:, 1], self.job.beta)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return length_grouped_batches(self.lengths, self.job.batch_size, self.job.seed, epoch)

    def train_step(self, batch: list[int]) -> StepResult:
        rows = [self.train_rows[i] for i in batch]
        losses = self._losses(rows, self.reference["train"][batch])
        prompts = sum(len(r["prompt_ids"]) for r in rows)
        answers = sum(len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in rows)
        return StepResult(losses.sum(), len(rows), 2 * prompts + answers, prompts + answers)

    @torch.no_grad()
    def evaluate(self, shard: Callable[[list[int]], list[int]]) -> tuple[float, int]:
        total, count = 0.0, 0
        for batch in eval_batches([_pair_length(r) for r in self.eval_rows], self.job.batch_size):
            if not (batch := shard(batch)):
                continue
            total += self._losses([self.eval_rows[i] for i in batch], self.reference["eval"][batch]).sum().item()
            count += len(batch)
        return total, count


def train_dpo(
    job: TrainJob,
    reporter: Reporter,
    train_rows: list[dict],
    eval_rows: list[dict],
    *,
    on_checkpoint: Callable[[str | None], None] | None = None,
    group: Group = SINGLE,
) -> TrainOutcome:
    """Train on `train_rows` (tokenized preference rows), measure on `eval_rows`; see the module docstring.
    Under data parallelism every rank passes the same rows and its `group` (train/parallel.py)."""
    if job.method_type != "dpo":
        raise ValueError("train_dpo runs DPO jobs; supervised jobs go to train.sft.train_sft")
    if not train_rows:
        raise TrainingError("context_too_long", "No preference pair keeps a completion token within max_seq_length.")
    return run_recipe(
        job, reporter,
        lambda model, device, pad_id: DPOSteps(job, model, device, pad_id, train_rows, eval_rows),
        f"Training {len(train_rows)} pairs for {job.n_epochs} epoch(s) with beta {job.beta}, evaluating on {len(eval_rows)} pairs.",
        len(train_rows), len(eval_rows), on_checkpoint, group,
    )  # fmt: skip
