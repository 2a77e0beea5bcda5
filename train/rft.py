"""Reinforcement fine-tuning (RFT) with a LoRA or QLoRA adapter and OpenAI's graders: the recipe,
top to bottom.

Where it sits: like train/sft.py and train/dpo.py, called by the Ray Train worker
(train/launcher.py) with tokenized prompt rows (`prompt_ids`, and `item`: the row as JSON, which the
grader reads as `{{item.*}}`), on the shared loop (train/loop.py: schedule, pause, resume,
checkpoints, data parallelism).

The objective is Dr. GRPO's ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et
al. 2025, arXiv:2503.20783, section 3.2), GRPO (Shao et al. 2024, arXiv:2402.03300, section 4.1)
with its two biases removed, plus GRPO's KL penalty:

    loss = sum over the batch's samples i and their completion tokens t of
           [ -A_i * ratio_i,t  +  beta * KL_i,t ]  /  (samples x max_completion_tokens)
    A_i = r_i - mean(r_j of the same prompt's group)            (no division by the group's std)
    ratio_i,t = pi(y_i,t | ...) / pi_old(y_i,t | ...)          (= 1 in value: see "one update")
    KL_i,t = exp(ref - logp) - (ref - logp) - 1                  (GRPO's eq. 4, the k3 estimator)

Each choice:
- Group-relative advantage without the std: Dr. GRPO shows the division weights prompts whose
  samples barely differ most (question-level difficulty bias). A group whose rewards are all equal
  gives every sample A = 0: no signal, counted as `zero_variance_groups`.
- The constant normaliser (samples x `max_completion_tokens`, summed over the ranks by the loop)
  instead of each sequence's length: the length bias Dr. GRPO removes (a long wrong answer is not
  punished less per token than a short one).
- One update per batch of samples (on-policy, as GRPO's "mu = 1"): pi_old is the policy that
  sampled, so the ratio is exp(logp - logp.detach()) = 1 and PPO's clip never acts; it is written
  out so the gradient is GRPO's. No value model, no reward model: graders score.
- The KL reference is the policy the job starts from: the base with the adapter disabled (as DPO's
  reference), or, for a job that continues from an ft: model (jobs/lineage.py), that model's
  adapter, swapped in for the reference forward. beta 0 drops the term (as Dr. GRPO and DAPO do).

setup  -> base + adapter (train/lora.py; the parent's weights when there is one), the loop; the
          generation engine over the same in-memory model (pipelines/generate.py TransformersEngine,
          the adapter being trained loaded as "policy": no weight sync across processes, since the
          sampler and the trainer are one model; its LoRA layers are stacked for generation,
          pipelines/lora_stack.py, and restacked from the trained weights before every
          generation); the grader (graders/) and its runtime: python graders in
          the sandbox, a process each, off the training process; model graders answered by this
          engine with the adapter off when they name the job's base, else by the batch engine in a
          Ray task per base, as evals answer them
step   -> for each of this rank's prompts (the loop splits the batch's prompts across ranks; a
          prompt's whole group stays on its rank, so advantages use the whole group),
          `samples_per_prompt` completions sampled at the job's `temperature` (1 by default), each seeded from (job seed,
          epoch, line, sample): a run is reproducible on one machine and a resumed run draws what
          the uninterrupted one would; graded; a grade that fails is 0 and counted (a multi grade
          only when nothing scored: one failed grader is a 0 inside its formula); a step where
          every sample's grade failed fails the job (`grader_failed`); reference and policy
          log-probs of each completion (prompt as context, the completion's tokens up to and
          including its end-of-turn token trained); the loss above
thinking -> on a base whose template has a thinking switch (qwen3), reasoning_effort medium / high
          renders the prompts with it on (low and default leave them as every job renders them, off),
          and the grader reads the answer after the reasoning's `</think>`
eval   -> mean reward of `eval_samples` completions per validation prompt (the validation file, or
          the training file's holdout), sampled with seeds fixed per (line, sample), so before and
          after compare the same draws' seeds; before the first step, every `eval_interval` steps
          (on the checkpoint saved then) and after the last: `gridline.result` eval_reward_before /
          eval_reward
save   -> as SFT: adapter_model.safetensors + adapter_config.json under output_prefix

Not vLLM, on GPUs either: the CUDA vLLM needs its own torch (2.14 against the trainer's pinned
2.13), so it cannot sample inside this process; it would be a second process holding a second copy
of the base on the GPU, with each step's adapter written out and hot-loaded (vLLM's
`load_lora_adapter`). That is the batch engine's arrangement (pipelines/_vllm_engine.py, its own
venv), and `pipelines/engine.py`'s contract is the seam; it is not built because no GPU has been
lent to measure whether faster sampling pays for the second copy and the per-step reload against
this in-process engine.

Metrics per step: reward mean and std (and each grader's mean for multi), the KL to the reference
(mean per completion token), mean completion length, the fraction of groups with zero reward
variance, grader failures, completions per second. `trained_tokens`: every sampled sequence's
prompt and completion tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson
import torch

from catalog.bases import get_base
from catalog.model_source import load_tokenizer, parse_model_source
from graders import ModelAnswer, ModelRequest, Runtime, grade_many, sample_namespace, validate
from graders.models import MultiGrader
from openft.errors import InvalidRequest, TrainingError
from pipelines.engine import GenRequest, SamplingParams
from pipelines.generate import TransformersEngine, render_prompt
from pipelines.model_grading import GradingMember, answer_by_base
from pipelines.render import THINK_CLOSE
from pipelines.tokenize import IGNORE_INDEX
from storage.objects import open_object_store
from train.config import Reinforcement, TrainJob, TrainOutcome
from train.data import length_grouped_batches, pad_batch
from train.loop import StepResult, run_recipe
from train.lora import ADAPTER_WEIGHTS, adapter_state, autocast, load_adapter_state, load_adapter_weights, read_adapter_weights
from train.losses import label_logprobs
from train.parallel import SINGLE, Group
from train.progress import Reporter

METHOD_TYPE = "reinforcement"
POLICY = "policy"  # the engine's name for the adapter being trained
_FIGURES = ("samples", "reward_sum", "reward_sq_sum", "failures", "kl_sum", "completion_tokens", "groups",
            "flat_groups", "seconds")


def _seed(*parts: object) -> int:
    """A stable 63-bit seed from the parts (Python's hash() of a str changes between processes)."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 1


def _failed(grade) -> bool:
    """A grade that had no score: its grader failed (0, counted). A multi grade whose formula still
    scored above 0 although one of its graders failed is a grade (that grader's 0 is in it)."""
    return bool(grade.details.get("errors")) and grade.score == 0


class RFTSteps:
    eval_name = "reward"
    metrics_every = 1

    def __init__(self, job: TrainJob, model, device: torch.device, pad_id: int, train_rows: list[dict],
                 eval_rows: list[dict], group: Group):
        self.job, self.model, self.device, self.pad_id, self.group = job, model, device, pad_id, group
        self.cfg: Reinforcement = job.reinforcement
        self.base = get_base(job.base_id)
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.items = [orjson.loads(r["item"]) for r in train_rows]
        self.eval_items = [orjson.loads(r["item"]) for r in eval_rows]
        self.tokenizer = load_tokenizer(self.base, parse_model_source(job.model_source), Path(job.cache_root))
        self.engine = TransformersEngine(model, self.tokenizer, self.base, max_batch_rows=64,
                                         aliases={POLICY: model.active_adapter}, stack_adapters=True)
        self.grader = validate(self.cfg.grader, "grader")
        self.runtime = Runtime(model_call=self._model_call, sandbox=self.cfg.sandbox)
        self.grader_names = tuple(self.grader.graders) if isinstance(self.grader, MultiGrader) else ()
        self.figure_names = _FIGURES + tuple(f"grader:{n}" for n in self.grader_names)
        self.eval_interval = self.cfg.eval_interval
        self.reference_weights = None  # the parent's adapter, when the job continues from one
        self.epoch = 0
        if self.cfg.enable_thinking:  # reasoning_effort medium / high on a template with a thinking switch
            for rows, items in ((self.train_rows, self.items), (self.eval_rows, self.eval_items)):
                for row, item in zip(rows, items):
                    row["prompt_ids"] = self._thinking_prompt(item["messages"])

    # -- the loop's hooks --------------------------------------------------------------------------
    def prepare(self, progress) -> None:
        if self.job.init_adapter_prefix is not None:
            store = open_object_store(*self.job.store_spec)
            self.reference_weights = read_adapter_weights(store.get_bytes(self.job.init_adapter_prefix + ADAPTER_WEIGHTS))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        # The loop asks for every epoch's batches to count its steps, then for each epoch again just
        # before training it: the last call names the epoch whose steps follow (sampling seeds use it).
        self.epoch = epoch
        return length_grouped_batches([len(r["prompt_ids"]) for r in self.train_rows], self.job.batch_size,
                                      self.job.seed, epoch)

    def train_step(self, batch: list[int]) -> StepResult:
        started = time.monotonic()
        k = self.cfg.samples_per_prompt
        rows = [self.train_rows[i] for i in batch]
        samples = self._sample(rows, k, lambda row, j: _seed(self.job.seed, "train", self.epoch, row["line"], j))
        pairs = [(sample_namespace(self._graded_text(samples[a * k + j].text)), self.items[i])
                 for a, i in enumerate(batch) for j in range(k)]
        grades = grade_many(self.grader, pairs, self.runtime)
        rewards = torch.tensor([g.score for g in grades], dtype=torch.float64).view(len(rows), k)
        advantages = rewards - rewards.mean(dim=1, keepdim=True)  # Dr. GRPO: no division by the group's std
        sequences, labels, sample_advantages = [], [], []
        for i, row in enumerate(rows):
            for j in range(k):
                completion = list(samples[i * k + j].token_ids)
                sequences.append(row["prompt_ids"] + completion)
                labels.append([IGNORE_INDEX] * len(row["prompt_ids"]) + completion)
                sample_advantages.append(float(advantages[i, j]))
        loss_sum, kl_sum = self._loss(sequences, labels, torch.tensor(sample_advantages, device=self.device))
        completion_tokens = sum(len(s.token_ids) for s in samples)
        tokens = completion_tokens + k * sum(len(r["prompt_ids"]) for r in rows)
        figures = {
            "samples": len(grades), "reward_sum": float(rewards.sum()), "reward_sq_sum": float((rewards ** 2).sum()),
            "failures": sum(1 for g in grades if _failed(g)), "kl_sum": kl_sum,
            "completion_tokens": completion_tokens, "groups": len(rows),
            "flat_groups": int((rewards.max(dim=1).values == rewards.min(dim=1).values).sum()),
            "seconds": time.monotonic() - started,
        }
        for name in self.grader_names:
            figures[f"grader:{name}"] = sum(float(g.details.get("sub_scores", {}).get(name, 0.0)) for g in grades)
        return StepResult(loss_sum, len(grades) * self.cfg.max_completion_tokens, tokens, tokens, figures)

    def step_figures(self, figures: dict[str, float]) -> None:
        if figures["samples"] and figures["failures"] == figures["samples"]:
            raise TrainingError("grader_failed", f"The grader failed on every one of the step's {int(figures['samples'])} "
                                                 "samples; check the grader with POST /v1/fine_tuning/alpha/graders/run.")

    def metrics(self, f: dict[str, float]) -> dict:
        n = max(f["samples"], 1)
        mean = f["reward_sum"] / n
        out = {
            "reward_mean": mean, "reward_std": max(f["reward_sq_sum"] / n - mean * mean, 0.0) ** 0.5,
            "kl": f["kl_sum"] / max(f["completion_tokens"], 1), "completion_length": f["completion_tokens"] / n,
            "zero_variance_groups": f["flat_groups"] / max(f["groups"], 1), "grader_failures": int(f["failures"]),
            "completions_per_second": f["samples"] / max(f["seconds"] / max(self.group.size, 1), 1e-9),
        }
        if self.grader_names:
            out["grader_rewards"] = {name: f[f"grader:{name}"] / n for name in self.grader_names}
        return out

    @torch.no_grad()
    def evaluate(self, shard: Callable[[list[int]], list[int]]) -> tuple[float, int]:
        """(summed reward, samples) of this rank's share of the validation prompts."""
        mine = shard(list(range(len(self.eval_rows))))
        if not mine:
            return 0.0, 0
        n = self.cfg.eval_samples
        rows = [self.eval_rows[i] for i in mine]
        samples = self._sample(rows, n, lambda row, j: _seed(self.job.seed, "eval", row["line"], j))
        pairs = [(sample_namespace(self._graded_text(samples[a * n + j].text)), self.eval_items[i])
                 for a, i in enumerate(mine) for j in range(n)]
        return sum(g.score for g in grade_many(self.grader, pairs, self.runtime)), len(pairs)

    # -- sampling, the reference, the loss --------------------------------------------------------
    def _thinking_prompt(self, messages: list[dict]) -> list[int]:
        """The prompt with the template's thinking switch on (the tokenizer stage renders it off, as
        every other job's prompts): the completion then opens with the model's reasoning."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _graded_text(self, text: str) -> str:
        """What the grader reads as sample.output_text: with thinking on, the answer after the
        reasoning (OpenAI grades the final answer, not the reasoning)."""
        if self.cfg.enable_thinking and THINK_CLOSE in text:
            return text.rsplit(THINK_CLOSE, 1)[1].lstrip("\n")
        return text

    def _sample(self, rows: list[dict], k: int, seed: Callable[[dict, int], int]):
        """k completions per row from the current policy, in row order, each seeded by `seed(row, j)`."""
        requests = []
        for i, row in enumerate(rows):
            room = min(self.cfg.max_completion_tokens, self.job.max_seq_length - len(row["prompt_ids"]))
            for j in range(k):
                params = SamplingParams(max_tokens=max(room, 1), temperature=self.cfg.temperature, seed=seed(row, j))
                requests.append(GenRequest(i * k + j, POLICY, tuple(row["prompt_ids"]), params))
        self.engine.adapter_weights_changed()  # trained since the last generation (or a checkpoint loaded)
        return self.engine.generate(requests)

    @contextlib.contextmanager
    def _reference(self):
        if self.reference_weights is None:
            with self.model.disable_adapter():
                yield
            return
        current = adapter_state(self.model)
        load_adapter_weights(self.model, self.reference_weights)
        try:
            yield
        finally:
            load_adapter_state(self.model, current)

    def _loss(self, sequences: list[list[int]], labels: list[list[int]], advantages: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(the batch's summed per-token loss, its summed KL) over every completion token; see the docstring."""
        batch = {k: v.to(self.device) for k, v in pad_batch(sequences, labels, self.pad_id).items()}
        beta = self.job.beta or 0.0
        reference = None
        if beta:
            with torch.no_grad(), self._reference(), autocast(self.device):
                reference, _ = label_logprobs(self.model, batch)
        with autocast(self.device):
            logprobs, rows = label_logprobs(self.model, batch)
        logprobs = logprobs.float()
        ratio = torch.exp(logprobs - logprobs.detach())  # 1 in value; its gradient is the policy gradient
        per_token = -advantages[rows].float() * ratio
        kl_sum = 0.0
        if reference is not None:
            delta = reference.float() - logprobs
            kl = torch.exp(delta) - delta - 1
            per_token = per_token + beta * kl
            kl_sum = float(kl.detach().sum())
        return per_token.sum(), kl_sum

    def _model_call(self, requests: Sequence[ModelRequest]) -> list[ModelAnswer]:
        """Model graders' prompts: the job's own base in this engine (adapter off), other models on the
        batch engine in a Ray task per base (pipelines/model_grading.py), as evals answer them."""
        models = {m.name: m for m in self.cfg.grader_models}
        answers: list[ModelAnswer | None] = [None] * len(requests)
        local, remote = [], []
        for i, r in enumerate(requests):
            m = models.get(r.model)
            if m is None or (self.cfg.grading is None and (m.base_id, m.adapter_prefix) != (self.base.id, None)):
                answers[i] = ModelAnswer(None, error="The grading model was not available when the run started.")
            elif (m.base_id, m.adapter_prefix) == (self.base.id, None):
                local.append(i)
            else:
                remote.append(GradingMember(i, m.base_id, m.name, m.adapter_prefix, r))
        runnable = []
        for i in local:
            r = requests[i]
            try:
                ids = render_prompt(list(r.messages), self.tokenizer, self.base)
            except InvalidRequest as exc:
                answers[i] = ModelAnswer(None, error=f"The grader's prompt cannot be rendered ({exc.code}).")
                continue
            params = SamplingParams(max(1, min(r.max_tokens, self.base.max_seq_length - len(ids))), r.temperature,
                                    r.top_p, r.seed, answer=r.answer)
            runnable.append(GenRequest(i, None, tuple(ids), params))  # None: the base, the adapter off
        for result in self.engine.generate(runnable):
            answers[result.key] = ModelAnswer(result.text, result.prompt_tokens, result.completion_tokens)
        if remote:
            for i, answer in answer_by_base(self.cfg.grading, remote, f"{self.job.job_id} grader model").items():
                answers[i] = answer
        return answers  # type: ignore[return-value]


def train_rft(
    job: TrainJob,
    reporter: Reporter,
    train_rows: list[dict],
    eval_rows: list[dict],
    *,
    on_checkpoint: Callable[[str | None], None] | None = None,
    group: Group = SINGLE,
) -> TrainOutcome:
    """Train on `train_rows` (tokenized prompt rows), measure on `eval_rows`; see the module docstring.
    Under data parallelism every rank passes the same rows and its `group` (train/parallel.py)."""
    if job.method_type != METHOD_TYPE:
        raise ValueError("train_rft runs reinforcement jobs; supervised and DPO jobs have their own recipes")
    if not train_rows:
        raise TrainingError("context_too_long", "No prompt leaves room for a completion within max_seq_length.")
    cfg = job.reinforcement
    return run_recipe(
        job, reporter,
        lambda model, device, pad_id: RFTSteps(job, model, device, pad_id, train_rows, eval_rows, group),
        f"Training on {len(train_rows)} prompts for {job.n_epochs} epoch(s), {cfg.samples_per_prompt} samples per "
        f"prompt, evaluating on {len(eval_rows)} prompts ({job.eval_source}).",
        len(train_rows), len(eval_rows), on_checkpoint, group,
    )  # fmt: skip


# -- what the GPU readiness check (bench/_gpu_train.py stage_rft) and the tests run it on ------------
EXAMPLE_GRADER = {"type": "string_check", "name": "answer", "input": "{{sample.output_text}}",
                  "reference": "{{item.answer}}", "operation": "eq"}


def example_settings(**overrides) -> Reinforcement:
    fields = dict(grader=EXAMPLE_GRADER, samples_per_prompt=4, eval_interval=10, eval_samples=1,
                  max_completion_tokens=8)
    return Reinforcement(**{**fields, **overrides})


def example_rows(n: int, cache_root: str, base_id: str = "qwen2.5-0.5b-instruct", model_source: str = "standin") -> list[dict]:
    """`n` tokenized prompt rows of the demo's ticket task (the grader's answer: the label), as the
    tokenizer stage makes them."""
    from openft.demo_data import SYSTEM, ticket_splits
    from pipelines.tokenize import tokenize_prompt_row

    base = get_base(base_id)
    tokenizer = load_tokenizer(base, parse_model_source(model_source), Path(cache_root))
    train, _ = ticket_splits()
    rows = []
    for line in range(1, n + 1):
        ticket, label = train[(line - 1) % len(train)]
        row = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}], "answer": label}
        t = tokenize_prompt_row(row, tokenizer, base, 1024, line)
        rows.append({"line": t.line, "prompt_ids": t.prompt_ids, "item": t.item})
    return rows
