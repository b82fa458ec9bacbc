"""sweeping/slots.py (GPU ranges, trial slots) and the sweep's rendezvous rule (pure; no GPU needed:
the ids are only divided, never opened)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.errors import PlanError
from tune_magic.gpus import parse_gpu_spec
from tune_magic.sweeping.slots import Slots, parse_count, plan_slots
from tune_magic.sweeping.grid import check_sweep_rendezvous


# --- --gpus with ranges -------------------------------------------------------------------------

@pytest.mark.parametrize("spec, ids", [
    ("0-7", [0, 1, 2, 3, 4, 5, 6, 7]),
    ("0-3,6,7", [0, 1, 2, 3, 6, 7]),
    ("4-7,0-1", [4, 5, 6, 7, 0, 1]),
    (" 2 - 3 , 5 ", [2, 3, 5]),
    ("3-3", [3]),
    ("0,1", [0, 1]),
    ([2, 3], [2, 3]),
    (("1", "0"), [1, 0]),
    (None, None),
    ("", None),
    ("  ", None),
])
def test_gpu_spec(spec, ids):
    assert parse_gpu_spec(spec) == ids


@pytest.mark.parametrize("spec, message", [
    ("3-1", r"GPU range '3-1' runs backwards; write the lower id first, e.g. --gpus 1-3"),
    ("0-3,2", r"names GPU 2 twice"),
    ("0-1,0-1", r"names GPU 0, 1 twice"),
    ("0-", r"bad GPU id '0-': give non-negative integers or ranges"),
    ("-1", r"bad GPU id '-1'"),
    ("a", r"bad GPU id 'a'"),
    ("0,,1", r"bad GPU id ''"),
    ("auto", r"resolved when launching"),
    ([0, -1], r"bad GPU id -1"),
    ([True], r"bad GPU id True"),
    (3, r"give a list of GPU ids"),
])
def test_bad_gpu_specs(spec, message):
    with pytest.raises(PlanError, match=message):
        parse_gpu_spec(spec)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 64), unique=True, max_size=10))
def test_gpu_spec_reads_a_plain_list_as_its_ids_in_order(ids):
    """A list without ranges (what --gpus took before ranges) reads as its ids in the order given,
    as a string and as ids; an empty one is no list."""
    text = ",".join(map(str, ids))
    assert parse_gpu_spec(text) == (ids or None)
    assert parse_gpu_spec(ids) == (ids or None)


# --- slots --------------------------------------------------------------------------------------

def test_eight_gpus_two_per_trial():
    slots = plan_slots(n_trials=6, pool=parse_gpu_spec("0-7"), gpus_per_trial=2)
    assert slots == Slots(gpus=((0, 1), (2, 3), (4, 5), (6, 7)), gpus_per_trial=2, unused=())
    assert slots.max_parallel == 4


def test_max_parallel_caps_the_slots():
    slots = plan_slots(n_trials=6, pool=parse_gpu_spec("0-7"), gpus_per_trial="2", max_parallel="2")
    assert slots.gpus == ((0, 1), (2, 3)) and slots.unused == (4, 5, 6, 7)
    # a cap above what the pool holds is only a cap
    assert plan_slots(n_trials=6, pool=[0, 1], max_parallel=8).gpus == ((0,), (1,))


def test_never_more_slots_than_trials():
    slots = plan_slots(n_trials=3, pool=parse_gpu_spec("0-7"))
    assert slots.gpus == ((0,), (1,), (2,)) and slots.unused == (3, 4, 5, 6, 7)
    assert plan_slots(n_trials=2, max_parallel=4).max_parallel == 2


def test_group_size_defaults_to_the_processes_per_node():
    assert plan_slots(n_trials=4, pool=parse_gpu_spec("0-3"), nproc_per_node="2").gpus == ((0, 1), (2, 3))
    assert plan_slots(n_trials=4, pool=[4, 5, 6, 7]).gpus == ((4,), (5,), (6,), (7,))  # one process: 1 GPU
    # nproc_per_node gpu (all visible): each trial sees its group only, so G must be said
    assert plan_slots(n_trials=4, pool=[0, 1, 2, 3], gpus_per_trial=2, nproc_per_node="gpu").gpus == ((0, 1), (2, 3))
    with pytest.raises(PlanError, match="--nproc_per_node gpu does not say how many GPUs of the pool each trial"):
        plan_slots(n_trials=4, pool=[0, 1, 2, 3], nproc_per_node="gpu")
    with pytest.raises(PlanError, match="--nproc_per_node 1 and --gpus-per-trial 2 disagree"):
        plan_slots(n_trials=4, pool=[0, 1, 2, 3], gpus_per_trial=2, nproc_per_node="1")


def test_no_gpus_runs_max_parallel_trials_at_once_default_one():
    assert plan_slots(n_trials=5) == Slots(gpus=(None,), gpus_per_trial=None)
    assert plan_slots(n_trials=5, max_parallel=2, pool=[]).gpus == (None, None)
    with pytest.raises(PlanError, match=r"--gpus-per-trial 2 needs a pool of GPUs to divide: give --gpus too, "
                                        r"e.g. --gpus 0-3 --gpus-per-trial 2"):
        plan_slots(n_trials=5, gpus_per_trial=2)


@pytest.mark.parametrize("kw, message", [
    (dict(max_parallel=0), r"--max-parallel 0 must be at least 1"),
    (dict(max_parallel="-2"), r"--max-parallel -2 must be at least 1"),
    (dict(max_parallel="two"), r"--max-parallel 'two' must be a whole number >= 1"),
    (dict(max_parallel=1.5), r"--max-parallel 1.5 must be a whole number"),
    (dict(gpus_per_trial=0, pool=[0]), r"--gpus-per-trial 0 must be at least 1"),
    (dict(gpus_per_trial=4, pool=[0, 1]), r"--gpus-per-trial 4 is larger than the pool --gpus 0,1 \(2 GPUs\)"),
    (dict(gpus_per_trial=2, pool=[0, 1, 2, 3, 4, 5, 6]),
     r"--gpus 0-6 \(7 GPUs\) does not divide into groups of 2: GPU 6 would stay idle; give a multiple of 2 GPUs "
     r"\(e.g. --gpus 0-5\) or another --gpus-per-trial"),
    (dict(gpus_per_trial=4, pool=[0, 1, 2, 3, 6, 7]), r"--gpus 0-3,6,7 \(6 GPUs\).*GPU 6,7 would stay idle"),
])
def test_refusals(kw, message):
    with pytest.raises(PlanError, match=message):
        plan_slots(n_trials=4, **kw)


def test_parse_count():
    assert parse_count(" 3 ", "--max-parallel", "--max-parallel 2") == 3
    assert parse_count(2, "--max-parallel", "--max-parallel 2") == 2
    with pytest.raises(PlanError, match="e.g. --max-parallel 2"):
        parse_count(True, "--max-parallel", "--max-parallel 2")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 16), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 20)), st.integers(1, 30))
def test_slots_are_disjoint_groups_of_the_pool(n_groups, g, k, n_trials):
    pool = list(range(3, 3 + n_groups * g))
    slots = plan_slots(n_trials=n_trials, pool=pool, gpus_per_trial=g, max_parallel=k)
    assert slots.max_parallel == min(n_groups, n_trials, k or n_groups)
    used = [i for grp in slots.gpus for i in grp]
    assert all(len(grp) == g for grp in slots.gpus)
    assert len(set(used)) == len(used) and sorted(used + list(slots.unused)) == pool


# --- the rendezvous -----------------------------------------------------------------------------

def test_a_sweep_never_shares_a_rendezvous():
    check_sweep_rendezvous({"nproc_per_node": "2", "standalone": True}, {})  # each trial its own port
    check_sweep_rendezvous({}, {"PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": ""})
    with pytest.raises(PlanError, match=r"--rdzv-endpoint would give every trial the same rendezvous port.*"
                                        r"Drop --rdzv-endpoint"):
        check_sweep_rendezvous({"rdzv_endpoint": "node0:29400", "rdzv_backend": "c10d"}, {})
    with pytest.raises(PlanError, match=r"--master-addr and --master-port would"):
        check_sweep_rendezvous({"master_addr": "h", "master_port": "29500"}, {})
    with pytest.raises(PlanError, match=r"PET_RDZV_ENDPOINT would give every trial"):
        check_sweep_rendezvous({}, {"PET_RDZV_ENDPOINT": "h:1"})


def test_the_rendezvous_check_reads_the_launch_grammars_options():
    from tune_magic.config.launchwords import split_args, tokenise as _tokenise

    parsed = _tokenise(split_args("--rdzv_endpoint=node0:29400 --nproc-per-node 2 lora_finetune --config c seed=1"))
    with pytest.raises(PlanError, match="--rdzv-endpoint would give every trial"):
        check_sweep_rendezvous(parsed.torchrun, {})
    check_sweep_rendezvous(_tokenise(split_args("--nproc-per-node 2 lora_finetune --config c")).torchrun, {})
