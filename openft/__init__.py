"""openft: the shared core of the service (settings, errors, ids, prices, the holdout rule, sealing, metrics).

The packages beside it (`serve_app`, `pipelines`, `train`, `merge`, `storage`, `catalog`)
hold the API, the Ray Data stages, the Ray Train recipes, the merge and persistence.
"""
