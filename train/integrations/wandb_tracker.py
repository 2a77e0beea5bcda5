"""Weights & Biases: one wandb run per job, with the real `wandb` library.

Where it sits: train/integrations/forwarder.py calls `start`, `log` for each batch of new
metrics events and `finish` once the job has ended. The server's settings say where it logs
(`wandb_mode` online to `wandb_base_url` with `wandb_api_key`, or offline under `wandb_dir`);
the request says only the project, entity, run name and tags. The run's id is the job id and its
name defaults to it, as OpenAI's integration does; its tags add `openft/finetune`,
`openft/<base>` and `openft/<job id>` to the caller's.
"""

from __future__ import annotations

from jobs.integrations import WandbIntegration
from openft.settings import Settings
from train.integrations.outcome import JobFacts, Outcome


class WandbTracker:
    kind = "wandb"

    def __init__(self, config: WandbIntegration, facts: JobFacts, settings: Settings):
        self.config, self.facts, self.settings = config, facts, settings
        self.run = None

    def start(self) -> None:
        import wandb

        settings = self.settings
        directory = settings.resolved_wandb_dir()
        directory.mkdir(parents=True, exist_ok=True)
        options = wandb.Settings(
            mode=settings.wandb_mode, base_url=settings.wandb_base_url or "https://api.wandb.ai",
            api_key=settings.wandb_api_key.get_secret_value() if settings.wandb_api_key else None,
            init_timeout=settings.tracking_timeout_seconds,
            # The forwarder's process is not the training's: its stdout, host stats, git state and
            # code say nothing about the job, and its console is the Ray worker's log.
            console="off", x_disable_stats=True, x_disable_meta=True, disable_git=True, save_code=False, silent=True,
        )
        self.run = wandb.init(
            project=self.config.project, entity=self.config.entity, name=self.config.name or self.facts.job_id,
            id=self.facts.job_id, tags=[*self.config.tags, *self.facts.default_tags()], config=self.facts.config,
            dir=str(directory), settings=options, reinit="create_new",
            # Online, a job that the forwarder picks up again (a later attempt) continues its run.
            resume="allow" if settings.wandb_mode == "online" else None,
        )

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        for step, metrics in rows:
            self.run.log(metrics, step=step)

    def finish(self, outcome: Outcome) -> None:
        self.run.summary.update({k: v for k, v in outcome.summary().items() if v is not None})
        self.run.finish(exit_code=0 if outcome.status == "succeeded" else 1)
        self.run = None
        _flush()

    def close(self) -> None:
        """Stop a run whose forwarder gives up on it (a later call failed)."""
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=1)
            _flush()


def _flush() -> None:
    """Wait for wandb-core to write the run to its end. `run.finish()` returns before it has (an
    offline run's exit record came seconds later on a busy machine), and the forwarder's actor exits
    right after (`ray.actor.exit_actor`, where wandb's own atexit teardown does not run): without
    this a loaded machine lost the run's last records. The forwarder's process serves one job, so
    shutting its wandb service down takes nothing from another run."""
    import wandb

    wandb.teardown()
