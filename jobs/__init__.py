"""A fine-tuning job's life, in one place: what it is, when it may start, and every change of status.

Where it sits: below the API's services (serve_app/) and the worker (worker/), which call it;
above files/, storage/, catalog/ and the core (openft/), which it uses. Nothing else writes a job's
status, and nothing here imports the API.

- `params.py`: the create body parsed into a `JobSpec`, every refusal with its code and param,
  and the files-table rules a job's files must pass; `integrations.py`: the `integrations` rules.
- `spec.py`: the typed job spec, written at create and read by the worker.
- `files.py`: a job's files and the checks that read them (the base's template over every row), then
  `quote.py`: the quote and the time-limit rule (`job_too_large`).
- `create.py`: create's checks in order and the admission under the account's lock.
- `limits.py`: the per-account limits (open jobs, models, USD per day), computed once.
- `transitions.py`: every status change as a compare-and-set under one lock order, and the run
  lease that decides who drives a job (storage/leases.py). Start here for "what happens when a job
  is cancelled while it starts" (its docstring and `cancel`).
- `distilling.py`: a job created on a batch results file, from create (waiting, `distilling`) to
  admission once the worker has distilled and checked its files, or its failure.
- `scheduling.py`: the worker's passes (reconcile lost runs, expire waits, start runs under the
  cap and the cluster's capacity), built from those transitions.
- `registration.py`: a job's success: its adapter registered as an `ft:` model, the job succeeded.
- `model_names.py`: `ft:` names, checkpoints as models, and resolving a name to its adapter.
"""
