"""The service's fixed size limits, in one place: what a file of each purpose and a trained adapter
may weigh. Quotas that an operator sets are settings (openft/settings.py, applied by jobs/limits.py
and files/limits.py); the merged-weights quota is merge/quota.py's.

Every layer that enforces a size reads it here: the streaming validator (pipelines/validate.py),
the upload's body bound (serve_app/services/files_upload.py), a job's file check (jobs/params.py)
the notebook API's local check (datakit/rows.py), and adapter registration (jobs/registration.py)."""

from __future__ import annotations

MIB = 1 << 20

# The largest file of each purpose: a fine-tune file is a job's training or validation file;
# batch input files and results files (uploaded or made by a batch) and eval items may be larger.
FILE_BYTES = {"fine-tune": 64 * MIB, "batch": 200 * MIB, "batch_output": 200 * MIB, "evals": 200 * MIB}
FINE_TUNE_FILE_BYTES = FILE_BYTES["fine-tune"]

# The largest adapter a job may register, by method (the reference's limits).
# Reinforcement adapters take the supervised ranks (jobs/params.py), so the supervised limit.
ADAPTER_BYTES = {"supervised": 383 * MIB, "dpo": 128 * MIB, "reinforcement": 383 * MIB}
