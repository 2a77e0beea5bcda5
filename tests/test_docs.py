"""The README and the pages under docs/ say only what the code does: each fact of a kind the code can
show is found by an explicit pattern below and checked against the code, so a page cannot drift.

Pages: README.md and every docs/*.md. "Code" is a fenced block's lines (a line ending in `\\` goes
on with the next; a `#` comment after a space is dropped) and every inline code span. Nothing else
in the prose is parsed; a fact written in another form is not checked, so write it in these:

- Settings: every `OPENFT_NAME` anywhere is a field of openft.settings.Settings (prefix OPENFT_, or
  a field's alias) or an environment variable an examples/ notebook reads; `OPENFT_NAME_*` is the
  prefix of at least one field.
- Defaults: "`OPENFT_NAME` (default V" and "`OPENFT_NAME`, default V" (V ends at `)`, `;` or ", ";
  any whitespace, a line break too, may stand for each space),
  and each row `| `OPENFT_NAME` | V | what |` of docs/settings.md: V is the field's default. V is
  `true`/`false`, `unset` (None), `built in` (a default that is a pydantic model: the price table),
  JSON (`{"CPU": 1}`, `[]`), a number (`1,000`, `0.05`) with an optional unit (`s`, `min` and `h`
  in seconds; `KiB`, `MiB`, `GiB`, `GB` in bytes; `%`; `days`, the unit of the _DAYS settings), or
  else a plain string (`hub`). "`OPENFT_NAME` (30" without "default" fails: it would go unchecked.
  docs/settings.md lists every field once, its `what` the field's description
  (`\\|` for `|`, `&lt;` for `<`).
- Make targets: `make T` in code, and `make test...` anywhere: T is a target of the Makefile.
- Commands: `openft W ...` in code (after a space, `(` or the start): the words that name
  subcommands are choices of the real parser (entrypoints.cli.build_parser; `a|b` names both), the
  `--options` after the last one are its options, and `openft W ... --help` exits 0.
- Routes: `/v1/...` anywhere, `http://127.0.0.1:8000/...`, and `.../tail` (a route ending so), each
  optionally after `GET`, `POST`, ... or `GET/DELETE`: a route of the app, read from the routers'
  decorators and serve_app/app.py's include_router calls (importing the app starts Ray's imports;
  tests/serve_app/test_surface.py checks this reading against the real app). `{x}` matches a path
  parameter; a literal segment matches itself (in a URL, `http://...`, a parameter too:
  `/accounts/alice`). A path ending in `/` or `...`, or named without a method, may be a prefix of
  routes (`/v1`, the base URL; `/v1/gridline/admin`); one after a method names a route of that
  method. A batch's endpoint (serve_app/services/batches.py
  `ENDPOINTS`) counts too: it is a value of a batch's lines.
- Links: every relative link `[text](path#anchor)` resolves to a file, and an anchor to a heading
  of it (GitHub's slugs).
- Paths: every `dir/...` whose first part is a top-level directory of the repository names a file
  or directory git tracks (or ignores: build outputs); a path going on with `<...>`, `{...}` or `*`
  is a pattern, not checked, and `NOT_PATHS` names the few strings that only look like paths.
- The README's map has one row per top-level directory git tracks (docs/ and hidden ones aside).
- docs/tests.md: its tables have a row per `test*` target of the Makefile and per bench/*.py;
  "`.ci/run` runs, in this order: ..." names .ci/run's targets in its order; the block starting
  `== CI budget` is what .ci/report.py prints for the run made below.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import math
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from openft.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@cache
def text(path: Path) -> str:
    return path.read_text()


def split(page: Path) -> tuple[str, list[str]]:
    """(the prose, with fenced blocks blanked; the fenced blocks' lines)."""
    prose, block, inside = [], [], False
    for line in text(page).splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            prose.append("")
        elif inside:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), block


