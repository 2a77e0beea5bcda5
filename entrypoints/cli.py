"""The `openft` command: serve, accounts, demo."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from openft.settings import Settings


CONTROLLER_CHECK_S = 5.0
# After SIGTERM, beyond the grace given to requests in flight: Serve's own stop and ray.shutdown()
# (about 2 s each on an idle machine); past it the leftovers are killed.
SHUTDOWN_MARGIN_S = 4.0


def _settings(args: argparse.Namespace, **overrides) -> Settings:
    """Every operator command's settings, its data dir from `--data-dir`, else OPENFT_DATA_DIR, else
    the default (`./.openft`), named on stderr: an account created in one data dir has a key that
    a server on another answers 401 (stderr, so that `accounts create`'s last stdout line stays the key)."""
    values = {k: v for k, v in overrides.items() if v is not None}
    if getattr(args, "data_dir", None) is not None:
        values["data_dir"] = Path(args.data_dir)
    settings = Settings(**values)
    source = "--data-dir" if "data_dir" in values else "OPENFT_DATA_DIR" if "data_dir" in settings.model_fields_set else "default"
    print(f"openft: data dir {settings.data_dir} (from {source})", file=sys.stderr, flush=True)
    return settings


def _check_configuration(settings: Settings) -> int:
    """Exit status 2 with each problem on stderr when the configuration cannot work, else 0; runs
    before Ray starts, so a bad URL fails in seconds, not after Serve's deployment retries."""
    from entrypoints.preflight import check_configuration

    problems = check_configuration(settings)
    for problem in problems:
        print(f"openft: configuration error: {problem}", file=sys.stderr, flush=True)
    return 2 if problems else 0


def _check_cluster(settings: Settings) -> int:
    """Exit status 2 (Ray stopped again) when the cluster can never run a job's Train workers, else 0."""
    import ray

    from entrypoints.preflight import check_cluster

    problems = check_cluster(settings)
    for problem in problems:
        print(f"openft: configuration error: {problem}", file=sys.stderr, flush=True)
    if problems:
        ray.shutdown()
    return 2 if problems else 0


def cmd_serve(args: argparse.Namespace) -> int:
    from entrypoints.ray_runtime import prepare_ray_environment

    settings = _settings(args)
    if status := _check_configuration(settings):
        return status
    if not settings.ray_address:
        prepare_ray_environment(settings)

    from entrypoints.ray_runtime import deploy_api, start_ray

    from worker.controller import ensure_controller

    context = start_ray(settings, host=args.host)
    if status := _check_cluster(settings):
        return status
    base_url = deploy_api(settings, host=args.host, port=args.port)
    # Held for the life of the command: a non-detached actor whose last handle goes is destroyed.
    controller = ensure_controller(settings)
    dashboard = getattr(context, "dashboard_url", None)
    if dashboard:
        token = "" if settings.ray_address else f" (token: {settings.data_dir.resolve() / 'ray_auth_token'})"
        print(f"Ray dashboard: http://{dashboard}{token}", flush=True)
    # Printed last: scripts wait for this line to know the API is up.
    print(f"openft API: {base_url}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # The checks run beside the main thread, which only waits for the signal: a check stuck in
    # Ray (its GCS going down with the same SIGTERM) must not delay the shutdown.
    threading.Thread(target=_keep_controller, args=(settings, controller, stop), daemon=True).start()
    stop.wait()
    print("shutting down", flush=True)
    _shut_down(settings)


def _keep_controller(settings: Settings, controller, stop: threading.Event) -> None:
    """The controller actor restarts itself after a crash; one that is gone for good (killed with
    no restart, or lost with its node) is started again here."""
    from worker.controller import ensure_controller

    while not stop.wait(CONTROLLER_CHECK_S):
        try:
            controller = ensure_controller(settings, controller)
        except Exception as exc:  # Ray unreachable for a moment: try again at the next check
            print(f"openft: controller check failed: {type(exc).__name__}", file=sys.stderr, flush=True)


def _shut_down(settings: Settings) -> NoReturn:
    """Stop Serve and Ray and exit 0, within `shutdown_grace_seconds` + SHUTDOWN_MARGIN_S whatever
    Ray does: past that, what is left of the local cluster is killed."""
    from entrypoints.ray_runtime import descendants, kill_leftovers, stop_serving

    processes = descendants()

    def _exit() -> NoReturn:
        kill_leftovers(processes)
        # Ray has stopped; what is left is the interpreter's teardown of Ray's core worker, torch
        # and pyarrow, measured at 6 s and more on 2 busy cores. Nothing of ours needs it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(settings.shutdown_grace_seconds + SHUTDOWN_MARGIN_S, _exit)
    timer.daemon = True
    timer.start()
    stop_serving(settings)
    _exit()


def cmd_accounts_create(args: argparse.Namespace) -> int:
    from storage.accounts import create_account
    from jobs.limits import set_open_jobs
    from storage.db import Database

    settings = _settings(args)
    db = Database(settings.resolved_database_url())
    with db.session() as session:
        account, key = create_account(
            session, args.name, open_jobs_limit=args.open_jobs or settings.new_account_open_jobs
        )
        if args.open_jobs:  # an explicit limit: a first deposit does not raise it
            set_open_jobs(session, account, args.open_jobs)
        print(f"account {account.name} ({account.org_id})")
    print(key)
    return 0


def _operator_command(args: argparse.Namespace, call, *, last_line=None) -> int:
    """Run `call(db, settings, now)` (a service function's answer: a pydantic model) and print it as
    JSON; a refusal prints its message on stderr and exits 2. `last_line(answer)`: a line printed
    after it (a new key, so that it is the last stdout line, as `accounts create` prints it)."""
    import time

    from pydantic import ValidationError

    from openft.errors import ServiceError
    from storage.db import Database

    settings = _settings(args)
    db = Database(settings.resolved_database_url())
    try:
        answer = call(db, settings, int(time.time()))
    except ServiceError as exc:
        print(f"openft: {exc.message}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # an option out of its range: its name and the rule, not the value
        first = exc.errors()[0]
        print(f"openft: --{str(first['loc'][-1]).replace('_', '-')}: {first['msg']}", file=sys.stderr)
        return 2
    finally:
        db.dispose()
    print(answer.model_dump_json(indent=2, exclude={"value"}))
    if last_line is not None:
        print(last_line(answer))
    return 0


def cmd_accounts_credit(args: argparse.Namespace) -> int:
    from serve_app.services import billing

    return _operator_command(args, lambda db, settings, now: billing.add_credit(
        db, settings, args.name, args.usd, now, note=args.note))


def cmd_accounts_show(args: argparse.Namespace) -> int:
    from serve_app.services import billing

    return _operator_command(args, lambda db, settings, now: billing.account_summary(db, settings, args.name, now))


def cmd_accounts_limits(args: argparse.Namespace) -> int:
    from serve_app.services import billing

    return _operator_command(args, lambda db, settings, now: billing.set_limits(
        db, settings, args.name, now, open_jobs=args.open_jobs, usd_per_day=args.usd_per_day, models=args.models))


def cmd_keys_list(args: argparse.Namespace) -> int:
    from serve_app.services import api_keys

    return _operator_command(args, lambda db, settings, now: api_keys.list_keys(
        db, api_keys.account_id_of(db, args.account), limit=100, after=args.after))


def cmd_keys_create(args: argparse.Namespace) -> int:
    from serve_app.schemas.api_keys import ApiKeyCreateRequest
    from serve_app.services import api_keys

    return _operator_command(args, lambda db, settings, now: api_keys.create_key(
        db, settings, api_keys.account_id_of(db, args.account),
        ApiKeyCreateRequest(name=args.name, expires_in_seconds=args.expires_in_seconds), now),
        last_line=lambda made: made.value)


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from serve_app.services import api_keys

    return _operator_command(args, lambda db, settings, now: api_keys.revoke_key(
        db, api_keys.account_id_of(db, args.account), args.key_id, now))


def cmd_demo(args: argparse.Namespace) -> int:
    from entrypoints.demo import run_demo

    settings = _settings(args, model_source="standin")
    if status := _check_configuration(settings):
        return status
    return run_demo(settings, host=args.host, port=args.port)


def build_parser() -> argparse.ArgumentParser:
    """Every `openft` command, the operator's and the users' (tests/test_docs.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(prog="openft", description="OpenAI-compatible fine-tuning on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve_p = sub.add_parser("serve", help="start (or join) Ray and serve the API")
    serve_p.add_argument("--host", default="127.0.0.1")
    serve_p.add_argument("--port", type=int, default=8000)
    serve_p.add_argument("--data-dir", default=None)
    serve_p.set_defaults(func=cmd_serve)

    accounts = sub.add_parser("accounts", help="manage accounts").add_subparsers(dest="action", required=True)
    create = accounts.add_parser("create", help="create an account; prints its API key as the last line")
    create.add_argument("name")
    create.add_argument("--data-dir", default=None)
    create.add_argument("--open-jobs", type=int, default=None)
    create.set_defaults(func=cmd_accounts_create)

    credit = accounts.add_parser("credit", help="add USD credit to an account (the ledger's deposit)")
    credit.add_argument("name")
    credit.add_argument("usd", help="whole cents, e.g. 25.00")
    credit.add_argument("--note", default=None)
    credit.add_argument("--data-dir", default=None)
    credit.set_defaults(func=cmd_accounts_credit)

    show = accounts.add_parser("show", help="an account's balance, holds, usage and limits")
    show.add_argument("name")
    show.add_argument("--data-dir", default=None)
    show.set_defaults(func=cmd_accounts_show)

    limits = accounts.add_parser("limits", help="set an account's limits")
    limits.add_argument("name")
    limits.add_argument("--open-jobs", type=int, default=None)
    limits.add_argument("--usd-per-day", default=None)
    limits.add_argument("--models", type=int, default=None)
    limits.add_argument("--data-dir", default=None)
    limits.set_defaults(func=cmd_accounts_limits)

    keys = accounts.add_parser("keys", help="an account's API keys").add_subparsers(dest="keys_action", required=True)
    keys_list = keys.add_parser("list", help="its working keys, newest first (never the keys themselves)")
    keys_list.add_argument("account", help="the account's name or id")
    keys_list.add_argument("--after", default=None, help="the last key id of the previous page")
    keys_list.add_argument("--data-dir", default=None)
    keys_list.set_defaults(func=cmd_keys_list)
    keys_create = keys.add_parser("create", help="a new key; prints it as the last line, once")
    keys_create.add_argument("account", help="the account's name or id")
    keys_create.add_argument("--name", required=True, help="what the key is for")
    keys_create.add_argument("--expires-in-seconds", type=int, default=None, help="omit for a key that does not expire")
    keys_create.add_argument("--data-dir", default=None)
    keys_create.set_defaults(func=cmd_keys_create)
    keys_revoke = keys.add_parser("revoke", help="revoke a key: it answers 401 on every replica from now on")
    keys_revoke.add_argument("account", help="the account's name or id")
    keys_revoke.add_argument("key_id", help="key_..., as `keys list` shows it")
    keys_revoke.add_argument("--data-dir", default=None)
    keys_revoke.set_defaults(func=cmd_keys_revoke)

    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded defaults")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    demo.add_argument("--data-dir", default=None)
    demo.set_defaults(func=cmd_demo)

    from entrypoints.user_cli import add_user_commands

    add_user_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
