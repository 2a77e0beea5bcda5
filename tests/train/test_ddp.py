"""Data-parallel training (train/parallel.py) through real Ray Train on the session cluster: the
same SFT job on 1 and on 2 workers (gloo on CPU) follows the same losses and ends with the same
adapter within float tolerance; a 2-worker run paused mid-epoch resumes to the uninterrupted
run's adapter; and a worker count the cluster can never place is refused when the settings load
or the service starts, not after a job has tokenized. The DPO recipe's weighting (over pairs) is
checked on two ranks of a plain gloo process group, which is quicker to start than Ray Train.

Tolerance: the two runs compute the same sums in a different order (each rank pads its slice to
its own longest row, and float32 matmuls over other shapes round differently; gloo adds the two
ranks' gradients), so they agree to float32 rounding, about 1e-6 relative per step, compounded
over the steps through AdamW. rtol 1e-4 / atol 1e-5 leaves room for that and is still far below
what a wrong weighting moves: averaging per-rank means instead of taking the global mean weighs
the tokens of a 2-row and a 1-row slice (the last batches) differently by a factor of about two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys

import pytest
import torch
from safetensors.torch import load as load_safetensors

from catalog.model_source import ModelSource
from openft.demo_data import ticket_splits, tickets_jsonl
from openft.settings import Settings
from pipelines.tokenize import build_tokenized
from tests.train.conftest import make_job
from tests.utils.ports import free_port
from tests.train.test_dpo import preference_jsonl
from train.data import length_grouped_batches, split_holdout
from train.dpo import train_dpo
from train.launcher import run_training
from train.parallel import Group
from train.progress import FileReporter, Silent

pytestmark = pytest.mark.usefixtures("ray_cluster")
RANKS_TIMEOUT_S = 600  # two processes importing torch and training on shared cores

FILE_ROWS = 22  # 1 held out for eval, 21 trained: batches of 4, and one of a single row (rank 1 trains nothing)
WORKER = {"CPU": 0.5}  # two workers take one of the session cluster's 2 CPUs; Ray Data's reads keep the other
RTOL, ATOL = 1e-4, 1e-5


class PauseAt(FileReporter):
    """Asks for a pause at its `at`-th control poll (only rank 0 polls)."""

    def __init__(self, log_path, at: int):
        super().__init__(log_path)
        self.at, self.polls = at, 0

    def control(self):
        self.polls += 1
        return "pause" if self.polls == self.at else None


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, cache_root):
    from storage.objects import open_object_store

    store = open_object_store(f"file://{tmp_path_factory.mktemp('ddp') / 'objects'}")
    data = tickets_jsonl(ticket_splits()[0][:FILE_ROWS])
    store.put_bytes("files/ddp/file-1", data)
    ref = build_tokenized(store.spec(), "files/ddp/file-1", hashlib.sha256(data).hexdigest(), "qwen2.5-0.5b-instruct",
                          ModelSource("standin"), cache_root, 128, "supervised")
    return store, ref


def _job(store, ref, cache_root, name: str, **overrides):
    return make_job(store, cache_root, job_id=f"ftjob-{name}", run_name=f"ftjob-{name}-1", n_epochs=2, batch_size=4,
                    max_seq_length=128, train_prefix=ref.prefix, output_prefix=f"adapters/{name}/",
                    checkpoint_prefix=f"checkpoints/{name}/", **overrides)


def _train(job, log, workers: int, reporter=None):
    reporter = reporter or FileReporter(log)
    outcome = run_training(job, lambda: reporter, num_workers=workers, resources_per_worker=WORKER)
    assert outcome.status in ("succeeded", "paused"), outcome.error
    return outcome


def _adapter(store, job) -> dict[str, torch.Tensor]:
    return load_safetensors(store.get_bytes(job.output_prefix + "adapter_model.safetensors"))


def _losses(log) -> tuple[dict, list]:
    """(train loss of each metrics window by its steps, the checkpoints' per-epoch train losses)."""
    records = FileReporter(log).records()
    windows, last = {}, 0
    for r in records:
        if r["type"] == "metrics":
            windows[last, r["data"]["step"]] = r["data"]["train_loss"]
            last = r["data"]["step"]
    epochs = [r["data"]["checkpoint"]["train_loss"] for r in records if r["type"] == "event" and "checkpoint" in (r["data"] or {})]
    return windows, epochs


@pytest.fixture(scope="module")
def one_and_two(tokenized, cache_root, tmp_path_factory):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the reporters below travel to the workers
    store, ref = tokenized
    runs = {}
    for workers in (1, 2):
        tmp = tmp_path_factory.mktemp(f"w{workers}")
        job = _job(store, ref, cache_root, f"w{workers}")
        runs[workers] = (job, _train(job, tmp / "log.jsonl", workers), tmp / "log.jsonl")
    return store, runs


@pytest.mark.heavy  # two Ray Train runs: 95-150 s here
def test_two_workers_follow_one_worker(one_and_two):
    store, runs = one_and_two
    (job1, out1, log1), (job2, out2, log2) = runs[1], runs[2]
    batches = length_grouped_batches([0] * (FILE_ROWS - 1), 4, 0, 0)
    assert [len(b) for b in batches if len(b) < 4] == [1]  # the batch where rank 1's slice is empty
    assert [Group(r, 2, torch.device("cpu")).shard([7]) for r in (0, 1)] == [[7], []]

    r1, r2 = out1.result, out2.result
    assert (r1["steps"], r1["eval_rows"]) == (12, 1)
    assert (r2["steps"], r2["trained_tokens"], r2["eval_rows"]) == (r1["steps"], r1["trained_tokens"], r1["eval_rows"])
    for key in ("eval_loss_before", "eval_loss", "train_loss"):
        assert r2[key] == pytest.approx(r1[key], rel=RTOL, abs=ATOL), key
    (windows1, epochs1), (windows2, epochs2) = _losses(log1), _losses(log2)
    assert len(epochs1) == len(epochs2) == 2 and epochs2 == pytest.approx(epochs1, rel=RTOL, abs=ATOL)
    shared = windows1.keys() & windows2.keys()  # reports are due every 10 steps or 10 s: compare the same windows
    assert (0, 10) in shared or (10, 12) in shared or (0, 12) in shared
    assert [windows2[w] for w in sorted(shared)] == pytest.approx([windows1[w] for w in sorted(shared)], rel=RTOL, abs=ATOL)
    assert epochs1[1] < epochs1[0]  # it trained

    a1, a2 = _adapter(store, job1), _adapter(store, job2)
    assert a1.keys() == a2.keys()
    for name in a1:
        torch.testing.assert_close(a2[name], a1[name], rtol=RTOL, atol=ATOL)
    assert any(v.abs().max() > 10 * ATOL for k, v in a1.items() if "lora_B" in k)  # the comparison is not of zeros
    # Rank 0 alone wrote: one checkpoint per epoch, each announced once.
    assert sorted({k.rsplit("/", 2)[1] for k in store.list(job2.checkpoint_prefix)}) == ["step-00000006", "step-00000012"]
    events = [r["message"] for r in FileReporter(log2).records() if r["type"] == "event"]
    assert events.count("Checkpoint saved at step 12.") == 1 and sum(m.startswith("Training 21 rows") for m in events) == 1


@pytest.mark.heavy  # two more runs: 75-105 s here
def test_two_workers_resume_from_a_pause(one_and_two, tmp_path, cache_root):
    store, runs = one_and_two
    job2, out2, _ = runs[2]
    paused = dataclasses.replace(job2, job_id="ftjob-p", run_name="ftjob-p-1", output_prefix="adapters/p/",
                                 checkpoint_prefix="checkpoints/p/")
    stopped = _train(paused, tmp_path / "log.jsonl", 2, PauseAt(tmp_path / "log.jsonl", at=4))
    assert stopped.status == "paused" and not store.exists(paused.output_prefix + "adapter_model.safetensors")
    assert [k.rsplit("/", 2)[1] for k in store.list(paused.checkpoint_prefix)][0] == "step-00000003"

    resumed = _train(dataclasses.replace(paused, run_name="ftjob-p-2", resume=True), tmp_path / "log.jsonl", 2)

    assert resumed.status == "succeeded"
    assert {k: v for k, v in resumed.result.items() if k != "seconds"} == {k: v for k, v in out2.result.items() if k != "seconds"}
    first, again = _adapter(store, job2), _adapter(store, paused)
    assert all(torch.equal(first[k], again[k]) for k in first)  # all ranks resumed the same state, as one worker does
    events = [r["message"] for r in FileReporter(tmp_path / "log.jsonl").records() if r["type"] == "event"]
    assert events.count("Resumed from the checkpoint at step 3.") == 1


def test_a_worker_count_the_cluster_cannot_place_is_refused():
    import ray
    from pydantic import ValidationError

    from entrypoints.preflight import check_cluster
    from jobs.scheduling import placement_problem

    with pytest.raises(ValidationError) as info:
        Settings(train_num_workers=0)
    assert info.value.errors()[0]["loc"] == ("train_num_workers",)

    # The session cluster: one node of 2 CPUs. 2 workers of half a CPU fit beside train_data_cpus=1; 3 do not.
    assert check_cluster(Settings(train_num_workers=2, train_worker_resources=WORKER)) == []
    [problem] = check_cluster(Settings(train_num_workers=3, train_worker_resources=WORKER))
    assert problem.startswith("OPENFT_TRAIN_NUM_WORKERS: train_num_workers is 3") and "train_data_cpus" in problem
    [problem] = check_cluster(Settings(train_num_workers=2, train_worker_resources={"CPU": 0.5, "gpu_48gb": 1}))
    assert "this cluster's nodes hold 0 such worker(s)" in problem
    assert ray.is_initialized()

    # Per node, not in total: two nodes of one GPU each place two 1-GPU workers, not two 2-GPU ones.
    nodes = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}]
    gpu = dict(train_use_gpu=True, train_num_workers=2)
    assert placement_problem(Settings(**gpu, train_worker_resources={"CPU": 4}), nodes) is None
    problem = placement_problem(Settings(**gpu, train_worker_resources={"CPU": 4, "GPU": 2}), nodes)
    assert "nodes hold 0 such worker(s)" in problem


