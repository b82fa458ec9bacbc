"""The SLURM scheduler: one tune_magic job is one SLURM batch job, on any number of nodes.

Through the engine itself — ``sbatch`` to submit, ``squeue`` to follow, ``scancel`` to stop —
never a scheduler of our own. The job's directory (record, batch script, combined log, exit code)
lives under ``TUNE_MAGIC_HOME``, which must be on a filesystem every node shares; the batch job's
output file is the job's combined log, so following it and the loss card work as for local jobs.

Status comes from the exit file the batch script writes (a job with it never queries squeue),
else from squeue: at most one ``squeue --jobs=... --json`` per process every
:data:`SQUEUE_INTERVAL_S` seconds for every live SLURM job at once, shared by every card and
listing (a plain ``--format`` query where ``--json`` fails). ``sacct`` is not needed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from tune_magic import faultpoints
from tune_magic.logs import ending
from tune_magic.registry import outcome
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import Evidence, decide
from tune_magic.errors import JobStartError, PlanError
from tune_magic.paths import home
from tune_magic.registry.store import PENDING, RUNNING, UNKNOWN, JobRecord
from tune_magic.registry.status import Status
from tune_magic.schedulers.base import Scheduler, SchedulerOptions
from tune_magic.schedulers.slurm.plan import place
from tune_magic.schedulers.slurm import options as sopts
from tune_magic.schedulers.slurm import squeue as sq
from tune_magic.schedulers.slurm.script import batch_script, directives, sbatch_argv
from tune_magic.schedulers.slurm.nodelocal import node_local_warnings
from tune_magic.schedulers.slurm.tail import TAIL_RULES

#: Seconds between squeue queries in one process (all live SLURM jobs in one query).
SQUEUE_INTERVAL_S = 5.0
#: Seconds a job may be missing from squeue without an exit file before it is called failed.
MISSING_GRACE_S = 60.0
#: Seconds to wait for a SLURM client command.
CLIENT_TIMEOUT_S = 60.0
#: The batch script's file name in the job directory.
SCRIPT = "job.sbatch"

_CLIENTS_MISSING = ("--scheduler slurm needs SLURM's client tools (sbatch, squeue, scancel) on PATH: install them "
                    "(e.g. apt install slurm-client, or load your cluster's slurm module), or use --scheduler local")


def _client_env(env: Mapping[str, str] | None, record: JobRecord | None = None) -> dict[str, str]:
    """The environment SLURM clients run with: the caller's, without a surrounding job's
    ``SLURM_*`` variables, and with the job's own ``SLURM_CONF`` (the cluster it went to)."""
    out, _ = sopts.sbatch_env(os.environ if env is None else env)
    conf = record.backend.get("conf") if record is not None else None
    if conf:
        out["SLURM_CONF"] = conf
    return out


def _run(argv: list[str], env: Mapping[str, str], timeout: float = CLIENT_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout)


