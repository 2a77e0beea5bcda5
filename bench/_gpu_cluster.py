"""The GPU check's collective and Ray Data stages.

nccl: two Ray Train workers sharing the one GPU would measure nothing (NCCL refuses two ranks on
one device), so NCCL runs as a smoke: a one-rank process group on the GPU, the all-reduce and the
broadcast that train/parallel.py's `Group` issues, on a tensor the size of the 7B adapter's
gradients. The two-rank part runs `Group` itself (shard, sum, from_rank0, sum_gradients) over
gloo in two processes, on any machine.

ray_data: bench/validate.py's and bench/distill.py's jobs with Ray Data capped at 1, 4 and 16
CPUs (the smoke: 1 and 2) on one local Ray of that many CPUs, each against its single-process
baseline in the same run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from bench._gpu_common import Ctx, skipped


def _gloo_rank(rank: int, init: str, numel: int, repeats: int, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from train.parallel import Group

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    group = Group(rank, 2, torch.device("cpu"))
    params = [torch.nn.Parameter(torch.zeros(numel // 2)), torch.nn.Parameter(torch.zeros(numel - numel // 2))]
    assert group.shard(list(range(7))) == ([0, 1, 2, 3] if rank == 0 else [4, 5, 6])
    assert group.sum([float(rank + 1), 1.0]) == [3.0, 2.0]
    assert group.from_rank0(10 + rank) == 10
    started = time.monotonic()
    for _ in range(repeats):
        for p in params:
            p.grad = torch.full_like(p, float(rank + 1))
        group.sum_gradients(params)
    seconds = (time.monotonic() - started) / repeats
    assert all(bool((p.grad == 3.0).all()) for p in params)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds_per_sum_gradients": seconds}))


def _nccl_one_rank(numel: int, repeats: int, init: str) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=init, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    flat = torch.ones(numel, device="cuda")
    dist.all_reduce(flat)  # the communicator's set-up
    torch.cuda.synchronize()
    started = time.monotonic()
    for _ in range(repeats):
        dist.all_reduce(flat)
    torch.cuda.synchronize()
    seconds = (time.monotonic() - started) / repeats
    value = torch.tensor([7], device="cuda")
    dist.broadcast(value, src=0)
    ok = bool((flat == 1.0).all()) and int(value.item()) == 7
    dist.destroy_process_group()
    return {"status": "ok" if ok else "failed", "ranks": 1, "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
            "bytes": numel * 4, "seconds_per_all_reduce": round(seconds, 6)}  # fmt: skip


def stage_nccl(ctx: Ctx) -> dict:
    import json

    import torch
    import torch.multiprocessing as mp

    from bench._gpu_train import lora_params

    numel = lora_params(ctx.figures("base")["config"]) if ctx.figures("base") else 1 << 20  # the adapter's gradients
    repeats = ctx.size["allreduce_repeats"]
    parts = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-dist-") as tmp:
        out = f"{tmp}/gloo.json"
        mp.spawn(_gloo_rank, args=(f"file://{tmp}/gloo-rendezvous", numel, repeats, out), nprocs=2, join=True)
        parts["gloo_two_ranks"] = {"status": "ok", "ranks": 2, "bytes": numel * 4, **json.loads(Path(out).read_text())}
        if torch.cuda.is_available():
            parts["nccl_one_rank"] = _nccl_one_rank(numel, repeats, f"file://{tmp}/nccl-rendezvous")
        else:
            parts["nccl_one_rank"] = skipped("no CUDA")
    if parts["nccl_one_rank"]["status"] == "failed":
        raise RuntimeError("NCCL's all-reduce or broadcast returned wrong values")
    return {"figures": {"gradient_numel": numel, "gpus": torch.cuda.device_count(),
                        "note": "one GPU: NCCL ran with one rank; two ranks on one device are refused by NCCL, so the "
                                "two-worker job is not measured here"}, "parts": parts}  # fmt: skip


def stage_ray_data(ctx: Ctx) -> dict:
    if (why := ctx.ready("ray")) is not None:
        raise RuntimeError(why)
    # bench/validate.py prepares Ray's environment (token auth under its own directory) at import.
    import bench.validate as validate_bench
    import ray

    from entrypoints.ray_runtime import start_ray
    from pipelines.distill import DistillOptions, distill_local
    from pipelines.distill_ray import build_distill
    from pipelines.validate import StreamingValidator
    from pipelines.validate_ray import build_validation
    from storage.objects import open_object_store
    from tests.factories import distill_files

    size = ctx.size
    caps = [c for c in size["ray_caps"] if c <= (os.cpu_count() or 1)] or [1]
    work = Path(tempfile.mkdtemp(prefix="ray-data-", dir=ctx.work))
    store = open_object_store((work / "objects").as_uri())
    data = validate_bench.make_file(size["validate_mib"] << 20, 7)
    store.put_bytes("files/validate", data)
    results, requests, _ = distill_files("openai", size["distill_results"], 7)
    store.put_bytes("files/results", results)
    store.put_bytes("files/requests", requests)
    mb, n, repeats = len(data) / 1e6, size["distill_results"], size["ray_repeats"]

    def inline():
        v = StreamingValidator("fine-tune")
        for i in range(0, len(data), 1 << 20):
            v.feed(data[i : i + (1 << 20)])
        return v.finish()

    inline_s, stats = validate_bench.best_of(repeats, inline)
    local_s, expected = validate_bench.best_of(
        repeats, lambda: distill_local(store.iter_chunks("files/results"), store.iter_chunks("files/requests"), DistillOptions()))
    start_ray(validate_bench.RAY_SETTINGS, dashboard=False, num_cpus=max(caps))
    figures = {"cpus": os.cpu_count(), "validate_bytes": len(data), "distill_results": n,
               "validate_single_process_mb_s": round(mb / inline_s, 1), "distill_single_process_rows_s": round(n / local_s),
               "caps": {}}  # fmt: skip
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        build_validation(store.spec(), "files/validate", "fine-tune")  # worker start-up and imports, not timed
        for cap in caps:
            # Jobs take the current DataContext when they start: this caps the validation's tasks;
            # the distill job takes its own cap (`max_cpus`), as the service passes it.
            context.execution_options.resource_limits = context.execution_options.resource_limits.copy(cpu=cap)
            v_s, got = validate_bench.best_of(repeats, lambda: build_validation(store.spec(), "files/validate", "fine-tune"))
            d_s, out = validate_bench.best_of(repeats, lambda: build_distill(store.spec(), "files/results", "files/requests", "distill/o",
                                                                     DistillOptions(), max_cpus=cap))  # fmt: skip
            if got != stats or store.get_bytes(out.train_key) != expected[0]:
                raise RuntimeError(f"at {cap} CPUs the Ray jobs' results differ from the single-process ones")
            figures["caps"][str(cap)] = {
                "validate_mb_s": round(mb / v_s, 1), "validate_vs_single_process": round(inline_s / v_s, 3),
                "distill_rows_s": round(n / d_s), "distill_vs_single_process": round(local_s / d_s, 3),
            }  # fmt: skip
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(validate_bench.BENCH_DIR, ignore_errors=True)
    return {"figures": figures}
