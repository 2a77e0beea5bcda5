"""An eval run's life, in one place: its data source checked at create, its lease and every status
change, its money, and the worker's passes and driver.

Where it sits: above batches/ (a completions run's samples are generated as a batch is, by
pipelines/batch_ray.py `run_batch` on the batch engine, under the batches' capacity rule and
money rules) and graders/ (the rules of every grade); below the API's service
(serve_app/services/eval_runs.py) and the worker (worker/evals.py), which call it. Nothing else
writes a run's status.

- `source.py`: the run's data source and items, checked at create (a refusal names its param).
- `plan.py`: what create found, stored typed on the run (`RunPlan`), what the driver runs.
- `runtime.py`: the graders' runtime the service gives them: the caller's models answered by the
  batch engine, the python sandbox's limits from settings (the grader endpoints use it too).
- `transitions.py`: the `EVAL_RUN` kind, every status as a compare-and-set, the hold and charge.
- `scheduling.py`: the controller's passes (lost drivers, claims under the batches' capacity rule).
- `run.py`: one run driven to its end: generate, grade, record the items, count.
"""