def code(page: Path) -> list[str]:
    """Each fenced line (continuations joined, comments dropped) and each inline code span."""
    prose, block = split(page)
    lines, held = [], ""
    for line in block:
        line = held + re.split(r"(?:^|\s)#", line, maxsplit=1)[0].rstrip()
        if line.endswith("\\"):
            held = line[:-1] + " "
            continue
        lines.append(line)
        held = ""
    return lines + re.findall(r"`([^`]+)`", prose.replace("\n", " "))


def everywhere(pattern: str):
    for page in PAGES:
        for match in re.finditer(pattern, text(page)):
            yield page, match


# -- settings ---------------------------------------------------------------------------------------
def setting_names() -> dict[str, str]:
    """Environment name -> field name, for every field and alias."""
    names = {}
    for field, info in Settings.model_fields.items():
        names["OPENFT_" + field.upper()] = field
        for alias in getattr(info.validation_alias, "choices", ()):
            if alias.startswith("OPENFT_"):
                names[alias] = field
    return names


def notebook_names() -> set[str]:
    return {n for nb in (ROOT / "examples").glob("*.ipynb") for n in re.findall(r"OPENFT_[A-Z0-9_]+", nb.read_text())}


def test_every_setting_named_exists():
    names, notebooks = setting_names(), notebook_names()
    bad = []
    for page, m in everywhere(r"OPENFT_[A-Z0-9_]*\*?"):
        name = m[0]
        if name.endswith("*") or name == "OPENFT_":  # a prefix, or the prefix itself
            ok = any(n.startswith(name.rstrip("*")) for n in names)
        else:
            name = name.rstrip("_")
            ok = name in names or name in notebooks
        if not ok:
            bad.append(f"{rel(page)}: {name}")
    assert not bad, "not a setting (openft/settings.py) nor a notebook's variable:\n" + "\n".join(sorted(set(bad)))


UNITS = {None: 1, "s": 1, "min": 60, "h": 3600, "days": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "GB": 10**9,
         "%": 0.01}  # fmt: skip
NUMBER = re.compile(r"(-?[\d,]*\.?\d+) ?(s|min|h|days|KiB|MiB|GiB|GB|%)?")


def states_default(value: str, default) -> bool:
    """Whether the written value `value` (the grammar in the module's docstring) is `default`."""
    value = " ".join(value.split()).strip("`")
    if value in ("true", "false"):
        return default is (value == "true")
    if value == "unset":
        return default is None
    if value == "built in":
        return isinstance(default, BaseModel)
    if (m := NUMBER.fullmatch(value)) and not isinstance(default, bool):
        number = float(m[1].replace(",", "")) * UNITS[m[2]]
        return isinstance(default, (int, float)) and math.isclose(number, default, rel_tol=1e-12)
    if value[:1] in "{[":
        return json.loads(value) == (default if isinstance(default, dict) else [str(d) for d in default])
    return isinstance(default, (str, Path)) and str(default) == value


def default_of(field: str):
    return Settings.model_fields[field].get_default(call_default_factory=True)


def test_every_default_stated_is_the_settings_default():
    names = setting_names()
    found, wrong = 0, []
    for page, m in everywhere(r"`(OPENFT_[A-Z0-9_]+)`(?:\s+\(|,\s+)default\s+((?:[^;),]|,(?!\s))+)"):
        found += 1
        if m[1] in names and not states_default(m[2], default_of(names[m[1]])):
            wrong.append(f"{rel(page)}: {m[0]!r}, but Settings has {default_of(names[m[1]])!r}")
    assert found >= 20, found  # the pattern still finds the pages' defaults
    assert not wrong, "\n".join(wrong)
    unchecked = [f"{rel(p)}: {m[0]!r}" for p, m in everywhere(r"`OPENFT_[A-Z0-9_]+`(?:\s+\(|,\s+)\d[^);]*")]
    assert not unchecked, "write a default as (default N), so that it is checked:\n" + "\n".join(unchecked)