def _recipe_rank(method: str, rank: int, world: int, port: int, job, log, train_rows, eval_rows, results) -> None:
    import torch.distributed as dist

    from train.rft import train_rft

    recipe = {"dpo": train_dpo, "reinforcement": train_rft}[method]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        group = Group(rank, world, torch.device("cpu"))
        outcome = recipe(job, FileReporter(log) if group.leader else Silent(), train_rows, eval_rows, group=group)
        results.put((rank, outcome.status, outcome.result))
    finally:
        dist.destroy_process_group()


def _on_two_ranks(job, log, train_rows, eval_rows) -> dict[int, tuple[str, dict]]:
    """The recipe of `job` on two ranks of a plain gloo process group: {rank: (status, result)}."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_recipe_rank, args=(job.method_type, r, 2, port, job, log, train_rows, eval_rows,
                                                        results)) for r in range(2)]
    for process in ranks:
        process.start()
    got = dict((rank, (status, result)) for rank, status, result in (results.get(timeout=RANKS_TIMEOUT_S) for _ in ranks))
    for process in ranks:
        process.join(RANKS_TIMEOUT_S)
        assert process.exitcode == 0
    return got


def test_dpo_on_two_ranks_matches_one(store, cache_root, base, tokenizer, tmp_path):
    from tests.train.conftest import tokenize

    file_rows = ticket_splits()[0][:FILE_ROWS]
    rows, _ = tokenize(preference_jsonl(file_rows), tokenizer, base, method="dpo", max_seq_length=128)
    train_rows, eval_rows = split_holdout(rows, len(file_rows), seed=0)
    one = make_job(store, cache_root, method_type="dpo", beta=0.5, n_epochs=2, batch_size=4, learning_rate=5e-3,
                   max_seq_length=128, output_prefix="adapters/one/", checkpoint_prefix="checkpoints/one/")
    two = dataclasses.replace(one, output_prefix="adapters/two/", checkpoint_prefix="checkpoints/two/")
    single = train_dpo(one, FileReporter(tmp_path / "one.jsonl"), train_rows, eval_rows)
    got = _on_two_ranks(two, tmp_path / "two.jsonl", train_rows, eval_rows)

    assert got[0][0] == got[1][0] == "succeeded"
    r1, r2 = single.result, got[0][1]
    assert (r2["steps"], r2["trained_tokens"], r2["eval_rows"]) == (r1["steps"], r1["trained_tokens"], r1["eval_rows"]) == (
        12, r1["trained_tokens"], 1)
    for key in ("eval_loss_before", "eval_loss", "train_loss"):
        assert r2[key] == pytest.approx(r1[key], rel=RTOL, abs=ATOL), key
    assert r1["train_loss"] < 0.69  # it trained (ln 2 at the start)
    a1, a2 = _adapter(store, one), _adapter(store, two)
    for name in a1:
        torch.testing.assert_close(a2[name], a1[name], rtol=RTOL, atol=ATOL)
    assert any(v.abs().max() > 10 * ATOL for k, v in a1.items() if "lora_B" in k)


def test_rft_on_two_ranks_matches_one(store, cache_root, base, tokenizer, ticket_rows, tmp_path):
    """Reinforcement (train/rft.py): each rank samples and grades its share of a step's prompts with
    the same seeds one rank would use, whole groups per rank, and the loss is normalised over the
    whole batch; so two ranks follow one within the tolerance above (the engine decodes other
    batch shapes on each rank, which rounds the logits differently: a sampled token could differ
    only at a near-tie of the cumulative probabilities, at temperature 0.2 not met on these rows)."""
    from tests.train.conftest import tokenize
    from tests.train.test_rft import prompts_jsonl
    from train.rft import example_settings, train_rft
    from train.sft import train_sft

    parent = make_job(store, cache_root, n_epochs=3, output_prefix="adapters/parent/", checkpoint_prefix="ck/parent/")
    assert train_sft(parent, FileReporter(tmp_path / "sft.jsonl"), ticket_rows[:160], ticket_rows[160:164]).status == "succeeded"
    train_rows, _ = tokenize(prompts_jsonl(ticket_splits()[0][:8]), tokenizer, base, method="reinforcement")
    eval_rows, _ = tokenize(prompts_jsonl(ticket_splits()[1][:3]), tokenizer, base, method="reinforcement")
    one = make_job(store, cache_root, method_type="reinforcement", beta=0.04, n_epochs=1, batch_size=4, learning_rate=1e-3,
                   init_adapter_prefix="adapters/parent/", eval_source="validation_file", eval_prefix="v/",
                   output_prefix="adapters/rft-one/", checkpoint_prefix="checkpoints/rft-one/",
                   reinforcement=example_settings(samples_per_prompt=4, max_completion_tokens=3, temperature=0.2))
    two = dataclasses.replace(one, output_prefix="adapters/rft-two/", checkpoint_prefix="checkpoints/rft-two/")
    single = train_rft(one, FileReporter(tmp_path / "one.jsonl"), train_rows, eval_rows)
    got = _on_two_ranks(two, tmp_path / "two.jsonl", train_rows, eval_rows)

    assert got[0][0] == got[1][0] == "succeeded"
    r1, r2 = single.result, got[0][1]
    assert (r2["steps"], r2["trained_tokens"], r2["eval_rows"]) == (r1["steps"], r1["trained_tokens"], r1["eval_rows"])
    for key in ("eval_reward_before", "eval_reward", "train_loss"):
        assert r2[key] == pytest.approx(r1[key], rel=RTOL, abs=ATOL), key
    a1, a2 = _adapter(store, one), _adapter(store, two)
    for name in a1:
        torch.testing.assert_close(a2[name], a1[name], rtol=RTOL, atol=ATOL)
    assert any(not torch.equal(a1[k], v) for k, v in _adapter(store, parent).items())  # it trained
