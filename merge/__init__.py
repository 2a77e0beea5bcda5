"""Merging a LoRA adapter into its base's bf16 weights and exporting the result as safetensors.

Entry points live in `merge.run` (`MergeRequest`, `preflight`, `run_merge`); errors in
`merge.errors`. Flow: adapter.py (validate) -> plan.py (base files, shard plan) -> shard.py (one
Ray task per shard) -> export.py (licences, NOTICE, gridline_merge.json, read-back).
"""
