"""The SLURM scheduler: one tune_magic job is one SLURM batch job, on any number of nodes.

Through the engine itself — ``sbatch`` to submit, ``squeue`` to follow, ``scancel`` to stop —
never a scheduler of our own. The job's directory (record, batch script, combined log, exit code)
lives under ``TUNE_MAGIC_HOME``, which must be on a filesystem every node shares; the batch job's
output file is the job's combined log, so following it and the loss card work as for local jobs.

Status comes from the exit file the batch script writes (a job with it never queries squeue),
else from the controller: one bounded query every few seconds for every live SLURM job at once,
shared by every card, listing and process (:mod:`.status`); what it means for a job is
:mod:`.exits`. A controller that does not answer is no news. ``sacct`` is not needed.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from tune_magic import faultpoints
from tune_magic.logs import endevidence
from tune_magic.registry import outcome
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import Evidence
from tune_magic.errors import JobStartError, PlanError, UserError
from tune_magic.paths import home
from tune_magic.registry.store import PENDING, RUNNING, UNKNOWN, JobRecord
from tune_magic.registry.status import Status
from tune_magic.schedulers.base import Scheduler, SchedulerOptions, SweepEngine
from tune_magic.schedulers.slurm import exits, requeue, status
from tune_magic.schedulers.slurm import options as sopts
from tune_magic.schedulers.slurm.exits import TAIL_RULES
from tune_magic.schedulers.slurm.nodelocal import node_local_warnings
from tune_magic.schedulers.slurm.submit import (CLIENT_TIMEOUT_S, ARRAY_SCRIPT, adopt_task, array_text, cancel_array, submit_array, batch_script, call_sbatch,
                                                parse_sbatch_id, place, sbatch_argv, sbatch_lines, submit_env, write_script)

#: Seconds to wait for scancel (a stop must reach the controller; it answers or fails within this).
CANCEL_TIMEOUT_S = 30.0
#: scancel's exit code, without a word, when a signal reached an array task that then ended while
#: scancel retried ("Job is in transitional state"): SLURM's ESLURM_ALREADY_DONE (2021, "Job/step
#: already completing or completed") modulo 256 (measured, SLURM 22.05.8, ``scancel --signal=TERM 7_3``).
ALREADY_DONE_EXIT = 2021 % 256
#: The batch script's file name in the job directory.
SCRIPT = "job.sbatch"

_CLIENTS_MISSING = ("--scheduler slurm needs SLURM's client tools (sbatch, squeue, scancel) on PATH: install them "
                    "(e.g. apt install slurm-client, or load your cluster's slurm module), or use --scheduler local")


class ControllerUnreachable(UserError, RuntimeError):
    """SLURM's controller did not take a cancel (down, paused, unreachable): the stop is recorded,
    and the message says to stop the job again once SLURM answers."""


def _client_env(env: Mapping[str, str] | None, record: JobRecord | None = None) -> dict[str, str]:
    """The environment SLURM clients run with: the caller's, without a surrounding job's
    ``SLURM_*`` variables, and with the job's own ``SLURM_CONF`` (the cluster it went to)."""
    out, _ = sopts.sbatch_env(os.environ if env is None else env)
    conf = record.backend.get("conf") if record is not None else None
    if conf:
        out["SLURM_CONF"] = conf
    return out


def _live_ids(conf: str) -> list[str]:
    """SLURM ids of the registry's live SLURM jobs on the cluster of ``conf`` (one query asks for all)."""
    here = os.environ.get("SLURM_CONF", "")
    out = []
    for r in jobstore.list_records():
        if r.scheduler == "slurm" and not r.state.is_terminal and (r.backend.get("conf") or here) == conf:
            slurm_id = r.backend.get("job_id") or r.extra.get("slurm_job_id")  # schema 2 kept it on top
            if isinstance(slurm_id, str) and slurm_id:
                out.append(slurm_id)
            array_id = r.backend.get("array_job_id")
            if isinstance(array_id, str) and array_id:
                out.append(array_id)  # a trial's array: what became of its tasks cancelled while pending
    return sorted(set(out), key=out.index)


