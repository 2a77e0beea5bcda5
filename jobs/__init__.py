"""A fine-tuning job's life, in one place: what it is, when it may start, and every change of status.

Where it sits: below the API's services (serve_app/) and the job controller (train/controller.py),
which call it; above storage/ and the core (openft/), which it uses. Nothing else writes a job's
status.

- `spec.py`: the typed job spec, written at create and read by the controller.
- `limits.py`: the per-account limits (open jobs, models, USD per day), computed once.
- `transitions.py`: every status change as a compare-and-set under one lock order, and the run
  lease that decides who drives a job. Start here for "what happens when a job is cancelled while
  it starts" (its docstring and `cancel`).
- `distilling.py`: a job created on a batch results file, from create (waiting, `distilling`) to
  admission once the controller has distilled and checked its files, or its failure.
- `scheduling.py`: the controller's passes (reconcile lost runs, expire waits, start runs under
  the cap and the cluster's capacity), built from those transitions.
"""
