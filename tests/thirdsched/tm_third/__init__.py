"""A third scheduler for tune_magic, defined entirely in this test package (no file of tune_magic
is changed for it): an installed distribution (``tm_third-0.1.dist-info`` next to this folder, found
on ``sys.path``/``PYTHONPATH``) registers it under the entry-point group ``tune_magic.schedulers``.

It runs jobs as plain local processes under another name, with options of its own:
``--niceness N`` runs the job's processes at that niceness (``nice -n N`` in front of the command
each node runs), and ``--label TEXT`` is kept in the scheduler's own part of the record.
"""

from tune_magic.errors import PlanError
from tune_magic.plan.options import Option
from tune_magic.registry import store
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
