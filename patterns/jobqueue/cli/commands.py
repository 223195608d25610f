"""The commands that run once on the queue: ``enqueue`` and the operator's commands.

``enqueue`` adds a job and prints its id; ``status``, ``show``, ``list`` and ``workers``
read the queue; ``requeue``, ``cancel`` and ``purge`` change it. Each is a function of the
parsed arguments that returns an exit status, run by `patterns.jobqueue.cli.main` from
`COMMANDS`. Each reaches the store through
`~patterns.jobqueue.cli.store_access.with_store`, so it keeps to ``--wait`` and a store
error is one line, exit 2. A command that changed the queue confirms it with
`~patterns.jobqueue.cli.output.confirm`: if that line is lost, the error says what was
changed.

Docs: docs/jobqueue/operations.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from patterns.jobqueue.cli.output import (
    EXIT_OK,
    UsageError,
    confirm,
    out,
    printable,
    shorten,
    table,
    warn,
    when,
)
from patterns.jobqueue.cli.store_access import with_store
from patterns.jobqueue.cli.worker_command import load_registry
from patterns.jobqueue.stores.checks import encode_payload
from patterns.jobqueue.stores.protocol import Store
from patterns.jobqueue.stores.records import (
    FINISHED_STATES,
    CancelResult,
    Job,
    JobState,
    JsonValue,
    WorkerRecord,
)

__all__ = ["COMMANDS"]

_MAX_PAYLOAD_INPUT = 64 * 1024 * 1024  # bytes read from stdin or a file, at most
_SHOWN_ERROR = 60  # characters of a last error on a `list` line


# --- enqueue ----------------------------------------------------------------------------------


def _read_payload(args: argparse.Namespace) -> tuple[str, str]:
    """(the payload's JSON text, where it came from)."""
    if args.payload is not None and args.payload_file is not None:
        raise UsageError("give the payload as JSON_PAYLOAD or --payload-file, not both")
    if args.payload_file is not None:
        where = f"--payload-file {args.payload_file}"
        try:
            with open(args.payload_file, "rb") as file:
                data = file.read(_MAX_PAYLOAD_INPUT + 1)
        except OSError as exc:
            raise UsageError(f"cannot read {where}: {exc.strerror or exc}") from exc
    elif args.payload == "-":
        where = "stdin"
        if sys.stdin is None:  # closed at start-up (<&-)
            raise UsageError("cannot read the payload from stdin: standard input is closed")
        stream = getattr(sys.stdin, "buffer", None)
        try:
            data = (
                stream.read(_MAX_PAYLOAD_INPUT + 1)
                if stream is not None
                else sys.stdin.read(_MAX_PAYLOAD_INPUT + 1).encode()
            )
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the payload from stdin: {exc}") from exc
    elif args.payload is None:
        return "null", "the command line"
    else:
        # An argument that is not UTF-8 arrives as surrogate escapes (PEP 383): its bytes
        # are refused as the same bytes from stdin or a file are, not stored escaped.
        where, data = "the command line", os.fsencode(args.payload)
    if len(data) > _MAX_PAYLOAD_INPUT:
        raise UsageError(f"the payload from {where} is over {_MAX_PAYLOAD_INPUT} bytes")
    try:
        return data.decode("utf-8"), where
    except UnicodeDecodeError as exc:
        raise UsageError(f"the payload from {where} is not UTF-8 text: {exc}") from exc


def _parse_payload(text: str, where: str) -> JsonValue:
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        shown = text if len(text) <= 40 else text[:37] + "..."
        detail = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise UsageError(f"invalid JSON payload {shown!r} from {where}: {detail}") from exc
    try:
        encode_payload(payload)  # NaN, or over the limit: refuse before opening the file
    except (TypeError, ValueError) as exc:
        raise UsageError(f"payload from {where}: {exc}") from exc
    return payload


def _task_defaults(spec: str, name: str) -> dict[str, Any]:
    """The enqueue options the task ``name`` of registry ``spec`` sets; a warning if unknown."""
    registry = load_registry(spec)
    task = registry.get(name)
    if task is None:
        warn(
            f"task {name!r} is not in {spec} (registered: "
            f"{', '.join(sorted(registry)) or 'none'}); enqueued anyway"
        )
        return {}
    options: dict[str, Any] = {"max_attempts": task.max_attempts}
    if task.timeout is not None:
        options["timeout"] = task.timeout
    return options


def _enqueue(args: argparse.Namespace) -> int:
    payload = _parse_payload(*_read_payload(args))
    options = {} if args.tasks is None else _task_defaults(args.tasks, args.task)
    if args.max_attempts is not None:
        options["max_attempts"] = args.max_attempts
    if args.timeout is not None:
        options["timeout"] = args.timeout
    job_id = with_store(
        args,
        lambda store: store.enqueue(args.task, payload, delay=args.delay, **options),
        what="enqueue",
    )
    # The contract: enqueue prints the id. The job is written whether or not it arrives.
    confirm(str(job_id), done=f"job {job_id} was enqueued, but its id could not be printed")
    return EXIT_OK


# --- reading the queue ------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    counts = with_store(args, lambda store: store.counts(), what="count the jobs")
    ordered = {state.value: counts.get(state.value, 0) for state in JobState}
    if args.json:
        out(json.dumps(ordered))
    else:
        for state, count in ordered.items():
            out(f"{state:<9} {count}")
    return EXIT_OK


def _job_json(job: Job) -> dict[str, Any]:
    fields = dataclasses.asdict(job)
    fields["state"] = job.state.value
    fields["fencing_token"] = job.lease_owner
    return fields


def _show(args: argparse.Namespace) -> int:
    def read(store: Store) -> tuple[Job | None, float]:
        return store.get(args.id), store.clock()

    job, now = with_store(args, read, what="read the job")
    if job is None:
        raise UsageError(f"no job {args.id}")
    if args.json:
        out(json.dumps(_job_json(job)))
        return EXIT_OK
    timeout = "none" if job.timeout is None else f"{job.timeout:g} s per attempt"
    rows = [
        ("task", printable(job.task)),
        ("state", job.state.value),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("run at", when(job.run_at, now)),
        ("created", when(job.created_at, now)),
        ("updated", when(job.updated_at, now)),
        ("lease owner", printable(job.lease_owner) if job.lease_owner else "-"),
        ("lease until", when(job.lease_until, now)),
        (
            "fencing token",
            "the lease owner (only that claim may settle the job)" if job.lease_owner else "-",
        ),
        ("timeout", timeout),
        ("cancel requested", "yes" if job.cancel_requested else "no"),
        ("last error", printable(job.last_error) if job.last_error else "-"),
        ("payload", printable(json.dumps(job.payload))),
        ("result", printable(json.dumps(job.result))),
    ]
    out(f"job {job.id}")
    for name, value in rows:
        out(f"  {name:<17}{value}")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    def read(store: Store) -> tuple[list[Job], float]:
        return store.list_jobs(state=args.state, task=args.task, limit=args.limit), store.clock()

    jobs, now = with_store(args, read, what="list the jobs")
    if args.json:
        out(json.dumps([_job_json(job) for job in jobs]))
        return EXIT_OK
    rows = [
        (
            str(job.id),
            job.state.value,
            shorten(job.task, 30),
            f"{job.attempts}/{job.max_attempts}",
            when(job.run_at, now),
            shorten(job.last_error, _SHOWN_ERROR),
        )
        for job in jobs
    ]
    table(("ID", "STATE", "TASK", "ATTEMPTS", "RUN AT", "LAST ERROR"), rows, right=(0,))
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    def read(store: Store) -> tuple[list[WorkerRecord], float]:
        return store.workers(), store.clock()

    records, now = with_store(args, read, what="list the workers")
    if args.json:
        out(json.dumps([dataclasses.asdict(record) for record in records]))
        return EXIT_OK
    if not records:
        out("no live workers")
        return EXIT_OK
    rows = [
        (
            printable(r.id),
            printable(r.host),
            str(r.pid),
            r.state.upper(),
            when(r.started_at, now),
            when(r.last_seen, now),
            str(r.jobs_held),
        )
        for r in records
    ]
    table(("WORKER", "HOST", "PID", "STATE", "STARTED", "LAST SEEN", "JOBS"), rows, right=(2, 6))
    return EXIT_OK


# --- changing jobs ----------------------------------------------------------------------------


def _requeue(args: argparse.Namespace) -> int:
    if args.failed == (args.id is not None):
        raise UsageError("requeue takes a job ID or --failed, exactly one of them")
    if args.task is not None and not args.failed:
        raise UsageError("--task goes with --failed")
    if args.failed:
        ids = with_store(
            args, lambda store: store.requeue_failed(task=args.task), what="requeue jobs"
        )
        confirm(
            f"requeued {len(ids)} job(s){': ' + ' '.join(map(str, ids)) if ids else ''}",
            done=f"{len(ids)} job(s) were requeued, but their ids could not be printed",
        )
        return EXIT_OK

    def one(store: Store) -> tuple[bool, Job | None]:
        if store.requeue(args.id):
            return True, None
        return False, store.get(args.id)

    done, job = with_store(args, one, what="requeue the job")
    if done:
        confirm(
            f"job {args.id} requeued: queued, due now, attempts reset (its last error kept)",
            done=f"job {args.id} was requeued, but this could not be printed",
        )
        return EXIT_OK
    if job is None:
        raise UsageError(f"no job {args.id}")
    raise UsageError(
        f"job {args.id} is {job.state.value}, not failed: only a failed job is requeued"
    )


def _cancel(args: argparse.Namespace) -> int:
    def cancel(store: Store) -> tuple[CancelResult, Job | None]:
        result = store.cancel(args.id)
        return result, (store.get(args.id) if result is CancelResult.FINISHED else None)

    result, job = with_store(args, cancel, what="cancel the job")
    if result is CancelResult.CANCELLED:
        confirm(
            f"job {args.id} cancelled: it was queued and will never run",
            done=f"job {args.id} was cancelled, but this could not be printed",
        )
        return EXIT_OK
    if result is CancelResult.REQUESTED:
        confirm(
            f"job {args.id} is running: cancel requested; its worker's next heartbeat picks "
            "it up (show it to see how it ended)",
            done=f"job {args.id}'s cancel was requested, but this could not be printed",
        )
        return EXIT_OK
    if result is CancelResult.FINISHED:
        state = job.state.value if job is not None else "finished"
        raise UsageError(f"job {args.id} already ended ({state}): nothing to cancel")
    raise UsageError(f"no job {args.id}")


def _purge(args: argparse.Namespace) -> int:
    states = frozenset(args.state) if args.state else FINISHED_STATES

    def purge(store: Store) -> int:
        cutoff = None if args.older_than is None else store.clock() - args.older_than
        return store.purge(older_than=cutoff, states=states)

    count = with_store(args, purge, what="purge jobs")
    confirm(
        f"purged {count} job(s)",
        done=f"{count} job(s) were purged, but their count could not be printed",
    )
    return EXIT_OK


# --- the table main runs a command from ------------------------------------------------------

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "enqueue": _enqueue,
    "status": _status,
    "show": _show,
    "list": _list,
    "requeue": _requeue,
    "cancel": _cancel,
    "purge": _purge,
    "workers": _workers,
}
"""Every command that runs once on the queue (all but ``worker`` and ``demo``), by name."""
