"""Experiment tracking for jobs that ask for it (`integrations`: wandb, mlflow).

jobs/integrations.py validates the create body's integrations; `forwarder.py` is a Ray actor per job that
tails the job's metrics events in the database and hands them to the trackers (`wandb_tracker.py`,
`mlflow_tracker.py`), then the job's result once it ends. Training never calls a tracker.
"""
