"""The step loop the recipes share: learning-rate schedule, pause/cancel between steps, metrics,
epoch-end and pause checkpoints, resume, the time limit, and the result figures.

Where it sits: sft.py, dpo.py and rft.py each define a `Steps` object (what one batch's loss is, how
eval is measured) and call `run_recipe`, which builds the model, runs `TrainLoop` and saves the adapter. Everything the loop counts lives in
`Progress`, which a checkpoint stores whole, so a resumed run ends with the same numbers and the
same adapter bytes as an uninterrupted one.

Data parallel (train/parallel.py): every rank runs this loop over the same batches and trains its
slice of each; the step's loss is the mean over the whole batch, its counts are summed over the
ranks, and only rank 0 (the group's leader) checkpoints, saves the adapter and reports. Pause,
cancel and the time limit are rank 0's decisions, broadcast, so every rank stops at the same step.

Schedule: linear warmup over the first 3 % of steps (at least one), then linear decay towards
zero; AdamW without weight decay; gradients clipped to norm 1.0. The learning rate is a pure
function of the step, so there is no scheduler state to save.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

import torch

from catalog.bases import get_base
from openft.errors import TrainingError
from storage.objects import open_object_store
from train.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, restore_rng, save_checkpoint
from train.config import TrainJob, TrainOutcome
from train.lora import (
    ADAPTER_WEIGHTS,
    adapter_files,
    build_model,
    load_adapter_weights,
    pick_device,
    read_adapter_weights,
    trainable_parameters,
)
from train.parallel import SINGLE, Group
from train.progress import MetricsClock, Reporter

WARMUP_FRACTION = 0.03
MAX_GRAD_NORM = 1.0


@dataclass
class StepResult:
    loss_sum: torch.Tensor  # the rows' summed loss (backward runs on it over the batch's count)
    loss_count: int  # what it is summed over: trained tokens for SFT, pairs for DPO, RFT's constant normalizer
    tokens: int  # non-pad tokens the step processed (throughput)
    row_tokens: int  # the trained rows' tokens, as billed (result `trained_tokens`)
    figures: dict[str, float] = field(default_factory=dict)  # sums named by `Steps.figure_names`


class Steps(Protocol):
    def prepare(self, progress: "Progress") -> None:
        """Work before eval-before and the first step, kept in `progress.extra` across resumes."""
        ...

    def epoch_batches(self, epoch: int) -> list[list[int]]: ...

    def train_step(self, batch: list[int]) -> StepResult:
        """The loss of the rows `batch` indexes (never empty)."""
        ...

    def evaluate(self, shard: Callable[[list[int]], list[int]]) -> tuple[float, int]:
        """(summed eval loss, what it is summed over) of `shard` of each eval batch."""
        ...

    # Optional, read with `getattr` (SFT and DPO leave them out; train/rft.py has them all):
    # eval_name: str = "loss"  -> the result's `eval_<name>_before` / `eval_<name>`
    # eval_interval: int | None -> also evaluate every N steps and save a checkpoint carrying it
    # metrics_every: int = 10  -> a metrics event every N steps (or every 10 s)
    # figure_names: tuple[str, ...] -> sums a step returns in `StepResult.figures`, summed over the
    #   ranks and over the steps since the last metrics event
    # step_figures(figures) -> None: every rank, after each step, with its summed figures (may raise)
    # metrics(figures) -> dict: what the summed figures add to a metrics event


@dataclass
class Progress:
    epoch: int = 0
    batch: int = 0  # index of the next batch within the epoch
    step: int = 0
    seconds: float = 0.0  # wall time of earlier sessions (before a pause or a lost worker)
    trained_tokens: int = 0
    epoch_loss_sum: float = 0.0
    epoch_loss_count: int = 0
    train_loss: float | None = None  # mean loss of the last finished epoch
    evaluated_before: bool = False
    eval_loss_before: float | None = None
    extra: dict = field(default_factory=dict)  # recipe state that must survive a resume (DPO reference log-probs)


def out_of_time(job: TrainJob, trained_s: float) -> bool:
    """The job's time limit: `time_limit_s` of training in this session and its earlier ones, and
    the controller's deadline, which also counts model load, tokenization and evals."""
    return trained_s > job.time_limit_s or (job.deadline is not None and time.time() > job.deadline)


