"""A third scheduler for tune_magic, defined entirely in this test package (no file of tune_magic
is changed for it): an installed distribution (``tm_third-0.1.dist-info`` next to this folder, found
on ``sys.path``/``PYTHONPATH``) registers it under the entry-point group ``tune_magic.schedulers``.

It runs jobs as plain local processes under another name, with options of its own:
``--niceness N`` runs the job's processes at that niceness (``nice -n N`` in front of the command
each node runs), and ``--label TEXT`` is kept in the scheduler's own part of the record.

Sweeps labelled ``array`` show the optional capability a scheduler with job arrays has
(``sweep_engine``, a :class:`~tune_magic.schedulers.base.SweepEngine`): instead of the sweep
process, the whole sweep is taken at once, as one engine job would take it: every trial registered
(``register_trial``) and started together, ``engine`` set in the sweep's record, and
``cancel_sweep`` leaving a marker file in the sweep's directory. Other sweeps go back to the sweep
process (``start_queue``).
"""

from tune_magic.errors import PlanError
from tune_magic.plan.options import Option
from tune_magic.registry import store
from tune_magic.schedulers.base import SweepEngine
from tune_magic.schedulers.local import LocalScheduler


def _niceness(value: int) -> int:
    if value > 19:
        raise PlanError(f"--niceness {value}: niceness goes up to 19")
    return value


class ThirdScheduler(LocalScheduler):
    """Local processes, nicer and labelled."""

    name = "third"
    options = (
        Option("--niceness", "niceness", "count", "run the job's processes at this niceness (1-19)", example="5",
               check=_niceness),
        Option("--label", "label", "text", "a label kept with the job", example="exp1"),
    )
    engine_id_label = "THIRD LABEL"

    def __init__(self):
        self.sweep_engine = ThirdArrays(self)

    def place(self, spec, options):
        plan = super().place(spec, options)
        niceness = options.get("niceness")
        if niceness:
            from dataclasses import replace

            plan = replace(plan, argv=["nice", "-n", str(niceness), *plan.argv])
        return plan

    def submit(self, job_dir, record, plan, options, env, lock_fd):
        label = options.get("label")
        if label:
            store.update(job_dir, backend={**record.backend, "label": label})
        super().submit(job_dir, record, plan, options, env, lock_fd)

    def engine_id(self, record):
        return record.backend.get("label")


class ThirdArrays(SweepEngine):
    """A sweep labelled ``array`` taken whole, as one engine job would take it."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def submit_sweep(self, sweep):
        if sweep.options.get("label") != "array":
            return sweep.start_queue()  # the sweep process, trial by trial
        from tune_magic.sweeping import store as sweepstore

        with sweepstore.locked(sweep.sweep_dir) as record:
            record.engine = {"array": f"third-{record.id}"}
        registered = [sweep.register_trial(index) for index in range(len(sweep.record.trials))]
        for job in registered:  # "the engine job": every trial at once
            self.scheduler.submit(job.dir, job.record, job.plan, sweep.options, sweep.env, job.lock_fd)
            job.release()

    def cancel_sweep(self, sweep_dir, record, grace_s):
        (sweep_dir / "third-cancelled").write_text(record.engine.get("array", ""))
