"""The layout rules that keep one home for each concept, checked on the source (not on a list of
files): every package sits on a floor and imports only the floors below it (no arrow runs back up,
so there is no circle between packages), no package has an import circle inside, SQLAlchemy is
imported only where queries belong, only the job package writes a job's status, object keys are
built in storage/keys.py alone, and the mechanisms every kind of background work shares are
defined once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A package imports only packages on lower floors (never its own floor's others):
# the import graph between packages is then a partial order, with no circle and no arrow up.
FLOORS = (
    ("openft",),  # the core: errors, ids, settings, prices, size limits, metrics
    ("catalog", "graders"),  # the bases; graders (when present) are pure rules on the core
    ("storage",),  # the database, the object store, the leases every kind of background work shares
    ("pipelines",),  # Ray Data stages and the generation engines
    ("files", "merge", "webhooks", "online"),  # a file's rules, the merge engine and its life, webhook events, online serving
    ("jobs",),  # a job's request, rules, life and success
    ("batches", "train"),  # a batch's life and driver; training runs
    ("evals",),  # an eval run's life and driver: it samples as a batch does and grades with graders/
    ("worker", "serve_app"),  # the two top floors of the service, side by side: neither imports the other
    ("entrypoints", "datakit"),  # the CLI and service start-up; the notebook API
)
FLOOR = {package: floor for floor, packages in enumerate(FLOORS) for package in packages}
NOT_PACKAGES = {"tests", "bench", "examples", "dashboard", "deploy", "build", "docs"}
PACKAGES = tuple(sorted(path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name not in NOT_PACKAGES))

# Where SQLAlchemy may be imported, and why. Everywhere else a session only passes through: a
# module may name its type (`from sqlalchemy.orm import Session`), and calls storage/, jobs/ or
# batches/ for every query.
SQLALCHEMY = {
    "storage": "the schema, the engine, migrations and repositories, and the lease mechanism: every query "
               "that is not a kind's own rule is written here",
    "jobs": "a job's transitions are compare-and-sets and counts under row locks in the caller's transaction "
            "(jobs/transitions.py, scheduling.py, limits.py, model_names.py)",
    "batches": "likewise a batch's (batches/transitions.py, scheduling.py, billing.py, run.py's stage sweep)",
}


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


def test_every_package_is_on_a_floor():
    assert PACKAGES and "worker" in PACKAGES and "catalog" in PACKAGES
    unplaced = [package for package in PACKAGES if package not in FLOOR]
    assert not unplaced, f"packages on no floor of FLOORS: {unplaced}; say where each sits"


def test_every_package_is_installed():
    """An installed service (`pip install`, `make demo` from any directory) imports only the packages
    pyproject.toml lists: a package left out works in the checkout's root and nowhere else."""
    listed = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    installed = {name.strip().strip('"').rstrip("*") for name in listed[1].split(",")}
    missing = sorted(set(PACKAGES) - installed)
    assert not missing, f"packages pyproject.toml does not install: {missing}"


def arrows_up(package: str, tree: ast.AST) -> list[str]:
    """The imports of a module of `package` that reach its own floor or one above."""
    targets = {name.split(".")[0] for name in imported(tree)}
    return sorted(t for t in targets if t in FLOOR and t != package and FLOOR[t] >= FLOOR[package])


def circles(graph: dict[str, set[str]]) -> list[str]:
    """The modules of `graph` (module -> the modules it imports) that reach themselves."""

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ()))

    return [name for name in graph if reaches(name, name)]


def test_no_import_runs_back_up():
    """Walk a job id from the worker down: worker -> jobs -> files, webhooks -> storage -> the core,
    never back into serve_app or any floor above; the core imports nothing of ours."""
    up = {str(path.relative_to(ROOT)): hits for package in PACKAGES for path, tree in modules(package)
          if (hits := arrows_up(package, tree))}
    assert up == {}, up


def test_no_package_has_an_import_circle():
    for package in PACKAGES:
        graph = {}
        for path, tree in modules(package):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            graph[name] = {m for m in imported(tree) if m.startswith(package + ".")}
        graph = {name: {m for m in targets if m in graph and m != name} for name, targets in graph.items()}
        assert circles(graph) == [], f"import circle in {package}: {circles(graph)}"


def test_the_checks_find_what_two_reviews_found():
    """The core importing the catalog, the controller importing the API, and the generate/vLLM circle."""
    assert arrows_up("openft", ast.parse("from catalog.bases import BASES")) == ["catalog"]
    assert arrows_up("worker", ast.parse("def f():\n    from serve_app.services.distill import distill_job")) == [
        "serve_app"]
    assert arrows_up("worker", ast.parse("from jobs.distilling import distill_job")) == []
    assert circles({"pipelines.generate": {"pipelines._vllm_engine"}, "pipelines._vllm_engine": {"pipelines.generate"},
                    "pipelines.engine": set()}) == ["pipelines.generate", "pipelines._vllm_engine"]


