"""Job create: every check of `POST /v1/fine_tuning/jobs`, the quote, and admission under the
account's limits, in the order that refuses before anything is made.

Where it sits: the API's jobs service (serve_app/services/fine_tuning_jobs.py) calls `create` and
turns the row it returns into the wire object. Every check that reads no file's rows runs first
(jobs/params.py, jobs/integrations.py, the open-job limit), then the files' checks and the quote
(jobs/files.py), then, under the account's lock, the limits again and the insert
(jobs/transitions.py `add_new`, `admit`). A batch results file as training_file (the distill
shortcut) is distilled and checked later, by the worker (jobs/distilling.py).
"""

from __future__ import annotations

import secrets
import time

from graders.validate import Rules
from jobs import distilling, limits, transitions
from jobs.model_names import model_checker
from jobs.files import check_files, file_facts, job_files
from jobs.integrations import check_available as check_integrations
from jobs.lineage import copy_parent_adapter, find_parent, names_parent
from jobs.params import ROW_KIND, check_validation_file, file_not_found, parse_create_request
from openft.errors import InvalidRequest
from openft.ids import job_id as new_job_id
from storage import files as files_repo
from storage import jobs as jobs_repo
from storage.context import Context
from storage.leases import lock_account
from storage.models import Account, Job


def create(state: Context, account: Account, body: dict) -> Job:
    parent = None
    if isinstance(body, dict) and names_parent(body.get("model")):
        with state.db.session() as session:
            parent = find_parent(session, account.id, body["model"])
    rules = Rules(check_model=model_checker(state.db, account.id))  # a model grader's model must be the caller's
    spec = parse_create_request(body, seed_factory=lambda: secrets.randbelow(2**31), parent=parent, grader_rules=rules)
    check_integrations(spec.integrations, state.settings)
    with state.db.session() as session:
        limits.check_open_jobs(session, account)  # fail fast; checked again under the lock below
    training, validation = job_files(state, account.id, spec)
    quote = None
    if training.purpose == "batch_output":
        if spec.method_type != "supervised":
            raise InvalidRequest(
                f"training_file is a batch results file, which distills into chat rows; a {spec.method_type} job trains "
                f"on {ROW_KIND[spec.method_type]} rows. Use method.type supervised, or upload "
                f"{ROW_KIND[spec.method_type]} rows with purpose=fine-tune.",
                code="invalid_file_format", param="training_file",
            )
        if validation is not None:
            check_validation_file(spec, file_facts(validation))
        spec = spec.with_derived({"results_file": training.id})
    else:
        quote = check_files(state, spec, training, validation)
    now = state.now()
    with state.db.session() as session:
        lock_account(session, account.id)  # concurrent creates of one account see each other's jobs
        locked = session.get(Account, account.id)
        limits.check_create(session, locked, state.settings, quote.per_token.max_charge_usd if quote else None, now)
        for param, row in (("training_file", training), ("validation_file", validation)):
            if row is not None and files_repo.get_file(session, account.id, row.id) is None:
                raise file_not_found(param)  # deleted while the checks ran
        job = Job(
            id=new_job_id(), account_id=account.id, model=spec.model,
            created_at=now, created_ns=time.time_ns(), training_file=spec.training_file,
            validation_file=spec.validation_file, seed=spec.seed, spec=spec.record(),
            job_metadata=spec.metadata or None, user_provided_suffix=spec.suffix,
            quote=quote.record() if quote else {}, estimated_finish=quote.estimated_finish(now) if quote else None,
            result_files=[], updated_at=now,
        )
        if parent is not None:
            # Before the insert commits: a job row never exists without its starting adapter.
            copy_parent_adapter(state.store, parent, job.id)
        transitions.add_new(session, job, now)
        if "suffix_ignored" in spec.warnings:
            jobs_repo.add_event(
                session, job.id, now, "suffix_ignored: suffix is accepted but not used for model names yet.",
                level="warn", data={"code": "suffix_ignored"},
            )
        if quote is None:
            distilling.begin(session, job, now)
        else:
            transitions.admit(session, job, now)
        return job
