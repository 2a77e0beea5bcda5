"""The worker: the service's background work, on the top floor beside the API.

One Ray actor (`controller.py`) ticks: each kind of background work reconciles what nothing drives
any more and claims what may start, and each claim is driven on a thread of its own under its
lease (storage/leases.py). One module per kind of supervision:

- `runs.py`: fine-tuning runs (jobs/scheduling.py's passes; the run's Ray task, its time limit and
  stall watchdog, the serving-parity check, the success transaction of jobs/registration.py);
- `distills.py`: distill-shortcut jobs (jobs/distilling.py);
- `batches.py`: batches (batches/scheduling.py, batches/run.py);
- `merges.py`: merges (merge/worker.py);
- webhook deliveries run on a thread of the controller (webhooks/delivery.py).

`work.py` is what a kind gives the tick (`Work`, `Task`). Nothing here writes a status: every
change is a compare-and-set of the kind's own package, and nothing below imports this package.
"""