#: This process's view of the controller, shared by every job, card and listing (and, on disk, by
#: every process): :mod:`.status`.
WATCHER = status.QueueWatcher(_live_ids)


def find_by_name(job_id: str, env: Mapping[str, str]) -> tuple[str | None, bool]:
    """SLURM's id of the job submitted as ``tune_magic-<job_id>`` (a launcher killed between
    sbatch and recording the id leaves only the name), or ``None``; and whether squeue answered
    at all (within :func:`.status.query_timeout_s`): no answer is no news."""
    r = status.run_bounded(["squeue", f"--name=tune_magic-{job_id}", "--states=all", "--noheader", "--format=%i"], env,
                          status.query_timeout_s())
    if r is None or r.returncode != 0:
        return None, False
    ids = [line.strip() for line in r.stdout.splitlines() if line.strip().isdigit()]
    return (ids[0] if ids else None), True


def _gpus_asked(options: SchedulerOptions, words: tuple[str, ...]) -> bool:
    if options.get("gpus_per_node"):
        return True
    return any(w.startswith(("--gres=gpu", "--gpus", "-G", "--gpus-per-task", "--gpus-per-node")) or
               ("gpu" in w and w.startswith("--gres")) for w in words)


#: The ``--sbatch`` extras a one-task srun takes from its job: the site's policy and placement
#: (a cluster that requires a QOS, a reservation or a node feature refuses or never starts a task
#: without them). srun reads them as sbatch does; the rest (array, requeue, signal, output, time,
#: ...) belong to the batch job alone.
SRUN_SHARED_OPTIONS = frozenset({"qos", "constraint", "reservation", "clusters", "cluster-constraint", "exclude",
                                 "nodelist", "mem", "mem-per-cpu", "mem-per-gpu", "gres", "licenses", "wckey",
                                 "comment", "prefer"})


def srun_argv(job_id: str, cwd: str, options: Mapping[str, Any], argv: list[str]) -> list[str]:
    """``srun`` running ``argv`` as one task on one node, named ``tune_magic-<job_id>-interactive``,
    with the job's ``partition``, ``account``, ``cpus_per_node`` (as the task's CPUs), one GPU when
    it had ``gpus_per_node``, and those of its ``--sbatch`` words (long form, ``--name=value``) named
    in :data:`SRUN_SHARED_OPTIONS`, as written. Pure."""
    words = ["srun", "--ntasks=1", "--nodes=1", "--quiet", f"--job-name=tune_magic-{job_id}-interactive",
             f"--chdir={cwd}"]
    for key, flag in (("partition", "--partition"), ("account", "--account"), ("cpus_per_node", "--cpus-per-task")):
        if options.get(key):
            words.append(f"{flag}={options[key]}")
    if options.get("gpus_per_node"):
        words.append("--gpus=1")
    for word in options.get("sbatch") or ():
        if isinstance(word, str) and word.startswith("--") and word[2:].partition("=")[0] in SRUN_SHARED_OPTIONS:
            words.append(word)
    return words + list(argv)