def _sqlalchemy_imports(tree: ast.AST) -> list[str]:
    """`line: statement` for each import of SQLAlchemy other than the Session type."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sqlalchemy" for a in node.names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            if not (node.module == "sqlalchemy.orm" and [a.name for a in node.names] == ["Session"]):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_sqlalchemy_is_imported_only_where_queries_belong():
    found = {}
    for package in PACKAGES:
        if package in SQLALCHEMY:
            continue
        for path, tree in modules(package):
            if hits := _sqlalchemy_imports(tree):
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found


# Each defined once, in the module named: `grep` finds one definition.
ONE_HOME = {
    "Moved": "storage/leases.py", "lock_account": "storage/leases.py", "lock_scheduler": "storage/leases.py",
    "Heartbeat": "storage/leases.py", "exhausted": "storage/leases.py", "LeaseLost": "storage/leases.py",
    "owned": "storage/leases.py",  # a kind's `owned` wraps it: jobs, batches, eval runs
    "FILE_BYTES": "openft/limits.py", "ADAPTER_BYTES": "openft/limits.py", "MAX_EXPORTS": "merge/quota.py",
    "models_quota": "jobs/limits.py", "TrainingError": "openft/errors.py",
}
WRAPPERS = {("owned", "jobs/transitions.py"), ("owned", "batches/transitions.py"), ("owned", "jobs/distilling.py"),
            ("owned", "evals/transitions.py")}


def definitions(tree: ast.AST) -> list[str]:
    """The names a module defines: its functions, classes and assigned names, at any depth."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def test_what_every_kind_of_work_shares_is_defined_once():
    homes: dict[str, list[str]] = {name: [] for name in ONE_HOME}
    for package in PACKAGES:
        for path, tree in modules(package):
            where = str(path.relative_to(ROOT))
            for name in definitions(tree):
                assert name != "MAX_ATTEMPTS", f"{where}: an attempt rule is a Kind's data (storage/leases.py)"
                if name in homes and (name, where) not in WRAPPERS:
                    homes[name].append(where)
    assert homes == {name: [home] for name, home in ONE_HOME.items()}
    keyset = re.compile(r"_ns\s*[<>]\s*cursor\.\w+_ns|[<>]\s*cursor\.id\b|limit\s*\+\s*1\b")  # keyset paging
    assert [str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
            if keyset.search(p.read_text())] == ["storage/paging.py"]


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
    for package in PACKAGES:
        if package in allowed:
            continue
        for path, tree in modules(package):
            if hits := local_paths_handed_to_ray(tree):
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found


def test_the_notebook_api_is_a_top_floor_that_nothing_imports():
    for package in PACKAGES:
        if package == "datakit":
            continue
        for path, tree in modules(package):
            bad = sorted(m for m in imported(tree) if m.split(".")[0] == "datakit")
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    for path, tree in modules("datakit"):
        assert not local_paths_handed_to_ray(tree), path
        above = sorted(m for m in imported(tree) if m.split(".")[0] in ("entrypoints", "serve_app", "jobs", "train"))
        assert not above, f"{path.relative_to(ROOT)} imports {above}"


# The processes that start most often and never run a model: the API replica (every deployment and
# restart), the job controller actor and the CLI. torch, transformers, peft and ray.data cost them
# about 4 CPU-s at each start (5.6 s against 2.2 for the API's import here); the code that runs a
# model or a dataset imports them where it does (catalog/model_source.py).
LIGHT_PROCESSES = ("serve_app.deployment", "worker.controller", "entrypoints.cli", "online.deployment")
HEAVY_MODULES = ("torch", "transformers", "peft", "bitsandbytes", "ray.data")


def _run_time(tree: ast.Module) -> ast.Module:
    """The module without its `if TYPE_CHECKING:` blocks (imports for annotations only)."""
    class Drop(ast.NodeTransformer):
        def visit_If(self, node: ast.If):
            return None if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING") else self.generic_visit(node)

    return Drop().visit(tree)


def test_peft_is_imported_only_through_import_peft():
    """catalog/model_source.py `import_peft` imports peft so that the bitsandbytes it pulls in does
    not compile at import (1.4 CPU-s of every Train worker and generation actor, bench/process_start.py);
    an import statement elsewhere could be a process's first and pay it."""
    found = {}
    for package in PACKAGES:
        for path, tree in modules(package):
            if path.relative_to(ROOT) == Path("catalog/model_source.py"):
                continue
            if hits := sorted(m for m in imported(_run_time(tree)) if m.split(".")[0] == "peft"):
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found


def test_the_api_the_controller_and_the_cli_start_without_model_or_dataset_libraries():
    import subprocess
    import sys

    probe = (f"import sys\nfor m in {LIGHT_PROCESSES!r}: __import__(m)\n"
             f"print(','.join(m for m in {HEAVY_MODULES!r} if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"imported at start: {out.stdout.strip()}"
