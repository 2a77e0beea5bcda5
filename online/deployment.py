"""One Ray Serve deployment per served base (`online-<base id>` on the Ray dashboard, inside the API's
application): each replica holds the base once, with the account adapters its requests name loaded
on demand through Serve's model multiplexing, and decodes concurrent requests together
(online/engine.py).

Serving design:
- Multiplexing: the API calls a replica with `multiplexed_model_id` = the adapter's store prefix
  (unique per fine-tune or checkpoint; "" for the base alone). Serve's router sends a request to a
  replica that already holds that id when one has room, and `serve.multiplexed` keeps up to
  `online_adapters_per_replica` adapters per replica, evicting the least recently used one
  (the engine unloads it once its requests have ended). The API has checked the account and the
  model before it calls: a replica serves whatever prefix it is given and reads nothing else.
- Autoscaling: Serve's request-based autoscaler between `online_min_replicas` and
  `online_max_replicas`, aiming at `online_target_ongoing_requests` per replica; down to zero
  after `online_idle_seconds` without requests by default (a replica loads a stand-in in seconds;
  operators who serve 7B bases set online_min_replicas to 1 to keep a warm copy).
- Placement: `online_replica_resources` per replica (a custom resource pins serving to its nodes);
  the job controller keeps what these may take out of training's count (jobs/scheduling.py).
- vLLM on GPU nodes: the same deployment shape with Ray Serve LLM's LoRA multiplexing
  (`ray.serve.llm`, vLLM with `enable_lora` and `max_loras`) in place of our engine; not built
  here, see docs/online.md.
- Metrics (openft/metrics.py): time to first token and tokens per second per request, adapter
  loads and evictions, and the queue depth, tagged by base.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from ray import serve

from catalog.bases import get_base, served_bases
from online.protocol import Delta, OnlineRequest, deployment_name
from openft import metrics
from openft.settings import Settings
from storage.keys import ADAPTER_FILES

_STATS_EVERY_S = 2.0


@serve.deployment
class BaseServer:
    def __init__(self, settings: Settings, base_id: str):
        import ray
        import torch

        from online.engine import OnlineEngine  # torch: in the replica, not in the process that deploys
        from pipelines.generate import load_engine
        from storage.objects import open_object_store

        # As many torch threads as the replica's CPUs (one when it takes none): not every core of a
        # node other work shares.
        torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 0))))

        self.base_id = base_id
        self.store = open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                                       s3_region=settings.s3_region)  # fmt: skip
        engine = load_engine(get_base(base_id), model_source=settings.model_source, cache_root=str(settings.model_cache_dir),
                             adapters={}, max_batch_rows=settings.online_max_batch_rows)  # fmt: skip
        self.engine = OnlineEngine(engine, stream_interval=settings.online_stream_interval_seconds,
                                   chunks_per_second=settings.online_stream_chunks_per_second)

        async def load(prefix: str):
            return await self.engine.hold_adapter(prefix, lambda: {f: self.store.get_bytes(prefix + f) for f in ADAPTER_FILES})

        # Built here rather than as a decorated method: its size is a setting.
        self.adapter = serve.multiplexed(max_num_models_per_replica=settings.online_adapters_per_replica)(load)
        self._reported = {"loads": 0, "evictions": 0}
        self._stats_task = asyncio.get_event_loop().create_task(self._report_stats())

    async def generate(self, request: OnlineRequest) -> AsyncIterator[Delta]:
        prefix = serve.get_multiplexed_model_id()
        hold = await self.adapter(prefix) if prefix else None
        started, first, tokens = time.monotonic(), None, 0
        async for delta in self.engine.stream(request, hold.name if hold is not None else None):
            if first is None and (delta.text or delta.finish_reason):
                first = time.monotonic()
                metrics.record_online_first_token(first - started, model=self.base_id)
            tokens = delta.completion_tokens
            yield delta
        metrics.record_online_tokens(tokens, time.monotonic() - started, model=self.base_id)

    def stats(self) -> dict:
        """The engine's counts (adapter loads, evictions, unloads, resident, queued, decoding)."""
        return self.engine.stats()

    async def _report_stats(self) -> None:
        while True:
            stats = self.engine.stats()
            metrics.set_online_queue_depth(stats["queued"], model=self.base_id)
            for kind in ("loads", "evictions"):
                metrics.count_online_adapters(kind, stats[kind] - self._reported[kind], model=self.base_id)
                self._reported[kind] = stats[kind]
            await asyncio.sleep(_STATS_EVERY_S)

    def __del__(self):
        self.engine.close()


def online_deployments(settings: Settings) -> dict:
    """{base id: the bound deployment} for every served base, sized and placed by the settings."""
    resources = {k: float(v) for k, v in settings.online_replica_resources.items()}
    num_cpus, num_gpus = resources.pop("CPU", 0.0), resources.pop("GPU", 0.0)
    actor_options = {"num_cpus": num_cpus, "num_gpus": num_gpus, **({"resources": resources} if resources else {})}
    autoscaling = {
        "min_replicas": settings.online_min_replicas,
        "initial_replicas": settings.online_min_replicas,
        "max_replicas": settings.online_max_replicas,
        "target_ongoing_requests": settings.online_target_ongoing_requests,
        "downscale_delay_s": settings.online_idle_seconds,
        "downscale_to_zero_delay_s": settings.online_idle_seconds,
        "upscale_delay_s": 0.0,  # a request waiting for a base's first replica should not wait longer
    }
    return {
        base_id: BaseServer.options(
            name=deployment_name(base_id), ray_actor_options=actor_options, autoscaling_config=autoscaling,
            max_ongoing_requests=settings.online_max_ongoing_requests,
        ).bind(settings, base_id)
        for base_id in served_bases(settings.online_bases)
    }  # fmt: skip