class SlurmScheduler(Scheduler):
    """Jobs as SLURM batch jobs (see the module docstring)."""

    name = "slurm"
    options = sopts.OPTIONS
    initial_status = Status.PENDING
    engine_id_label = "SLURM ID"
    tail_rules = TAIL_RULES

    def __init__(self) -> None:
        self.sweep_engine = JobArrays()  # a sweep is one job array: SLURM queues its trials

    def available(self, env: Mapping[str, str]) -> str | None:
        if shutil.which("sbatch", path=env.get("PATH")) is None:
            return _CLIENTS_MISSING
        return None

    def status_note(self, env: Mapping[str, str]) -> str | None:
        """sbatch alone says nothing of the controller: ``sinfo`` must answer too."""
        from tune_magic.schedulers.slurm.options import controller_note

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
        """SLURM's job id, once sbatch answered (an array task's: ``7_3``)."""
        return record.backend.get("job_id")

    def default_max_parallel(self, n_trials: int) -> int | None:
        """Every trial: SLURM's queue decides how many of the array's tasks run at once."""
        return n_trials

    # -- launching ----------------------------------------------------------------------------
    def prepare(self, plan, options: SchedulerOptions, env: Mapping[str, str], job_dir: Path) -> dict[str, Any]:
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
        own, parts = requeue.prepare(plan, options, extra, python=sys.executable)
        lines = sbatch_lines(options, job_id=plan.job_id, job_dir=str(job_dir), cwd=plan.cwd or os.getcwd(),
                             nodes=nodes, own_options=own)
        script = batch_script(plan, job_id=plan.job_id, job_dir=str(job_dir), cwd=plan.cwd or os.getcwd(),
                              python=sys.executable, nodes=nodes, cpus_per_node=options.get("cpus_per_node"),
                              rdzv_conf=plan.rdzv_conf, user_endpoint=plan.rendezvous == "user", sbatch_lines=lines,
                              requeue=parts)
        argv = sbatch_argv(str(job_dir / SCRIPT))
        return {"batch_script": script, "submit_argv": argv, "warnings": warnings}

    def submit(self, job_dir: Path, record: JobRecord, plan, options: SchedulerOptions, env: Mapping[str, str],
               lock_fd: int | None) -> None:
        if shutil.which("sbatch", path=env.get("PATH")) is None:
            raise PlanError(_CLIENTS_MISSING)
        write_script(job_dir / SCRIPT, plan.batch_script)
        client_env = submit_env(options, env, plan.batch_script)
        # on a timeout it may still have queued the job: the record stays; the next look finds it by name
        out = call_sbatch(list(plan.submit_argv), client_env, refused="sbatch refused the job",
                          timed_out=f"sbatch did not answer within {CLIENT_TIMEOUT_S:.0f} s; job {record.id} stays "
                          f"listed and is found in squeue as tune_magic-{record.id} if SLURM took it (else it is "
                          f"marked failed after {status.missing_grace_s():.0f} s)")
        slurm_id = parse_sbatch_id(out)
        if slurm_id is None:
            slurm_id = find_by_name(record.id, client_env)[0]
        if slurm_id is None:
            raise JobStartError(f"sbatch answered {out.strip()[:200]!r}, not a job id, and squeue lists no "
                                f"tune_magic-{record.id}; see {job_dir}")
        faultpoints.reached("sbatch-returned")  # fault tests: the launcher dies before it records SLURM's id
        backend = {"job_id": slurm_id}
        if client_env.get("SLURM_CONF"):
            backend["conf"] = client_env["SLURM_CONF"]
        jobstore.update(job_dir, backend=backend)

    def interactive_command(self, record: JobRecord, argv: list[str],
                            env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """``srun`` of ``argv`` as a one-task job (one node) with the job's partition, account, CPUs
        and a GPU if it had GPUs, in its working directory, under the ``SLURM_CONF`` it went to;
        the environment without a surrounding allocation's ``SLURM_*`` (and the kernel's
        ``CUDA_VISIBLE_DEVICES``: SLURM gives the task its GPU). srun passes stdin to the task.

        Raises:
            PlanError: srun is not on PATH.
        """
        client_env = _client_env(env, record)
        client_env.pop("CUDA_VISIBLE_DEVICES", None)
        if shutil.which("srun", path=client_env.get("PATH")) is None:
            raise PlanError(_CLIENTS_MISSING.replace("(sbatch, squeue, scancel)", "(srun)"))
        return srun_argv(record.id, record.cwd, record.scheduler_options, argv), client_env

    # -- following ----------------------------------------------------------------------------
    def describe(self, job_dir: Path, record: JobRecord) -> dict[str, Any]:
        """Settle from the exit file the batch script wrote, else from the controller's shared
        answer (:mod:`.status`; no answer changes nothing), through the outcome rule (:mod:`.exits`)."""
        if record.state.is_terminal:
            return {}
        adopted: dict[str, Any] = {}
        if "array_of" in record.backend and not record.backend.get("job_id") \
                and not jobstore.lock_is_held(job_dir / jobstore.SUPERVISOR_LOCK):
            # a trial of an array whose submitter died before it recorded the array's id
            adopted = adopt_task(job_dir, record, _client_env(None, record))
            record = dataclasses.replace(record, **adopted)
        # every end (the exit file, SLURM's verdict such as a time limit, a job it forgot) settles a
        # requeued job's last attempt with the step it reached
        return requeue.last_attempt_ended(job_dir, record, {**adopted, **self._describe(job_dir, record)})

    def _describe(self, job_dir: Path, record: JobRecord) -> dict[str, Any]:
        """:meth:`describe` of a record that names its SLURM id if anything does."""
        state = record.state
        changes, started = self._from_log(job_dir, record)
        exit_info, attempt = requeue.current_exit(job_dir, record)
        ended = self._from_exit_file(job_dir, record, exit_info, attempt)
        if ended is not None:
            return {**changes, **ended}
        env = _client_env(None, record)
        slurm_id = self.engine_id(record)
        if slurm_id is None:
            if jobstore.lock_is_held(job_dir / jobstore.SUPERVISOR_LOCK):
                return changes  # the launcher is submitting it right now
            if "array_of" in record.backend:  # a trial of an array SLURM does not list (yet)
                slurm_id, answered = None, True
            else:
                slurm_id, answered = find_by_name(record.id, env)
            if slurm_id is None:
                if answered and time.time() - record.started_at > status.missing_grace_s():
                    gone = f"the submission did not complete: squeue lists no job tune_magic-{record.id}"
                    changes.update(exits.end(record, Evidence(verdict=outcome.FAILED, verdict_reason=gone,
                                                               nothing_runs=True)))
                return changes
            record = dataclasses.replace(record, backend={**record.backend, "job_id": slurm_id})
            changes["backend"] = record.backend
        answer = WATCHER.get(slurm_id, env)
        if answer.kind == status.NOT_LISTED and record.backend.get("array_job_id"):
            # a task cancelled while pending is gone; its array's record of pending tasks says so
            array = WATCHER.get(str(record.backend["array_job_id"]), env)
            if array.kind == status.LISTED and array.job.state == "CANCELLED" and not started:
                return {**changes, **exits.listed(job_dir, record, array.job, started)}
        if exit_info is None and answer.kind in (status.NOT_LISTED, status.LISTED):
            # the script may have ended while the controller answered (a query may take seconds):
            # its own exit code and end time win over the controller's word
            ended = self._from_exit_file(job_dir, record, *requeue.current_exit(job_dir, record))
            if ended is not None:
                return {**changes, **ended}
        if answer.kind == status.NOT_LISTED:
            return {**changes, **exits.not_listed(job_dir, record, slurm_id, answer)}
        if answer.kind == status.LISTED:
            # a requeued job's log holds its earlier attempt: SLURM's fresh word outvotes it
            return {**changes, **exits.listed(job_dir, record, answer.job, started)}
        # no news (no answer, or not asked yet): only what the job itself shows
        if started and state is Status.PENDING and not record.backend.get("restarts"):
            changes.update(status=RUNNING, pending_reason=None)
        return changes

    def _from_exit_file(self, job_dir: Path, record: JobRecord, exit_info: jobstore.ExitInfo | None,
                        attempt: int) -> dict[str, Any] | None:
        """The end the current attempt's exit file (``exit_info``, of attempt ``attempt``) says;
        ``None``: no exit file, or SLURM requeued the job after this attempt's script ended, so it
        goes on."""
        if exit_info is None:
            return None
        fresh = self._fresh_answer(record)
        if requeue.requeueable(record) and requeue.requeued_since(fresh.job if fresh else None, attempt):
            return None
        return exits.from_exit_file(job_dir, record, exit_info, self._failure_verdict(record, fresh))

    def job_note(self, record: JobRecord) -> str | None:
        """``"SLURM not answering since HH:MM"`` for a job not ended while the controller does not
        answer (the shared answer's own time); else ``None``. Asks nothing."""
        if record.state.is_terminal:
            return None
        return WATCHER.note(_client_env(None, record))

    def queued_s(self, record: JobRecord) -> float:
        """Seconds the job waited in SLURM's queue again after a requeue (not run time)."""
        return exits.queued_s(record)

    def _fresh_answer(self, record: JobRecord) -> status.Answer | None:
        """A fresh answer of the controller on the job (asked once per job's end: an answer from
        before the exit file may predate the failure or a requeue); ``None`` when it does not list it."""
        slurm_id = self.engine_id(record)
        if not slurm_id:
            return None
        WATCHER.forget()
        answer = WATCHER.get(slurm_id, _client_env(None, record))
        return answer if answer.kind == status.LISTED else None

    def _failure_verdict(self, record: JobRecord, answer: status.Answer | None) -> tuple[str | None, str | None]:
        """SLURM's own failure verdict on a job that left an exit file (a time limit, a node failure,
        out of memory: the exit file alone can say 0 then), from a fresh ``answer``
        (:meth:`_fresh_answer`); ``(None, None)`` when the controller has none or does not answer."""
        if answer is None:
            return None, None
        said = status.job_outcome(answer.job, time_limit=record.scheduler_options.get("time_limit"))
        if said.verdict in (outcome.TIMEOUT, outcome.NODE_FAIL, outcome.OUT_OF_MEMORY):
            return said.verdict, said.reason
        return None, None

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
        """Cancel the job through the controller whatever its record says (a record left ``failed``
        by an outage may name a job SLURM still runs); nothing when its batch script ended (exit
        file) or the controller says it ended.

        Raises:
            ControllerUnreachable: scancel could not reach the controller (the stop is recorded).
        """
        env = _client_env(None, record)
        terminal = record is not None and record.state.is_terminal
        if terminal and requeue.current_exit(job_dir, record)[0] is not None:
            return  # its batch script ended: nothing of it runs
        if not terminal:
            jobstore.mark_stop_requested(job_dir)
        # a damaged record: the job is still findable, by the name it was submitted with
        slurm_id = (self.engine_id(record) if record is not None else None) or find_by_name(job_dir.name, env)[0]
        if slurm_id is None:
            return
        WATCHER.forget()
        answer = WATCHER.get(slurm_id, env)
        said = status.job_outcome(answer.job).status if answer.kind == status.LISTED else None
        if answer.kind == status.NOT_LISTED or (said is not None and said.is_terminal):
            return
        if said is Status.PENDING:
            self.scancel([slurm_id], env)
        else:
            # the agents forward SIGTERM to their workers; what ignores it goes after the grace
            self.scancel(["--signal=TERM", "--full", slurm_id], env)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self._alive(slurm_id, env) is not False:
                time.sleep(0.5)
            self.scancel([slurm_id], env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._alive(slurm_id, env) is not False:
            time.sleep(0.5)
        WATCHER.forget()

    @staticmethod
    def scancel(args: list[str], env: Mapping[str, str]) -> None:
        """Run ``scancel ARGS``; an answer that the job already ended is fine.

        Raises:
            ControllerUnreachable: scancel did not reach the controller in time.
        """
        r = status.run_bounded(["scancel", *args], env, CANCEL_TIMEOUT_S)
        text = " ".join(((r.stderr or r.stdout) if r is not None else "").split())
        done = r is not None and r.returncode == ALREADY_DONE_EXIT
        if r is None or (r.returncode != 0 and not done and "Invalid job id" not in text and "already" not in text):
            why = text or f"no answer within {CANCEL_TIMEOUT_S:.0f} s"
            raise ControllerUnreachable(f"SLURM did not take the cancel of job {args[-1]} ({why}); the stop is "
                                        f"recorded: run the stop again once SLURM answers (squeue works again)")

    @staticmethod
    def _alive(slurm_id: str, env: Mapping[str, str]) -> bool | None:
        """Whether SLURM still runs or queues the job; ``None`` when it does not answer."""
        r = status.run_bounded(status.squeue_argv([slurm_id], json_output=False), env, status.query_timeout_s())
        if r is None or (r.returncode != 0 and not status.scontrol_invalid_id(r.returncode, r.stderr, r.stdout)):
            return None
        try:
            job = status.parse_squeue_format(r.stdout if r.returncode == 0 else "").get(slurm_id)
        except status.SqueueParseError:
            return None
        return job is not None and status.job_outcome(job).status in (Status.PENDING, Status.RUNNING, Status.UNKNOWN)

    def settle_after_cancel(self, job_dir: Path, record: JobRecord) -> dict[str, Any]:
        WATCHER.forget()
        changes = self.describe(job_dir, record)
        if changes.get("status") in (None, RUNNING, PENDING, UNKNOWN):  # our cancel ended it: nothing runs
            evidence, _ = endevidence.evidence(job_dir, record, None, nothing_runs=True, stop_requested=True)
            changes.update(exits.end(record, evidence))
        return changes

    def has_live_parts(self, job_dir: Path, record: JobRecord | None) -> bool:
        """Whether SLURM may still run the job: a launcher submitting it, a live record, or the
        controller listing it alive (or not answering) while no exit file says its script ended."""
        if jobstore.lock_is_held(job_dir / jobstore.SUPERVISOR_LOCK):
            return True
        if record is not None and record.state.is_live:
            return True
        if requeue.current_exit(job_dir, record)[0] is not None:
            return False
        env = _client_env(None, record)
        slurm_id = (self.engine_id(record) if record is not None else None) or find_by_name(job_dir.name, env)[0]
        return slurm_id is not None and self._alive(slurm_id, env) is not False


class JobArrays(SweepEngine):
    """A sweep as ONE job array, each task one trial (:mod:`.submit`): SLURM queues the trials."""

    def submit_sweep(self, sweep) -> None:
        """Register every trial and submit the array (:func:`.submit_array`).

        Raises:
            PlanError: an array larger than the cluster's ``MaxArraySize``, or sbatch refused it.
            JobStartError: sbatch did not answer in time.
        """
        submit_array(sweep, script_name=SCRIPT, clients_missing=_CLIENTS_MISSING)

    def sweep_dry_run(self, sweep_dir: Path, plans, max_parallel: int, options: SchedulerOptions,
                      cwd: str, env: Mapping[str, str]) -> str | None:
        """The job array's sbatch command and script (:func:`.array_text`)."""
        root = jobstore.jobs_root(env, create=False)
        script = array_text(sweep_dir, [root / p.job_id for p in plans], plans[0], max_parallel, options, cwd, SCRIPT)
        return f"{shlex.join(sbatch_argv(str(sweep_dir / ARRAY_SCRIPT)))}\n\n{script}"

    def cancel_sweep(self, sweep_dir: Path, record, grace_s: float) -> None:
        """Cancel the array's pending tasks (they never start); each running trial is then
        stopped as a job (:meth:`SlurmScheduler.cancel`).

        Raises:
            ControllerUnreachable: scancel could not reach the controller.
        """
        WATCHER.forget()
        cancel_array(record, SlurmScheduler.scancel)
