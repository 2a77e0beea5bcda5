"""MLflow: one run per job on the operator's tracking server, through MLflow's REST API.

Where it sits: train/integrations/forwarder.py calls `start`, `log` for each batch of new
metrics events and `finish` once the job has ended. Plain REST (httpx) rather than the mlflow
client so that every call has the `tracking_timeout_seconds` bound and no retry loop of minutes
(the client retries 7 times with backoff by default), and no process-global tracking state.
The run: experiment by name (created when missing), name default the job id, the caller's tags
plus `openft.job_id` and `openft.model`; params are the job's hyperparameters and method; each
metrics event is one step of its numeric fields; at the end, `result/<name>` metrics, the
`openft.status` / `openft.fine_tuned_model` / `openft.error_code` tags and the run's status
(FINISHED for a succeeded job, FAILED for a failed one, KILLED for a cancelled one).
"""

from __future__ import annotations

import time

import httpx

from jobs.integrations import MlflowIntegration
from openft.settings import Settings
from train.integrations.outcome import JobFacts, Outcome

BATCH_METRICS = 1000  # MLflow's log-batch limit
RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


class MlflowError(Exception):
    """The tracking server refused a call; carries MLflow's error code, never the request."""


class MlflowTracker:
    kind = "mlflow"

    def __init__(self, config: MlflowIntegration, facts: JobFacts, settings: Settings):
        self.config, self.facts = config, facts
        self.http = httpx.Client(base_url=settings.mlflow_tracking_uri.rstrip("/") + "/api/2.0/mlflow/",
                                 timeout=settings.tracking_timeout_seconds)
        self.run_id: str | None = None

    def _call(self, method: str, path: str, **kw) -> dict:
        response = self.http.request(method, path, **kw)
        if response.status_code >= 400:
            try:
                code = response.json().get("error_code", "")
            except ValueError:
                code = ""
            raise MlflowError(f"{path}: HTTP {response.status_code} {code}".strip())
        return response.json() if response.content else {}

    def _experiment_id(self) -> str:
        name = self.config.experiment
        try:
            return self._call("GET", "experiments/get-by-name", params={"experiment_name": name})["experiment"][
                "experiment_id"]
        except MlflowError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        try:
            return self._call("POST", "experiments/create", json={"name": name})["experiment_id"]
        except MlflowError as exc:  # another job created it meanwhile
            if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise
            return self._call("GET", "experiments/get-by-name", params={"experiment_name": name})["experiment"][
                "experiment_id"]

    def start(self) -> None:
        tags = {**self.config.tags, "openft.job_id": self.facts.job_id, "openft.model": self.facts.model}
        run = self._call("POST", "runs/create", json={
            "experiment_id": self._experiment_id(), "run_name": self.config.run_name or self.facts.job_id,
            "start_time": _ms(), "tags": [{"key": k, "value": v} for k, v in tags.items()],
        })
        self.run_id = run["run"]["info"]["run_id"]
        params = [{"key": k, "value": str(v)} for k, v in self.facts.config.items() if v is not None]
        self._call("POST", "runs/log-batch", json={"run_id": self.run_id, "params": params})

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        now = _ms()
        metrics = [{"key": k, "value": v, "timestamp": now, "step": step} for step, values in rows for k, v in values.items()]
        for i in range(0, len(metrics), BATCH_METRICS):
            self._call("POST", "runs/log-batch", json={"run_id": self.run_id, "metrics": metrics[i:i + BATCH_METRICS]})

    def finish(self, outcome: Outcome) -> None:
        now, step = _ms(), int(outcome.figures.get("steps", 0))
        metrics = [{"key": f"result/{k}", "value": v, "timestamp": now, "step": step} for k, v in outcome.figures.items()]
        if outcome.trained_tokens is not None:
            metrics.append({"key": "trained_tokens", "value": outcome.trained_tokens, "timestamp": now, "step": step})
        tags = [{"key": f"openft.{k}", "value": str(v)} for k, v in (
            ("status", outcome.status), ("fine_tuned_model", outcome.fine_tuned_model), ("error_code", outcome.error_code))
            if v is not None]
        self._call("POST", "runs/log-batch", json={"run_id": self.run_id, "metrics": metrics, "tags": tags})
        self._call("POST", "runs/update", json={"run_id": self.run_id, "status": RUN_STATUS.get(outcome.status, "FAILED"),
                                                "end_time": now})
        self.run_id = None
        self.http.close()

    def close(self) -> None:
        """Mark a run the forwarder gives up on as failed, if the server still answers."""
        run_id, self.run_id = self.run_id, None
        try:
            if run_id is not None:
                self._call("POST", "runs/update", json={"run_id": run_id, "status": "FAILED", "end_time": _ms()})
        finally:
            self.http.close()


def _ms() -> int:
    return int(time.time() * 1000)
