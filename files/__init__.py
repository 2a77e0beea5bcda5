"""A file's rules below the API: what an account may hold, how a stored object becomes a file row,
and the files a batch's results distill into.

Where it sits: the API's upload and distill services (serve_app/services/files_upload.py,
serve_app/services/distill.py) and the distill shortcut of job create (jobs/distilling.py, on a
worker thread) call it; it uses pipelines/ (validation and distillation on Ray Data), storage/
and the core.

- `limits.py`: the per-account file limits (files, bytes), checked before and under the account's lock.
- `record.py`: a stored object's validation (inline, then Ray Data past the threshold) and its
  files rows, all or none, within the limits.
- `distill.py`: a batch's requests and results made into a training and a validation file.
"""