class SqueueWatcher:
    """One process's view of squeue: at most one query every :data:`SQUEUE_INTERVAL_S` seconds,
    for every live SLURM job of the registry at once (so a listing of many jobs and many cards
    cost one query). A job that was not among the last query's ids is "not asked yet", never
    "gone"."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._asked: frozenset[str] = frozenset()
        self._jobs: dict[str, sq.SlurmJob] = {}
        self.queries = 0  #: squeue runs by this process (tests and benchmarks read it)

    def get(self, slurm_id: str, env: Mapping[str, str]) -> "sq.SlurmJob | None | bool":
        """Return squeue's view of ``slurm_id``: the job, ``None`` when squeue did not list it,
        or ``False`` when it has not been asked about yet (or squeue failed)."""
        with self._lock:
            now = time.monotonic()
            if now - self._last >= SQUEUE_INTERVAL_S:
                self._last = now
                self._query(env, extra=slurm_id)
            if slurm_id not in self._asked:
                return False
            return self._jobs.get(slurm_id)

    def forget(self) -> None:
        """Drop what is cached (the next get() queries at once)."""
        with self._lock:
            self._last = float("-inf")

    def _query(self, env: Mapping[str, str], extra: str) -> None:
        ids = {extra}
        try:
            for r in jobstore.list_records():
                if r.scheduler == "slurm" and not r.state.is_terminal:
                    slurm_id = r.backend.get("job_id") or r.extra.get("slurm_job_id")  # schema 2 kept it on top
                    if isinstance(slurm_id, str) and slurm_id:
                        ids.add(slurm_id)
        except Exception:  # a listing problem never blocks the query for this job
            pass
        ids = sorted(ids, key=lambda x: int(x.split("_")[0]) if x.split("_")[0].isdigit() else 0)
        self.queries += 1
        try:
            r = _run(sq.squeue_argv(ids, json_output=True), env)
            jobs = sq.parse_squeue_json(r.stdout, ids) if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, sq.SqueueParseError, ValueError):
            jobs = None
        if jobs is None:  # older or odd squeue: the plain format
            try:
                r = _run(sq.squeue_argv(ids, json_output=False), env)
                # exit 1 lists nothing when the ids are unknown; an unreachable controller or a
                # timeout also exits 1, and that is no answer at all
                answered = r.returncode == 0 or (r.returncode == 1 and "Invalid job id" in r.stderr)
                jobs = sq.parse_squeue_format(r.stdout) if answered else None
            except (OSError, subprocess.SubprocessError, sq.SqueueParseError, ValueError):
                jobs = None
        if jobs is None:
            self._asked = frozenset()  # squeue failed: nothing is known, nothing is "gone"
            return
        self._asked = frozenset(ids)
        self._jobs = {k: v for k, v in jobs.items() if k in self._asked}


WATCHER = SqueueWatcher()


def parse_sbatch_id(out: str) -> str | None:
    """SLURM's job id from sbatch's answer: ``--parsable`` gives ``123`` or ``123;cluster``; a site
    wrapper may still print ``Submitted batch job 123``. ``None`` when there is no id."""
    for line in reversed(out.strip().splitlines()):
        first = line.strip().split(";")[0].strip()
        if re.fullmatch(r"\d+(_\d+)?", first):
            return first
        m = re.search(r"Submitted batch job (\d+)", line)
        if m:
            return m.group(1)
    return None


def find_by_name(job_id: str, env: Mapping[str, str]) -> str | None:
    """SLURM's id of the job submitted as ``tune_magic-<job_id>`` (a launcher killed between
    sbatch and recording the id leaves only the name), or ``None``."""
    try:
        r = _run(["squeue", f"--name=tune_magic-{job_id}", "--states=all", "--noheader", "--format=%i"], env)
    except (OSError, subprocess.SubprocessError):
        return None
    ids = [line.strip() for line in r.stdout.splitlines() if line.strip().isdigit()]
    return ids[0] if r.returncode == 0 and ids else None


def _directive_names(script: str) -> set[str]:
    """The long names of the sbatch options a batch script's ``#SBATCH`` lines set."""
    names: set[str] = set()
    for line in script.splitlines():
        if not line.startswith("#SBATCH "):
            continue
        for word in shlex.split(line[len("#SBATCH "):], comments=True):
            if word.startswith("--"):
                names.add(word[2:].split("=", 1)[0])
            elif word.startswith("-") and len(word) > 1:
                names.update(sopts.short_names(word))
    return names


def _gpus_asked(options: SchedulerOptions, words: tuple[str, ...]) -> bool:
    if options.get("gpus_per_node"):
        return True
    return any(w.startswith(("--gres=gpu", "--gpus", "-G", "--gpus-per-task", "--gpus-per-node")) or
               ("gpu" in w and w.startswith("--gres")) for w in words)