def settings_table() -> list[tuple[str, str, str]]:
    rows = []
    for line in text(ROOT / "docs/settings.md").splitlines():
        if line.startswith("| `OPENFT_"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append((cells[0].strip("`"), cells[1], cells[2].replace("\\|", "|").replace("&lt;", "<")))
    return rows


def test_the_settings_page_lists_every_setting_with_its_default_and_description():
    rows = settings_table()
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)), "a setting listed twice in docs/settings.md"
    expected = {"OPENFT_" + f.upper(): f for f in Settings.model_fields}
    assert set(names) == set(expected), (f"missing: {sorted(set(expected) - set(names))}; "
                                         f"not a setting: {sorted(set(names) - set(expected))}")
    for name, value, what in rows:
        field = expected[name]
        assert states_default(value, default_of(field)), f"{name}: {value!r}, but Settings has {default_of(field)!r}"
        assert what == Settings.model_fields[field].description, f"{name}'s description in docs/settings.md"


# -- make targets -----------------------------------------------------------------------------------
def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if (m := re.match(r"([\w. -]+):(?!=)", line)) and not line.startswith("\t"):
            targets.update(t for t in m[1].split() if not t.startswith("."))
    return targets


def test_every_make_target_named_exists():
    targets, named = make_targets(), []
    for page in PAGES:
        named += [(page, t) for line in code(page) for t in re.findall(r"(?:^|[\s(])make ([a-z][\w.-]*)", line)]
        named += [(page, m[1]) for m in re.finditer(r"\bmake (test[\w-]*)", text(page))]
    assert len(named) >= 20
    bad = sorted({f"{rel(page)}: make {t}" for page, t in named if t not in targets})
    assert not bad, "not a Makefile target:\n" + "\n".join(bad)


