"""Where every object lives in the store: the one home of the key layout.

Every module that writes or deletes objects asks here for the key, so a layout change (or a
multi-tenant prefix) is one edit. Prefixes end in `/`; keys do not.

    files/<account>/<file id>                     uploads
    files/<account>/results-<job id>.csv          a job's results file
    files/<account>/distill-<id>/...              a distillation's output
    tokenized/<sha256>/<base>@<rev>/<method>-<n>/ tokenized shards, shared by every job on those bytes
    runs/<job id>/checkpoints/                    a job's checkpoints (every attempt)
    runs/<job id>/checkpoints/step-<8 digits>/    one checkpoint (its adapter is a model: jobs/model_names.py)
    runs/<job id>/adapter/                        its trained adapter
    runs/<job id>/parent/                         the adapter it continues from (a copy of its parent's)
    runs/<job id>/workers/<run name>              a run's Train worker has started (restart detection)
    runs/<job id>/train/<run name>/               Ray Train's own run state (its storage_path: storage/arrow.py)
    merges/<account>/<merge id>/                  a merged-weights export
    files/<account>/batch-<id>-output.jsonl       a batch's output file (and -errors.jsonl)
    batches/<batch id>/adapters/                  the adapter copies a batch staged (deleted when it ends)
    batches/<batch id>/shards/                    a batch's scratch shards
"""

from __future__ import annotations


def upload(account_id: str, file_id: str) -> str:
    return f"files/{account_id}/{file_id}"


def results_file(account_id: str, job_id: str) -> str:
    return f"files/{account_id}/results-{job_id}.csv"


def distill_output(account_id: str, distill_id: str) -> str:
    return f"files/{account_id}/distill-{distill_id}"


def tokenized_bytes(file_sha256: str) -> str:
    """Every tokenization of one file's bytes (what the reaper deletes together)."""
    return f"tokenized/{file_sha256}/"


def tokenized(file_sha256: str, base_id: str, revision: str, method: str, max_seq_length: int) -> str:
    return f"{tokenized_bytes(file_sha256)}{base_id}@{revision}/{method}-{max_seq_length}/"


def run(job_id: str) -> str:
    return f"runs/{job_id}/"


def checkpoints(job_id: str) -> str:
    return f"{run(job_id)}checkpoints/"


# The files under every adapter prefix (a run's adapter, a checkpoint, a batch's staged copy), in
# peft's layout: what registration records, downloads serve and engines load.
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def adapter(job_id: str) -> str:
    return f"{run(job_id)}adapter/"


def parent_adapter(job_id: str) -> str:
    """The copy of a job's parent adapter (jobs/lineage.py), which its runs start from."""
    return f"{run(job_id)}parent/"


def worker_mark(job_id: str, run_name: str) -> str:
    """Left by a run's Train worker when it starts: a restarted worker finds it and resumes."""
    return f"{run(job_id)}workers/{run_name}"


def train_runs(job_id: str) -> str:
    """Ray Train's storage for every run of the job: in the store, so every node reaches it and the
    job's other copies are deleted with it."""
    return f"{run(job_id)}train/"


def merge_export(account_id: str, merge_id: str) -> str:
    return f"merges/{account_id}/{merge_id}"


# -- checkpoints as models (issue 13) --
def checkpoint_dir(step: int) -> str:
    """One checkpoint's folder under a job's checkpoints prefix (zero-padded: sorted order is step order)."""
    return f"step-{step:08d}/"


CHECKPOINT_META = "meta.json"  # written last into a checkpoint's folder: without it the checkpoint is incomplete


def checkpoint(job_id: str, step: int) -> str:
    """A checkpoint's prefix: its peft-format adapter files, meta.json and (newest only) state.pt."""
    return f"{checkpoints(job_id)}{checkpoint_dir(step)}"


# -- batches (issue 13) --
def batch(batch_id: str) -> str:
    return f"batches/{batch_id}/"


def batch_stage(batch_id: str) -> str:
    """The copies of a batch's adapters: a model deleted while the batch runs keeps this copy until it ends."""
    return f"{batch(batch_id)}adapters/"


def batch_shards(batch_id: str) -> str:
    return f"{batch(batch_id)}shards/"


def batch_output(account_id: str, batch_id: str) -> str:
    return f"files/{account_id}/batch-{batch_id}-output.jsonl"


def batch_errors(account_id: str, batch_id: str) -> str:
    return f"files/{account_id}/batch-{batch_id}-errors.jsonl"


# -- eval runs (issue 25) --
def eval_run(account_id: str, run_id: str) -> str:
    """A run's objects, under its account: the items it grades and its generation's batch files."""
    return f"evals/{account_id}/{run_id}/"


def eval_run_items(account_id: str, run_id: str) -> str:
    """The run's items as JSONL ({"item", "sample"?} per line), copied at create from the file or the request."""
    return f"{eval_run(account_id, run_id)}items.jsonl"


def eval_run_generated(account_id: str, run_id: str) -> str:
    """What a completions run's generation writes (deleted once its samples are recorded)."""
    return f"{eval_run(account_id, run_id)}generation/"


def eval_run_generation(account_id: str, run_id: str, name: str) -> str:
    """A generation's batch files (`requests`, `output`, `errors`: pipelines/batch_ray.py's input and output)."""
    return f"{eval_run_generated(account_id, run_id)}{name}.jsonl"


def eval_run_shards(account_id: str, run_id: str) -> str:
    return f"{eval_run_generated(account_id, run_id)}shards/"
