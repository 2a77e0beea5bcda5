"""The layout rules that keep one home for each concept, checked on the source (not on a list):
the core imports nothing above it, the storage package has no import circle, only the job package
writes a job's status, and object keys are built in storage/keys.py alone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("openft", "jobs", "entrypoints", "serve_app", "pipelines", "train", "merge", "storage", "catalog", "webhooks")


def modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield path, ast.parse(path.read_text(), str(path))


def imported(tree: ast.AST) -> set[str]:
    """Every module an import statement names, at any depth (function-level imports count)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_the_core_imports_no_entry_point_and_nothing_above_it():
    above = ("entrypoints", "jobs", "serve_app", "train", "pipelines", "merge", "storage", "webhooks")
    for path, tree in modules("openft"):
        bad = sorted(m for m in imported(tree) if m.split(".")[0] in above)
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_nothing_below_the_top_floor_imports_an_entry_point():
    for package in PACKAGES:
        if package == "entrypoints":
            continue
        for path, tree in modules(package):
            bad = sorted(m for m in imported(tree) if m.split(".")[0] == "entrypoints")
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_storage_package_has_no_import_circle():
    graph = {}
    for path, tree in modules("storage"):
        name = "storage." + ".".join(path.relative_to(ROOT / "storage").with_suffix("").parts)
        graph[name.removesuffix(".__init__")] = {m for m in imported(tree) if m.startswith("storage.")}
    for name in graph:
        graph[name] = {m for m in graph[name] if m in graph and m != name}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph[start])

    circles = [name for name in graph if reaches(name, name)]
    assert not circles, f"import circle through {circles}"
    for path, tree in modules("storage"):  # and it imports nothing above it
        bad = sorted(m for m in imported(tree) if m.split(".")[0] in ("jobs", "serve_app", "train", "entrypoints", "webhooks"))
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def status_assigned(node: ast.AST, owner) -> bool:
    """Whether `node` assigns `<name>.status` (plain, augmented, annotated or in a tuple) for a name `owner` accepts."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AugAssign, ast.AnnAssign)) else []
    return any(isinstance(leaf, ast.Attribute) and leaf.attr == "status" and isinstance(leaf.value, ast.Name)
               and owner(leaf.value.id)
               for target in targets for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]))


def _status_writes(tree: ast.AST) -> list[int]:
    """Lines that assign `<x>.status` where x is a Job, or pass `status=` to Job(...) or update(Job)."""
    lines = []
    for node in ast.walk(tree):
        if status_assigned(node, lambda name: re.fullmatch(r"(job|j|row|locked|waiting)", name)):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and any(k.arg == "status" for k in node.keywords):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            text = ast.unparse(node)
            if called == "Job" or (called == "values" and "update(Job)" in text):
                lines.append(node.lineno)
    return lines


def test_only_the_job_package_writes_a_jobs_status():
    writers = {}
    for package in PACKAGES:
        for path, tree in modules(package):
            if _status_writes(tree):
                writers[str(path.relative_to(ROOT))] = _status_writes(tree)
    assert set(writers) == {"jobs/transitions.py"}, writers


def test_object_keys_are_laid_out_in_one_module():
    layout = re.compile(r"""f["'](files|runs|tokenized|merges)/""")
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path != ROOT / "storage" / "keys.py" and layout.search(path.read_text()):
                found.append(str(path.relative_to(ROOT)))
    assert found == [], found


# What a Ray task, actor, Ray Data function or Ray Train run receives runs on any node of a cluster,
# whose disks are its own: it gets object keys, the store's spec and the model source (with the
# model cache root, the same setting on every node), never a path on the driver's disk.
_RAY_CALLS = {"remote", "options", "map", "map_batches", "flat_map", "filter", "TorchTrainer", "RunConfig"}
_RAY_KEYWORDS = {"fn_args", "fn_kwargs", "fn_constructor_args", "fn_constructor_kwargs", "train_loop_config",
                 "runtime_env", "storage_path", "working_dir", "py_modules"}
_LOCAL_PATH = re.compile(
    r"\b(data_dir|base_dir|base_file|run_dir|workdir|tmp|tmp_path|tmp_dir|tempfile|mkdtemp|gettempdir|TemporaryDirectory"
    r"|local_path|ray_temp_dir|signing_secret|__file__|getcwd|home)\b|\bPath\(|\.resolve\(\)|\.root\b|file://"
)


def local_paths_handed_to_ray(tree: ast.AST) -> list[str]:
    """`line: argument` for each argument of a Ray boundary call that names a local path."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = [*node.args, *(k.value for k in node.keywords)] if name in _RAY_CALLS else [
            k.value for k in node.keywords if k.arg in _RAY_KEYWORDS]
        found += [f"{node.lineno}: {ast.unparse(a)}" for a in args if _LOCAL_PATH.search(ast.unparse(a))]
    return found


def test_the_local_path_check_finds_what_crossed_a_ray_boundary_before():
    before = [  # merge/run.py and train/attempt.py before issue 14
        "_merge_shard.options(name=n).remote(job, str(base_dir / job.path), store, key, ref, scale)",
        "run_training(job, factory, storage_path=str(settings.data_dir.resolve() / 'train_runs'))",
        "ds.map_batches(Actor, fn_constructor_kwargs={'out': tempfile.mkdtemp()})",
    ]
    assert [len(local_paths_handed_to_ray(ast.parse(code))) for code in before] == [1, 1, 1]
    assert local_paths_handed_to_ray(ast.parse("task.remote(req, job, store, key, ref, scale)")) == []


def test_no_local_path_is_handed_to_a_ray_task_or_actor():
    allowed = ("storage",)  # the stores themselves: a local store's root is its spec
    found = {}
    for package in (*PACKAGES, "batches"):
        if package in allowed:
            continue
        for path, tree in modules(package):
            if hits := local_paths_handed_to_ray(tree):
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found


def test_the_notebook_api_is_a_top_floor_that_nothing_imports():
    for package in (*PACKAGES, "batches"):
        for path, tree in modules(package):
            bad = sorted(m for m in imported(tree) if m.split(".")[0] == "datakit")
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    for path, tree in modules("datakit"):
        assert not local_paths_handed_to_ray(tree), path
        above = sorted(m for m in imported(tree) if m.split(".")[0] in ("entrypoints", "serve_app", "jobs", "train"))
        assert not above, f"{path.relative_to(ROOT)} imports {above}"