class SlurmScheduler(Scheduler):
    """Jobs as SLURM batch jobs (see the module docstring)."""

    name = "slurm"
    options = sopts.OPTIONS
    initial_status = Status.PENDING
    engine_id_label = "SLURM ID"
    tail_rules = TAIL_RULES

    def available(self, env: Mapping[str, str]) -> str | None:
        if shutil.which("sbatch", path=env.get("PATH")) is None:
            return _CLIENTS_MISSING
        return None

    def status_note(self, env: Mapping[str, str]) -> str | None:
        """sbatch alone says nothing of the controller: ``sinfo`` must answer too."""
        from tune_magic.schedulers.slurm.sinfo import controller_note

        return controller_note(env)

    def place(self, spec, options: SchedulerOptions):
        return place(spec, nodes=options.get("nodes"), gpus_per_node=options.get("gpus_per_node"))

    # -- the record ---------------------------------------------------------------------------
    def migrate(self, record: JobRecord) -> None:
        """Records of schema 2 kept SLURM's id, its config file and the time limit at the top level."""
        for old, new in (("slurm_job_id", "job_id"), ("slurm_conf", "conf")):
            if old in record.extra:
                value = record.extra.pop(old)
                if value is not None:
                    record.backend.setdefault(new, value)
        if "time_limit" in record.extra:
            value = record.extra.pop("time_limit")
            if value is not None:
                record.scheduler_options.setdefault("time_limit", value)

    def engine_id(self, record: JobRecord) -> str | None:
        """SLURM's job id, once sbatch answered."""
        return record.backend.get("job_id")

    # -- launching ----------------------------------------------------------------------------
    def prepare(self, plan, options: SchedulerOptions, env: Mapping[str, str], job_dir: Path) -> dict[str, Any]:
        time_limit = options.get("time_limit")
        extra = sopts.check_sbatch_options(list(options.get("sbatch", ())))
        if plan.recipe_source == "torchtune" and (plan.recipe_name or "").endswith("_distributed") \
                and not _gpus_asked(options, extra.argv):
            raise PlanError(f"torchtune's {plan.recipe_name} initialises NCCL, which needs GPUs: ask SLURM for them with "
                            "--gpus-per-node G (or run tune_magic's own recipes, which use gloo on CPUs)")
        nodes = int(plan.nnodes or 1)
        warnings = list(plan.warnings)
        if not options.get("cpus_per_node"):
            warnings.append("no --cpus-per-node: the torchrun agent and all its workers on a node share SLURM's "
                            "default CPUs per task (often 1); add --cpus-per-node C")
        _, env_warnings = sopts.sbatch_env(env)
        warnings += env_warnings
        if shutil.which("sbatch", path=env.get("PATH")) is None:  # a dry run still shows the script
            warnings.append("sbatch is not on PATH here: " + _CLIENTS_MISSING.split(" on PATH: ", 1)[1])
        warnings += node_local_warnings(plan, env, home=str(home(env)), python=sys.executable)
        lines = directives(job_id=plan.job_id, job_dir=str(job_dir), cwd=plan.cwd or os.getcwd(), nodes=nodes,
                           gpus_per_node=options.get("gpus_per_node"), cpus_per_node=options.get("cpus_per_node"),
                           partition=options.get("partition"), time_limit=time_limit, account=options.get("account"),
                           user_options=[shlex.split(v) for v in options.get("sbatch", ())], requeue=extra.requeue)
        script = batch_script(plan, job_id=plan.job_id, job_dir=str(job_dir), cwd=plan.cwd or os.getcwd(),
                              python=sys.executable, nodes=nodes, cpus_per_node=options.get("cpus_per_node"),
                              rdzv_conf=plan.rdzv_conf, user_endpoint=plan.rendezvous == "user", sbatch_lines=lines)
        argv = sbatch_argv(str(job_dir / SCRIPT))
        return {"batch_script": script, "submit_argv": argv, "warnings": warnings}

    def submit(self, job_dir: Path, record: JobRecord, plan, options: SchedulerOptions, env: Mapping[str, str],
               lock_fd: int | None) -> None:
        if shutil.which("sbatch", path=env.get("PATH")) is None:
            raise PlanError(_CLIENTS_MISSING)
        script = job_dir / SCRIPT
        fd = jobstore.open_nofollow(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "w") as f:
            f.write(plan.batch_script)
        client_env, _ = sopts.sbatch_env(env)
        client_env.pop("CUDA_VISIBLE_DEVICES", None)  # the kernel's GPUs are not the job's: SLURM allocates them
        for name in sopts.env_variables_of(_directive_names(plan.batch_script)):
            client_env.pop(name, None)  # sbatch would let it win over the script's #SBATCH line
        try:
            r = _run(list(plan.submit_argv), client_env)
        except subprocess.TimeoutExpired:
            # it may still have queued the job: keep the record; the next look finds it by name
            raise JobStartError(f"sbatch did not answer within {CLIENT_TIMEOUT_S:.0f} s; job {record.id} stays listed "
                                f"and is found in squeue as tune_magic-{record.id} if SLURM took it (else it is marked "
                                f"failed after {MISSING_GRACE_S:.0f} s)") from None
        except OSError as exc:
            raise PlanError(f"sbatch could not run ({exc}); nothing was submitted") from None
        if r.returncode != 0:
            message = " ".join((r.stderr or r.stdout).split()) or f"exit code {r.returncode}"
            raise PlanError(f"sbatch refused the job: {message}")
        slurm_id = parse_sbatch_id(r.stdout)
        if slurm_id is None:
            slurm_id = find_by_name(record.id, client_env)
        if slurm_id is None:
            raise JobStartError(f"sbatch answered {r.stdout.strip()[:200]!r}, not a job id, and squeue lists no "
                                f"tune_magic-{record.id}; see {job_dir}")
        faultpoints.reached("sbatch-returned")  # fault tests: the launcher dies before it records SLURM's id
        backend = {"job_id": slurm_id}
        if client_env.get("SLURM_CONF"):
            backend["conf"] = client_env["SLURM_CONF"]
        jobstore.update(job_dir, backend=backend)

    # -- following ----------------------------------------------------------------------------
    def describe(self, job_dir: Path, record: JobRecord) -> dict[str, Any]:
        """Settle from the exit file the batch script wrote, else from squeue (one query every
        :data:`SQUEUE_INTERVAL_S` for all jobs), through the outcome rule
        (:func:`tune_magic.registry.outcome.decide`)."""
        state = record.state
        if state.is_terminal:
            return {}
        changes, started = self._from_log(job_dir, record)
        exit_info = jobstore.read_exit_code(job_dir)
        if exit_info is not None:
            verdict, verdict_reason = self._failure_verdict(record)
            evidence, reason = ending.evidence(job_dir, record, exit_info.returncode, nothing_runs=True,
                                               with_host=True, verdict=verdict, verdict_reason=verdict_reason)
            ending.keep_failure(job_dir, reason)
            return {**changes, **ending.changes(decide(evidence), record, exit_info.ended_at), "pending_reason": None}
        env = _client_env(None, record)
        slurm_id = self.engine_id(record)
        if slurm_id is None:
            if jobstore.lock_is_held(job_dir / jobstore.SUPERVISOR_LOCK):
                return changes  # the launcher is submitting it right now
            slurm_id = find_by_name(record.id, env)
            if slurm_id is None:
                if time.time() - record.started_at > MISSING_GRACE_S:
                    gone = f"the submission did not complete: squeue lists no job tune_magic-{record.id}"
                    changes.update(self._end(job_dir, record, Evidence(verdict=outcome.FAILED, verdict_reason=gone,
                                                                       nothing_runs=True)))
                return changes
            changes["backend"] = {**record.backend, "job_id": slurm_id}
        job = WATCHER.get(slurm_id, env)
        if job is False:  # no fresh squeue answer yet
            if started and state is Status.PENDING:
                changes.update(status=RUNNING, pending_reason=None)
            return changes
        if job is None:
            return {**changes, **self._not_listed(job_dir, record, slurm_id)}
        # a requeued job's log holds its earlier attempt: SLURM's fresh word outvotes it
        return {**changes, **self._listed(job_dir, record, job, started)}

    def _failure_verdict(self, record: JobRecord) -> tuple[str | None, str | None]:
        """SLURM's own failure verdict on a job that left an exit file (a time limit, a node failure,
        out of memory: the exit file alone can say 0 then), from the shared squeue answer; ``(None,
        None)`` when squeue has none or does not answer."""
        slurm_id = self.engine_id(record)
        if not slurm_id:
            return None, None
        WATCHER.forget()  # once per job's end: an answer from before the exit file may predate the failure
        job = WATCHER.get(slurm_id, _client_env(None, record))
        if not job:
            return None, None
        said = sq.job_outcome(job, time_limit=record.scheduler_options.get("time_limit"))
        if said.verdict in (outcome.TIMEOUT, outcome.NODE_FAIL, outcome.OUT_OF_MEMORY):
            return said.verdict, said.reason
        return None, None

    def _end(self, job_dir: Path, record: JobRecord, evidence: Evidence) -> dict[str, Any]:
        """Record fields for the end :func:`decide` makes of ``evidence`` (``{}``: not ended)."""
        end = decide(evidence)
        if end is None or end.status is record.state:
            return {}
        return {**ending.changes(end, record, time.time()), "pending_reason": None}

    def _not_listed(self, job_dir: Path, record: JobRecord, slurm_id: str) -> dict[str, Any]:
        """squeue no longer lists the job and it left no exit code: ``unknown``, then ``failed``
        saying so after :data:`MISSING_GRACE_S` (``stopped`` when a stop was asked)."""
        missing_since = record.backend.get("missing_since")
        if record.state is Status.UNKNOWN and isinstance(missing_since, (int, float)):
            if time.time() - missing_since <= MISSING_GRACE_S:
                return {}
            gone = f"SLURM no longer lists job {slurm_id} and it left no exit code in {job_dir}; its outcome cannot be known"
            return self._end(job_dir, record, Evidence(verdict=outcome.FAILED, verdict_reason=gone, nothing_runs=True))
        evidence, _ = ending.evidence(job_dir, record, None, nothing_runs=True)
        changes = self._end(job_dir, record, evidence)
        if changes.get("status") is Status.UNKNOWN:
            changes["backend"] = {**record.backend, "missing_since": time.time()}
        return changes

    def _listed(self, job_dir: Path, record: JobRecord, job: sq.SlurmJob, started: bool) -> dict[str, Any]:
        """squeue lists the job: its queue state, or its end (SLURM's verdict) when it ended
        without an exit file (the exit file, written just before, wins when it turns up first)."""
        stop = jobstore.stop_was_requested(job_dir, record)
        time_limit = record.scheduler_options.get("time_limit")
        said = sq.job_outcome(job, stopped_by_us=stop, time_limit=time_limit)
        changes: dict[str, Any] = {"nodes": list(job.nodes)} if job.nodes else {}
        if said.status is Status.PENDING and started and not job.restart_count:  # an answer older than the start
            changes.update(status=RUNNING, pending_reason=None)
        elif said.status is Status.PENDING:
            changes.update(status=PENDING, pending_reason=said.reason)
        elif said.verdict is None:  # running, or a state we do not map: it exists
            changes.update(status=RUNNING, pending_reason=said.reason)
        else:
            reason = said.reason
            if job.state == "TIMEOUT" and not time_limit and reason:  # the partition's limit, not one we set
                reason = reason.replace("the --time limit", "the partition's time limit")
            evidence, failure = ending.evidence(job_dir, record, job.exit_code, verdict=said.verdict,
                                                verdict_reason=reason, nothing_runs=True, with_host=True)
            ending.keep_failure(job_dir, failure)
            changes.update(self._end(job_dir, record, evidence))
        return changes

    @staticmethod
    def _from_log(job_dir: Path, record: JobRecord) -> tuple[dict[str, Any], bool]:
        """Nodes, ranks and the rendezvous endpoint the batch script printed (via the summary), as record
        changes, and whether the log shows the batch script started (it printed its nodes, the endpoint or
        a step)."""
        from tune_magic.logs.summary import current_summary

        s = current_summary(job_dir, record, kept=False, final=False)
        out: dict[str, Any] = {}
        if s.endpoint and s.endpoint != record.rendezvous_endpoint and record.rendezvous != "user":
            out["rendezvous_endpoint"] = s.endpoint
        if s.nodes and sorted(s.nodes) != sorted(record.nodes or []):
            out["nodes"] = sorted(s.nodes)
        hosts = [{"host": h, "rank": r} for h, r in s.rank_hosts]
        if hosts and hosts != record.rank_hosts:
            out["rank_hosts"] = hosts
        # only a batch script that SLURM started prints these; squeue read up to 5 s ago may still say PENDING
        return out, bool(s.nodes or s.endpoint or s.step is not None)

    def keeps_summary(self, job_dir: Path, record: JobRecord) -> bool:
        return False

    # -- stopping -----------------------------------------------------------------------------
    def cancel(self, job_dir: Path, record: JobRecord | None, grace_s: float) -> None:
        if record is not None and record.state.is_terminal:
            return
        jobstore.mark_stop_requested(job_dir)
        env = _client_env(None, record)
        # a damaged record: the job is still findable, by the name it was submitted with
        slurm_id = (self.engine_id(record) if record is not None else None) or find_by_name(job_dir.name, env)
        if slurm_id is None:
            return
        WATCHER.forget()
        job = WATCHER.get(slurm_id, env)
        if job and sq.job_outcome(job).status is Status.PENDING:
            _run(["scancel", slurm_id], env)
        else:
            # the agents forward SIGTERM to their workers; what ignores it goes after the grace
            _run(["scancel", "--signal=TERM", "--full", slurm_id], env)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self._alive(slurm_id, env):
                time.sleep(0.5)
            _run(["scancel", slurm_id], env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._alive(slurm_id, env):
            time.sleep(0.5)
        WATCHER.forget()

    @staticmethod
    def _alive(slurm_id: str, env: Mapping[str, str]) -> bool:
        try:
            r = _run(sq.squeue_argv([slurm_id], json_output=False), env)
        except (OSError, subprocess.SubprocessError):
            return False
        try:
            jobs = sq.parse_squeue_format(r.stdout) if r.returncode == 0 else {}
        except sq.SqueueParseError:
            return False
        job = jobs.get(slurm_id)
        return job is not None and sq.job_outcome(job).status in (Status.PENDING, Status.RUNNING, Status.UNKNOWN)

    def settle_after_cancel(self, job_dir: Path, record: JobRecord) -> dict[str, Any]:
        WATCHER.forget()
        changes = self.describe(job_dir, record)
        if changes.get("status") in (None, RUNNING, PENDING, UNKNOWN):  # our cancel ended it: nothing runs
            evidence, _ = ending.evidence(job_dir, record, None, nothing_runs=True, stop_requested=True)
            changes.update(self._end(job_dir, record, evidence))
        return changes

    def has_live_parts(self, job_dir: Path, record: JobRecord | None) -> bool:
        if jobstore.lock_is_held(job_dir / jobstore.SUPERVISOR_LOCK):
            return True
        if record is not None and record.state.is_live:
            return True
        env = _client_env(None, record)
        slurm_id = (self.engine_id(record) if record is not None else None) or find_by_name(job_dir.name, env)
        return slurm_id is not None and self._alive(slurm_id, env)

