"""openft: the shared core of the service (settings, errors, ids, CLI).

The packages beside it (`serve_app`, `pipelines`, `train`, `merge`, `storage`, `catalog`)
hold the API, the Ray Data stages, the Ray Train recipes, the merge and persistence.
"""
