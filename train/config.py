"""What one training run needs (`TrainJob`) and how it ends (`TrainOutcome`); how it fails is the
core's `TrainingError` (openft/errors.py), which tokenization raises too.

The job controller builds a `TrainJob` from the stored job and hands it to `train.launcher.run_training`;
Ray Train passes it to every worker as `train_loop_config`, so it is a frozen, picklable dataclass
holding only plain values (the store as its `spec()` tuple, the model source as its setting string).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from graders.sandbox import SandboxLimits
from pipelines.model_grading import GradingSetup
from openft.errors import TrainingError

METHOD_TYPES = ("supervised", "dpo", "reinforcement")
ADAPTERS = ("lora", "qlora")
DEVICES = ("auto", "cpu", "cuda")
EVAL_SOURCES = ("validation_file", "holdout")


@dataclass(frozen=True)
class GraderModel:
    """A model a reinforcement job's model grader names, resolved when the run starts (the trainer
    reads no database): answered in the trainer's own engine when it is the job's base, else by the
    batch engine in a Ray task per base (pipelines/model_grading.py), as evals answer them."""

    name: str
    base_id: str
    adapter_prefix: str | None  # an ft: model's or checkpoint's adapter files; None for a base


@dataclass(frozen=True)
class Reinforcement:
    """A reinforcement job's settings (jobs/reinforcement.py has their meaning)."""

    grader: dict  # graders.validate.record form
    samples_per_prompt: int
    eval_interval: int
    eval_samples: int
    max_completion_tokens: int
    temperature: float = 1.0  # of every sampled completion, training and validation
    enable_thinking: bool | None = None  # the template's thinking switch; None: the template's own default
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)  # python graders
    grader_models: tuple[GraderModel, ...] = ()
    grading: GradingSetup | None = None  # how grader models on other bases run; None: not at all


@dataclass(frozen=True)
class TrainJob:
    """Everything a run needs. Object-store keys are prefixes ending in `/`."""

    job_id: str
    run_name: str  # unique per attempt (job id + attempt): Ray Train V2 reloads a reused name's state
    base_id: str
    method_type: str  # supervised | dpo
    adapter: str  # lora | qlora
    n_epochs: int
    batch_size: int
    learning_rate: float  # already resolved from the multiplier
    lora_rank: int
    lora_alpha: int
    max_seq_length: int
    beta: float | None  # DPO's beta; reinforcement's KL coefficient (0: no KL term)
    seed: int
    model_source: str  # the `model_source` setting: hub | dir:/path | standin
    cache_root: str  # where hub downloads and stand-ins are cached
    store_spec: tuple  # ObjectStore.spec()
    train_prefix: str  # tokenized training rows (TokenizedRef.prefix)
    eval_prefix: str | None  # tokenized validation rows; None: hold out rows of the training file
    eval_source: str  # validation_file | holdout
    output_prefix: str  # adapter_model.safetensors and adapter_config.json go here
    checkpoint_prefix: str  # epoch-end and pause checkpoints go here
    resume: bool  # continue from the latest checkpoint under checkpoint_prefix
    device: str = "auto"  # auto: cuda when available
    time_limit_s: float = 7200
    # Wall-clock time (unix seconds) by which the job's time limit runs out, counted by the controller
    # from the run's start (model load, tokenization and evals included) over every attempt; None: no
    # deadline beyond `time_limit_s` of training.
    deadline: float | None = None
    # The workers read the tokenized rows through Ray Data datasets given to Ray Train (large files),
    # or straight from the store (pipelines/tokenize.py `read_tokenized`: small files, no Ray Data job).
    ray_data_reads: bool = True
    # The store prefix of the adapter a job continues from (jobs/lineage.py: its parent's, copied at
    # create); None: a fresh adapter (lora_B = 0, the identity).
    init_adapter_prefix: str | None = None
    reinforcement: Reinforcement | None = None  # reinforcement jobs only

    def __post_init__(self) -> None:
        if self.method_type not in METHOD_TYPES:
            raise ValueError(f"method_type must be one of {METHOD_TYPES}, not {self.method_type!r}")
        if self.adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {ADAPTERS}, not {self.adapter!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {self.device!r}")
        if self.eval_source not in EVAL_SOURCES:
            raise ValueError(f"eval_source must be one of {EVAL_SOURCES}, not {self.eval_source!r}")
        if (self.eval_source == "validation_file") != (self.eval_prefix is not None):
            raise ValueError("eval_prefix is given exactly when eval_source is validation_file")
        if self.method_type == "dpo" and not (self.beta and self.beta > 0):
            raise ValueError("a DPO job needs beta > 0")
        if (self.method_type == "reinforcement") != (self.reinforcement is not None):
            raise ValueError("reinforcement settings are given exactly for a reinforcement job")
        for name in ("train_prefix", "output_prefix", "checkpoint_prefix"):
            if not getattr(self, name).endswith("/"):
                raise ValueError(f"{name} must end with '/'")
        if min(self.n_epochs, self.batch_size, self.lora_rank, self.lora_alpha, self.max_seq_length) < 1:
            raise ValueError("n_epochs, batch_size, lora_rank, lora_alpha and max_seq_length must be at least 1")


@dataclass
class TrainOutcome:
    status: Literal["succeeded", "paused", "cancelled", "failed"]
    result: dict | None = None  # succeeded: the gridline.result figures (see train.sft.RESULT_KEYS)
    error: TrainingError | None = None  # failed only