def time_limit_error(job: TrainJob, where: str) -> TrainingError:
    return TrainingError("time_limit_exceeded", f"Training did not finish within {job.time_limit_s:.0f} s{where}.")


STOPS = (None, "lost", "cancel", "pause", "time")  # what the leader broadcasts before each step


def learning_rate(step: int, total_steps: int, peak: float) -> float:
    warmup = max(1, round(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (total_steps - step) / max(1, total_steps - warmup)


class TrainLoop:
    def __init__(
        self,
        job: TrainJob,
        reporter: Reporter,
        model: torch.nn.Module,
        store,
        on_checkpoint: Callable[[str | None], None] | None = None,
        group: Group = SINGLE,
    ):
        self.job, self.reporter, self.model, self.store, self.group = job, reporter, model, store, group
        self.params = trainable_parameters(model)
        self.optimizer = torch.optim.AdamW(self.params, lr=job.learning_rate, weight_decay=0.0)
        self.on_checkpoint = on_checkpoint
        self.progress = Progress()

    def restore(self) -> bool:
        """Load the latest checkpoint when the job resumes; True if one was loaded."""
        if not self.job.resume:
            return False
        key = latest_checkpoint(self.store, self.job.checkpoint_prefix)
        if key is None:
            raise TrainingError("training_failed", "The job resumes but has no complete checkpoint to resume from.")
        ckpt = load_checkpoint(self.store, key)
        load_adapter_weights(self.model, ckpt.adapter)
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.progress = Progress(**ckpt.progress)
        restore_rng(ckpt.rng)
        # Said at every run that starts from a checkpoint (a resumed pause, a requeued lost run, a
        # restarted worker): the metrics that follow step back to it. `checkpoint` is the suffix of
        # the checkpoint's `fine_tuned_model_checkpoint` (GET .../checkpoints), never a store key.
        step = self.progress.step
        self.reporter.event(
            f"Resumed from the checkpoint at step {step}.",
            data={"step": step, "epoch": self.progress.epoch, "checkpoint": f"ckpt-step-{step}"},
        )
        return True

    def check_time(self, trained_s: float, where: str) -> None:
        """The time limit on the leader's clock, raised on every rank."""
        if self.group.from_rank0(int(self.group.leader and out_of_time(self.job, trained_s))):
            raise time_limit_error(self.job, where)

    def stop_reason(self, trained_s: float, where: str) -> str | None:
        """The leader's control poll (None, lost, cancel, pause), then its time check, as every rank's answer."""
        stop = None
        if self.group.leader:
            stop = self.reporter.control() or ("time" if out_of_time(self.job, trained_s) else None)
        stop = STOPS[self.group.from_rank0(STOPS.index(stop))]
        if stop == "time":
            raise time_limit_error(self.job, where)
        return stop

    def evaluate(self, steps: Steps) -> float | None:
        """The eval loss over every rank's shard; None when there is nothing to evaluate."""
        total, count = self.group.sum(list(steps.evaluate(self.group.shard)))
        return total / count if count else None

    def checkpoint(self, evaluated: dict | None = None) -> str | None:
        """Rank 0 stores the checkpoint; every rank reports to Ray Train (its report is collective).
        `evaluated`: the eval figure measured at this step, kept on the checkpoint's event (its metrics)."""
        if not self.group.leader:
            if self.on_checkpoint is not None:
                self.on_checkpoint(None)
            return None
        p = self.progress
        adapter = adapter_files(self.model, get_base(self.job.base_id))  # peft's files: a checkpoint is a model
        key = save_checkpoint(self.store, self.job.checkpoint_prefix, p.step, adapter, self.optimizer.state_dict(), asdict(p))
        if self.on_checkpoint is not None:
            self.on_checkpoint(key)
        # The job's checkpoints endpoint lists these events (one per epoch end and pause); the event
        # comes last, once the checkpoint is stored and Ray Train has its pointer.
        self.reporter.event(
            f"Checkpoint saved at step {p.step}.",
            data={"checkpoint": {"step": p.step, "epoch": p.epoch, "train_loss": p.train_loss, **(evaluated or {})}},
        )
        prune_checkpoints(self.store, self.job.checkpoint_prefix)  # after the event: see save_checkpoint
        return key

    def run(self, steps: Steps) -> TrainOutcome | None:
        """Train to the end (None) or stop early with a paused or cancelled outcome."""
        job, p = self.job, self.progress
        self.check_time(p.seconds, " (before the first eval)")
        if not p.evaluated_before:
            p.eval_loss_before, p.evaluated_before = self.evaluate(steps), True
        total_steps = sum(len(steps.epoch_batches(e)) for e in range(job.n_epochs))
        started, session_tokens = time.monotonic(), 0  # since the last epoch end or the start of this session
        clock, window_sum, window_count = MetricsClock(getattr(steps, "metrics_every", 10)), 0.0, 0
        names, eval_interval = getattr(steps, "figure_names", ()), getattr(steps, "eval_interval", None)
        evaluated = None
        window_figures = dict.fromkeys(names, 0.0)
        self.model.train()
        while p.epoch < job.n_epochs:
            batches = steps.epoch_batches(p.epoch)
            while p.batch < len(batches):
                control = self.stop_reason(p.seconds + time.monotonic() - started, f" (step {p.step} of {total_steps})")
                if control == "lost":  # another run owns the job now: stop and write nothing
                    return TrainOutcome("cancelled")
                if control == "cancel":
                    self.reporter.event(f"Training cancelled at step {p.step}.")
                    return TrainOutcome("cancelled")
                if control == "pause":
                    p.seconds += time.monotonic() - started
                    self.checkpoint()
                    self.reporter.event(f"Training paused at step {p.step}; checkpoint saved.", data={"step": p.step})
                    return TrainOutcome("paused")
                lr = learning_rate(p.step, total_steps, job.learning_rate)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                loss_sum, loss_count, tokens, row_tokens, figures = self.step(steps, batches[p.batch])
                if names:
                    steps.step_figures(figures)
                    window_figures = {n: window_figures[n] + figures[n] for n in names}
                torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                p.step, p.batch = p.step + 1, p.batch + 1
                p.trained_tokens += row_tokens
                p.epoch_loss_sum += loss_sum
                p.epoch_loss_count += loss_count
                window_sum, window_count = window_sum + loss_sum, window_count + loss_count
                session_tokens += tokens
                if clock.due(p.step, total_steps):
                    session = time.monotonic() - started
                    self.reporter.metrics({
                        "step": p.step,
                        "total_steps": total_steps,
                        "train_loss": window_sum / max(window_count, 1),
                        "learning_rate": lr,
                        "tokens_per_second": session_tokens / max(session, 1e-9),
                        "elapsed": p.seconds + session,
                        **(steps.metrics(window_figures) if names else {}),
                    })
                    window_sum, window_count = 0.0, 0
                    window_figures = dict.fromkeys(names, 0.0)
                evaluated = None
                if eval_interval and p.step % eval_interval == 0:
                    # Its sampling draws from seeded generators of its own: the training RNG is untouched.
                    evaluated = {f"valid_{getattr(steps, 'eval_name', 'loss')}": self.evaluate(steps)}
                    if p.batch < len(batches):  # else the epoch-end checkpoint below carries it
                        self.checkpoint(evaluated)
            p.train_loss = p.epoch_loss_sum / max(p.epoch_loss_count, 1)
            p.epoch, p.batch, p.epoch_loss_sum, p.epoch_loss_count = p.epoch + 1, 0, 0.0, 0
            now = time.monotonic()
            p.seconds, started = p.seconds + now - started, now
            session_tokens = 0
            self.checkpoint(evaluated)
        return None

    def step(self, steps: Steps, batch: list[int]) -> tuple[float, int, int, int, dict[str, float]]:
        """Backward over this rank's slice of `batch`, the gradients summed over the ranks; returns
        the whole batch's (loss sum, loss count, tokens, row tokens, figures), summed over the ranks."""
        rows = self.group.shard(batch)
        local = steps.train_step(rows) if rows else None
        names = getattr(steps, "figure_names", ())
        figures = [local.loss_sum.item(), local.loss_count, local.tokens, local.row_tokens] if local else [0.0, 0, 0, 0]
        figures += [local.figures.get(n, 0.0) if local else 0.0 for n in names]
        summed = self.group.sum(figures)
        loss_sum, count, tokens, row_tokens = summed[:4]
        if local is not None and count:
            (local.loss_sum / count).backward()
        self.group.sum_gradients(self.params)
        return loss_sum, int(count), int(tokens), int(row_tokens), dict(zip(names, summed[4:]))

    def result(self, eval_loss: float | None, eval_rows: int, eval_name: str = "loss") -> dict:
        """The gridline.result figures. `trained_tokens`: every token of every trained row (prompt and
        answer; for DPO the prompt and both answers; for RFT every sampled sequence), once per epoch
        the row was trained in. `eval_name`: what eval measures (`loss`, or RFT's mean `reward`)."""
        p = self.progress
        return {
            f"eval_{eval_name}_before": p.eval_loss_before,
            f"eval_{eval_name}": eval_loss,
            "eval_rows": eval_rows if eval_loss is not None else 0,
            "eval_source": self.job.eval_source,
            "train_loss": p.train_loss,
            "steps": p.step,
            "seconds": round(p.seconds, 3),
            "trained_tokens": p.trained_tokens,
        }


def run_recipe(
    job: TrainJob,
    reporter,
    make_steps: Callable[[torch.nn.Module, torch.device, int], Steps],
    opening: str,
    train_rows: int,
    eval_rows: int,
    on_checkpoint: Callable[[str | None], None] | None = None,
    group: Group = SINGLE,
) -> TrainOutcome:
    """setup (base + adapter, the loop, a resumed checkpoint), `Steps.prepare`, train, then eval
    and save the adapter under `job.output_prefix` (rank 0). `opening` is the first event's message.
    `reporter` is rank 0's; the other ranks get one that says nothing (train/progress.py Silent)."""
    base = get_base(job.base_id)
    store = open_object_store(*job.store_spec)
    device = pick_device(job)
    model = build_model(job, base, device)
    if job.init_adapter_prefix is not None:  # a resume below replaces these with the checkpoint's
        load_adapter_weights(model, read_adapter_weights(store.get_bytes(job.init_adapter_prefix + ADAPTER_WEIGHTS)))
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    steps = make_steps(model, device, pad_id)
    loop = TrainLoop(job, reporter, model, store, on_checkpoint, group)
    loop.restore()
    reporter.event(opening, data={"train_rows": train_rows, "eval_rows": eval_rows, "device": device.type})
    steps.prepare(loop.progress)

    stopped = loop.run(steps)
    if stopped is not None:
        return stopped

    loop.check_time(loop.progress.seconds, " (before the last eval)")
    eval_loss = loop.evaluate(steps)
    if group.leader:
        for name, data in adapter_files(model, base).items():
            store.put_bytes(job.output_prefix + name, data)
    return TrainOutcome("succeeded", loop.result(eval_loss, eval_rows, getattr(steps, "eval_name", "loss")))