# -- commands ---------------------------------------------------------------------------------------
def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0].choices if actions else {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def helps(root: argparse.ArgumentParser, path: tuple[str, ...]) -> list[str]:
    """`openft <path> --help` exits 0 (argparse formats the help of the command and of its subcommands)."""
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        root.parse_args([*path, "--help"])
    return [] if exit_.value.code == 0 else [f"openft {' '.join(path)} --help exits {exit_.value.code}"]


def check_command(root: argparse.ArgumentParser, words: list[str], path: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with `openft <path> <words>`: an unknown subcommand, an unknown option, a --help
    that does not exit 0 on the way. Each `a|b` alternative is checked on its own."""
    parser = root
    for name in path:
        parser = subcommands(parser)[name]
    errors = helps(root, path)
    choices = subcommands(parser)
    if choices and words and not words[0].startswith(("-", "[")):
        for name in words[0].split("|"):
            if name not in choices:
                errors.append(f"openft {' '.join((*path, name))}: no such command (choices: {', '.join(choices)})")
            else:
                errors += check_command(root, words[1:], (*path, name))
        return errors
    return errors + [f"openft {' '.join(path)}: no option {o}" for w in words
                     for o in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", w) if o not in options(parser)]  # fmt: skip


def test_every_openft_command_named_parses():
    from entrypoints.cli import build_parser

    parser, named, bad = build_parser(), 0, []
    for page in PAGES:
        for line in code(page):
            for m in re.finditer(r"(?:^|[\s(])openft ((?:[a-z\[-][^\s]*)(?: [^\s]+)*)", line):
                named += 1
                bad += [f"{rel(page)}: {e}" for e in check_command(parser, m[1].split())]
    assert named >= 15, named
    assert not bad, "\n".join(sorted(set(bad)))


# -- routes -----------------------------------------------------------------------------------------
def router_routes(path: Path) -> set[tuple[str, str]]:
    """(method, path below the router's prefix) of every `@router.<method>("...")` in a routers module."""
    tree, prefix, routes = ast.parse(path.read_text()), "", set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "APIRouter":
            prefix = next((k.value.value for k in node.keywords if k.arg == "prefix"), "")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr.upper() in METHODS:
                    routes.add((d.func.attr.upper(), d.args[0].value))
    return {(method, prefix + p) for method, p in routes}


@cache
def app_routes() -> frozenset[tuple[str, str]]:
    """(method, path) of every route serve_app/app.py includes: `v1.include_router(m.router)` under
    v1's prefix, `app.include_router(m.router)` / `(m.router_for())` at the root."""
    tree, prefixes, routes = ast.parse((ROOT / "serve_app/app.py").read_text()), {"app": ""}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(getattr(node.value, "func", None), "id", "") == "APIRouter":
            prefixes[node.targets[0].id] = next(k.value.value for k in node.value.keywords if k.arg == "prefix")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "include_router":
            parent, arg = node.func.value.id, node.args[0]
            if isinstance(arg, ast.Name):  # a local router (v1): its routes come through its own includes
                continue
            module = (arg.func if isinstance(arg, ast.Call) else arg).value.id
            routes |= {(m, prefixes[parent] + p) for m, p in router_routes(ROOT / f"serve_app/routers/{module}.py")}
    return frozenset(routes)


def batch_endpoints() -> tuple[str, ...]:
    for node in ast.parse((ROOT / "serve_app/services/batches.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ENDPOINTS":
            return ast.literal_eval(node.value)
    raise AssertionError("serve_app/services/batches.py has no ENDPOINTS")


SEGMENT = r"(?:\{[^}/]*\}|[^\s/`'\")\],;{}?]+)"
ROUTE = re.compile(rf"(?:((?:{'|'.join(METHODS)})(?:/(?:{'|'.join(METHODS)}))*) )?"
                   rf"(http://127\.0\.0\.1:8000(?=/)|\.\.\.(?=/)|(?=/v1\b))((?:/{SEGMENT})+/?(?:\.\.\.)?)")  # fmt: skip


def route_pattern(path: str, kind: str, prefix: bool) -> re.Pattern:
    """A regex over the app's route templates for the path a page names (see the module docstring)."""
    parts, param = [], r"\{[^}/]+\}"
    for seg in path.strip("/").removesuffix("...").strip("/").split("/"):
        if seg.startswith("{"):
            parts.append(param)
        elif kind.startswith("http"):  # a URL to call: its segments may be values of parameters
            parts.append(rf"(?:{re.escape(seg)}|{param})")
        else:
            parts.append(re.escape(seg))
    body = "/".join(parts)
    prefix = prefix or path.endswith(("/", "..."))
    return re.compile((r".*/" if kind == "..." else "/") + body + (r"(?:/.*)?" if prefix else "") + "$")


def test_every_route_named_exists():
    routes, endpoints, named, bad = app_routes(), batch_endpoints(), 0, []
    for page, m in everywhere(ROUTE):
        methods, kind, path = m[1].split("/") if m[1] else [], m[2], m[3]
        if path.endswith(".") and not path.endswith("..."):  # a sentence's full stop
            path = path[:-1]
        named += 1
        if path in endpoints:
            continue
        pattern = route_pattern(path, kind, prefix=not methods)
        matched = {method for method, p in routes if pattern.match(p)}
        if not matched or not set(methods) <= matched:
            bad.append(f"{rel(page)}: {m[0]!r} (routes there: {sorted(matched) or 'none'})")
    assert named >= 25, named
    assert not bad, "no such route in serve_app/routers/:\n" + "\n".join(bad)


# -- links, paths and the map -----------------------------------------------------------------------
def slugs(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-', repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in split(page)[0].splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_relative_link_resolves():
    named, bad = 0, []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", split(page)[0]):
            if re.match(r"[a-z]+:", target):
                continue
            named += 1
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{rel(page)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
                bad.append(f"{rel(page)}: {target}: no heading #{anchor} in {rel(dest)}")
    assert named >= 15, named
    assert not bad, "\n".join(bad)


@cache
def git_paths() -> tuple[frozenset[str], frozenset[str]]:
    """(every file git tracks or would track, and every directory above one; the top-level directories)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    paths = set()
    for f in listed:
        parts = f.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(paths), frozenset(f.split("/")[0] for f in listed if "/" in f)


# Strings that look like paths but are not, each with the file that names it (so the exception cannot outlive it).
NOT_PATHS = {
    "openft/finetune": "train/integrations/outcome.py",  # a wandb tag
}


def test_every_repository_path_named_exists():
    for name, source in NOT_PATHS.items():
        assert name in (ROOT / source).read_text(), f"{name} is no longer named in {source}: drop it from NOT_PATHS"
    paths, tops = git_paths()
    found = {}
    for page, m in everywhere(rf"(?<![\w./-])((?:{'|'.join(map(re.escape, tops))})/[\w./-]*)(?![\w./<{{*-])"):
        found.setdefault(m[1].rstrip(".").rstrip("/"), rel(page))
    assert len(found) >= 50, len(found)
    missing = sorted(p for p in found if p not in paths and p not in NOT_PATHS)
    if missing:  # build outputs (the dashboard's bundle, bench/out/...) are ignored, not missing
        ignored = subprocess.run(["git", "check-ignore", "--no-index", *missing], cwd=ROOT,
                                 capture_output=True, text=True)  # fmt: skip
        missing = sorted(set(missing) - set(ignored.stdout.split()))
    assert not missing, "no such file or directory:\n" + "\n".join(f"{found[p]}: {p}" for p in missing)


def test_the_readmes_map_has_a_row_per_top_level_directory():
    mapped = re.findall(r"^\| `([\w.-]+)/` \|", text(ROOT / "README.md"), re.M)
    assert len(mapped) == len(set(mapped))
    tops = {t for t in git_paths()[1] if not t.startswith(".")} - {"docs"}
    assert set(mapped) == tops, (f"missing from the map: {sorted(tops - set(mapped))}; "
                                 f"not a directory: {sorted(set(mapped) - tops)}")


# -- docs/tests.md ----------------------------------------------------------------------------------
def test_the_tests_page_names_every_test_target_and_what_ci_runs():
    page = text(ROOT / "docs/tests.md")
    table = set(re.findall(r"^\| `make (test[\w-]*)` \|", page, re.M))
    assert table == {t for t in make_targets() if t.startswith("test")}
    benches = set(re.findall(r"^\| `(?:\.venv/bin/python|python3) (bench/[a-z]\w*\.py)", page, re.M))
    assert benches == {rel(p) for p in (ROOT / "bench").glob("[a-z]*.py")}, "a row per benchmark in docs/tests.md"
    order = re.search(r"`\.ci/run` runs, in this order: (.+?)\. One", page, re.S)
    loop = re.search(r"^for target in ([\w -]+);", (ROOT / ".ci/run").read_text(), re.M)
    assert re.findall(r"`make ([\w-]+)`", order[1]) == loop[1].split()


def test_the_tests_pages_ci_report_is_what_the_report_prints(tmp_path):
    (tmp_path / "times").write_text("test 0 534\ninstall-suites 0 130 beside\ntest-cluster 2 371\n")
    case = '<testcase classname="{}" name="{}" time="{}"/>'.format
    (tmp_path / "test.xml").write_text(
        "<testsuites><testsuite>"
        + case("tests.worker.test_controller", "test_a_cancel_committed_during_a_start_pass_wins", 61.2)
        + case("tests.test_docs", "test_every_route_named_exists", 0.1) + "</testsuite></testsuites>")
    (tmp_path / "test-cluster.xml").write_text(
        "<testsuites><testsuite>"
        + case("tests.cluster.test_cluster", "test_results_on_the_cluster_are_byte_identical_to_one_node", 245.0)
        + "</testsuite></testsuites>")
    spec = importlib.util.spec_from_file_location("ci_report", ROOT / ".ci/report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report.main(tmp_path)
    block = re.search(r"```\n(== CI budget.*?)```", text(ROOT / "docs/tests.md"), re.S)
    assert block and block[1] == printed.getvalue(), printed.getvalue()
