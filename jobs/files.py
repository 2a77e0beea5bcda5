"""A job's files and the admission checks that read them: the files table's rules, the quote, and
the base's chat template over every row.

Where it sits: job create (serve_app/services/fine_tuning_jobs.py) runs `check_files` in the
request; the distill shortcut (jobs/distilling.py `distill_job`) runs the same checks on the files
it derived, on a worker thread, and turns a refusal into the job's failure.
"""

from __future__ import annotations

from catalog.bases import get_base
from jobs import reinforcement
from jobs.params import FileFacts, check_job_files, file_not_found
from jobs.quote import Quote, quote_job
from jobs.spec import JobSpec
from pipelines.create_checks import check_file_for_base
from storage import files as files_repo
from storage.context import Context
from storage.models import File


def file_facts(row: File) -> FileFacts:
    stats = row.stats or {}
    return FileFacts(
        id=row.id, purpose=row.purpose, status=row.status, bytes=row.bytes, row_kind=stats.get("row_kind"),
        rows=stats.get("rows", 0), messages=stats.get("messages", 0), content_bytes=stats.get("content_bytes", 0),
        token_upper_bound=stats.get("token_upper_bound", 0), token_estimates=stats.get("token_estimates", {}),
    )


def job_files(state: Context, account_id: str, spec: JobSpec) -> tuple[File, File | None]:
    """The spec's training and validation rows of the account; `file_not_found` for a missing one."""
    with state.db.session() as session:
        training = files_repo.get_file(session, account_id, spec.training_file)
        validation = files_repo.get_file(session, account_id, spec.validation_file) if spec.validation_file else None
    if training is None:
        raise file_not_found("training_file")
    if spec.validation_file and validation is None:
        raise file_not_found("validation_file")
    return training, validation


def check_files(state: Context, spec: JobSpec, training: File, validation: File | None) -> Quote:
    """Every admission rule on the files (raising its refusal), then the quote."""
    facts = file_facts(validation) if validation is not None else None
    check_job_files(spec, file_facts(training), facts)
    settings = state.settings
    quote = quote_job(spec, file_facts(training), facts, settings.prices, time_limit_s=settings.job_time_limit_seconds)
    base = get_base(spec.model)
    item_refs = reinforcement.references(spec.grader) if spec.grader else ()
    for param, row in (("training_file", training), ("validation_file", validation)):
        if row is not None:
            check_file_for_base(
                state.store.spec(), row.object_key, row_kind=row.stats["row_kind"], base=base, references=item_refs,
                model_source=settings.model_source, cache_root=settings.model_cache_dir, param=param,
                inline_bytes=settings.validate_ray_threshold_bytes, block_bytes=settings.validate_block_bytes,
                name=f"{row.id} check {base.id}",
            )
    return quote
