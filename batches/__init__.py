"""A batch's life, in one place: the create-time scan, the open-batch limit, every status change
and the lease, the money, and the worker's passes and driver.

Where it sits: below the API's service (serve_app/services/batches.py) and the worker
(worker/batches.py), which call it; above jobs/ (model names), pipelines/, storage/, catalog/ and
the core. Nothing else writes a batch's status.

- `scan.py`: the input file's lines and models, checked at create (400 with the line number);
  what it finds is the batch's typed `plan.py`, which its driver runs.
- `limits.py`: the open-batch limit (429 limit_exceeded with error.limit).
- `transitions.py`: every status as a compare-and-set, the driver's lease, timestamps.
- `billing.py`: the hold at start (a quote of the batch) and the charge of its real tokens.
- `scheduling.py`: the controller's passes (lost drivers, claims under the shared capacity rule).
- `run.py`: one batch driven to its end: stage adapter copies, run the Ray Data pipeline
  (pipelines/batch_ray.py `run_batch`), record the files, delete the stage.
"""
