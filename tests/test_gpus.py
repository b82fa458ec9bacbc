"""GPU ids without CUDA, against a FAKE nvidia-smi on PATH (there is no GPU here).

The ids a user types are relative to the kernel's CUDA_VISIBLE_DEVICES; the tables below hold, for
each form a spawner or an allocation may set, the GPUs a job gets and the error when it gets none.
"""

import os

import pytest

from tune_magic import gpus
from tune_magic.errors import PlanError
from tune_magic.gpus import GpuError

from jobhelpers import fake_gpu_uuid, fake_mig_uuid, write_fake_nvidia_smi

U = [fake_gpu_uuid(i) for i in range(4)]
MIG_A, MIG_B = fake_mig_uuid(0, 0), fake_mig_uuid(0, 1)


@pytest.fixture
def fake_4_gpus_env(tmp_path):
    write_fake_nvidia_smi(tmp_path / "bin", 4)
    return {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def kernel(env, cvd):
    """The kernel's environment: ``env`` with CUDA_VISIBLE_DEVICES set to ``cvd`` (None: unset)."""
    return dict(env) if cvd is None else {**env, "CUDA_VISIBLE_DEVICES": cvd}


# ---------------------------------------------------------------------------------------------
# nvidia-smi itself


def test_count_with_fake_nvidia_smi(fake_4_gpus_env):
    assert gpus.gpu_ids(fake_4_gpus_env) == [0, 1, 2, 3]
    assert gpus.count_gpus(fake_4_gpus_env) == 4


def test_query_reads_index_and_uuid_from_fake_nvidia_smi(fake_4_gpus_env):
    smi = gpus.query_gpus(fake_4_gpus_env)
    assert smi.gpus == [gpus.PhysicalGpu(i, U[i]) for i in range(4)]
    assert smi.problem is None


def test_no_nvidia_smi_means_zero_gpus(tmp_path):
    assert gpus.count_gpus({"PATH": str(tmp_path)}) == 0
    assert gpus.query_gpus({"PATH": str(tmp_path)}).problem == "nvidia-smi was not found on PATH"


def test_failing_fake_nvidia_smi_is_reported_with_its_message(tmp_path):
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    write_fake_nvidia_smi(tmp_path / "bin", 2, fail=said)
    smi = gpus.query_gpus({"PATH": str(tmp_path / "bin")})
    assert smi.gpus == []
    assert smi.problem == f"nvidia-smi failed with exit code 9: {said}"


def test_case8_counting_never_touches_torch_cuda(fake_4_gpus_env, monkeypatch):
    import torch

    def boom(*a, **k):
        raise AssertionError("torch.cuda touched")

    for name in ("init", "_lazy_init", "is_available", "device_count"):
        monkeypatch.setattr(torch.cuda, name, boom)
    assert gpus.count_gpus(fake_4_gpus_env) == 4
    env = kernel(fake_4_gpus_env, "2,3")
    assert [g.physical for g in gpus.visible_gpus(env)] == [2, 3]
    assert gpus.resolve_gpus("auto", 2, {}, env).physical == [2, 3]


# ---------------------------------------------------------------------------------------------
# What the kernel may see: CUDA_VISIBLE_DEVICES -> (typed, physical, entry)

VISIBLE_TABLE = [
    # id, CUDA_VISIBLE_DEVICES, physical ids visible (typed 0, 1, ... in this order), job entries
    ("unset", None, [0, 1, 2, 3], ["0", "1", "2", "3"]),
    ("empty", "", [], []),
    ("blank", "  ", [], []),
    ("two", "2,3", [2, 3], ["2", "3"]),
    ("spaces", " 2 , 3 ", [2, 3], ["2", "3"]),
    ("reordered", "3,1", [3, 1], ["3", "1"]),
    ("uuids", f"{U[3]},{U[1]}", [3, 1], [U[3], U[1]]),
    ("uuid_prefix", U[2][:12], [2], [U[2][:12]]),
    ("mixed_index_first", f"2,{U[3]}", [2], ["2"]),
    ("mixed_uuid_first", f"{U[3]},1", [3], [U[3]]),
    ("mig", f"{MIG_A},{MIG_B}", [MIG_A, MIG_B], [MIG_A, MIG_B]),
    ("unknown_index_ends_list", "1,7,2", [1], ["1"]),
    ("negative_ends_list", "0,-1,1", [0], ["0"]),
    ("unknown_uuid_ends_list", f"{U[0]},GPU-00000000,{U[1]}", [0], [U[0]]),
    ("slurm_nodevfiles", "NoDevFiles", [], []),
    ("duplicate_index", "2,2", [], []),
    ("duplicate_uuid", f"{U[1]},{U[2]},{U[1]}", [], []),
]


@pytest.mark.parametrize("cvd, physical, entries", [row[1:] for row in VISIBLE_TABLE],
                         ids=[row[0] for row in VISIBLE_TABLE])
def test_visible_gpus_with_FAKE_nvidia_smi(fake_4_gpus_env, cvd, physical, entries):
    vis = gpus.visible_gpus(kernel(fake_4_gpus_env, cvd))
    assert [g.typed for g in vis] == list(range(len(physical)))
    assert [g.physical for g in vis] == physical
    assert [g.entry for g in vis] == entries


def test_visibility_notes_say_why_the_list_is_short(fake_4_gpus_env):
    note = lambda cvd: gpus.visibility(kernel(fake_4_gpus_env, cvd)).note  # noqa: E731
    assert note("2,3") is None
    assert note("1,7,2") == "entry '7' is not a GPU nvidia-smi lists, so CUDA ignores it and every entry after it"
    assert note(f"2,{U[3]}") == (f"entry {U[3]!r} is of another kind than the first entry, "
                                 "so CUDA ignores it and every entry after it")
    assert note("2,2") == "it names GPU 2 twice, and CUDA then shows no GPU at all"
    assert note("GPU-") == "entry 'GPU-' matches several GPUs, so CUDA ignores it and every entry after it"


def test_panel_labels_show_physical_ids_of_FAKE_gpus(fake_4_gpus_env):
    assert [g.label for g in gpus.visible_gpus(kernel(fake_4_gpus_env, "2,3"))] == ["0 (physical 2)", "1 (physical 3)"]
    assert [g.label for g in gpus.visible_gpus(fake_4_gpus_env)] == ["0", "1", "2", "3"]
    assert [g.label for g in gpus.visible_gpus(kernel(fake_4_gpus_env, MIG_B))] == [f"0 (physical {MIG_B})"]


def test_mig_and_empty_settings_do_not_run_nvidia_smi(tmp_path):
    # a FAKE nvidia-smi that fails: MIG ids are taken as given, an empty setting means no GPU
    write_fake_nvidia_smi(tmp_path / "bin", 1, fail="should not be run")
    env = {"PATH": str(tmp_path / "bin")}
    assert [g.physical for g in gpus.visible_gpus(kernel(env, f"{MIG_A},{MIG_B}"))] == [MIG_A, MIG_B]
    assert gpus.visibility(kernel(env, "")).note is None
    assert gpus.visibility(kernel(env, "0")).note == "nvidia-smi failed with exit code 9: should not be run"


# ---------------------------------------------------------------------------------------------
# Resolving a job's GPUs at launch

RESOLVE_TABLE = [
    # id, CUDA_VISIBLE_DEVICES, requested, nproc, busy physical, (typed, physical, job's CUDA_VISIBLE_DEVICES)
    ("unset", None, [0, 1], 2, {}, ([0, 1], [0, 1], "0,1")),
    ("two", "2,3", [0, 1], 2, {}, ([0, 1], [2, 3], "2,3")),
    ("two_second", "2,3", [1], 1, {}, ([1], [3], "3")),
    ("reordered", "3,1", [1, 0], 2, {}, ([1, 0], [1, 3], "1,3")),
    ("uuids", f"{U[2]},{U[3]}", [1], 1, {}, ([1], [3], U[3])),
    ("uuid_prefix", f"{U[2][:12]},{U[0][:12]}", [0, 1], 2, {}, ([0, 1], [2, 0], f"{U[2][:12]},{U[0][:12]}")),
    ("mixed", f"2,{U[3]}", [0], 1, {}, ([0], [2], "2")),
    ("mig", f"{MIG_A},{MIG_B}", [1], 1, {}, ([1], [MIG_B], MIG_B)),
    ("auto_unset_busy", None, "auto", 2, {0: "j1"}, ([1, 2], [1, 2], "1,2")),
    ("auto_visible_busy", "2,3", "auto", 1, {2: "j1"}, ([1], [3], "3")),
    ("auto_busy_outside_visible", "2,3", "auto", 2, {0: "j1", 1: "j2"}, ([0, 1], [2, 3], "2,3")),
    ("auto_busy_key_as_text", "2,3", "auto", 1, {"2": "j1"}, ([1], [3], "3")),
    ("auto_uuid_busy", f"{U[2]},{U[3]}", "auto", 1, {2: "j1"}, ([1], [3], U[3])),
    ("auto_mig_busy", f"{MIG_A},{MIG_B}", "auto", 1, {MIG_A: "j1"}, ([1], [MIG_B], MIG_B)),
    ("typed_busy_elsewhere", "2,3", [0], 1, {0: "j1"}, ([0], [2], "2")),
]


@pytest.mark.parametrize("cvd, requested, nproc, busy, expected", [row[1:] for row in RESOLVE_TABLE],
                         ids=[row[0] for row in RESOLVE_TABLE])
def test_resolve_gpus_with_FAKE_nvidia_smi(fake_4_gpus_env, cvd, requested, nproc, busy, expected):
    got = gpus.resolve_gpus(requested, nproc, busy, kernel(fake_4_gpus_env, cvd))
    assert (got.typed, got.physical, got.cuda_visible_devices) == expected


REFUSED_TABLE = [
    # id, CUDA_VISIBLE_DEVICES, requested, nproc, busy physical, the error's text
    ("empty", "", [0], 1, {},
     "--gpus 0: CUDA_VISIBLE_DEVICES is empty in this kernel's environment, so it may use no GPU; leave --gpus out"),
    ("empty_auto", "", "auto", 1, {}, "--gpus auto: CUDA_VISIBLE_DEVICES is empty"),
    ("out_of_range", "2,3", [2], 1, {},
     "GPU 2 is not visible to this kernel: CUDA_VISIBLE_DEVICES='2,3' lets this kernel use 2 GPUs: "
     "0 (physical 2), 1 (physical 3) (--gpus counts from 0 within the kernel's CUDA_VISIBLE_DEVICES); "
     "pick ids among 0,1, or leave --gpus out"),
    ("out_of_range_unset", None, [7], 1, {},
     "GPU 7 does not exist on this machine: nvidia-smi lists 4 GPUs: 0, 1, 2, 3; pick ids among 0,1,2,3, "
     "or leave --gpus out"),
    ("out_of_range_truncated", "1,7,2", [1], 1, {},
     "GPU 1 is not visible to this kernel: CUDA_VISIBLE_DEVICES='1,7,2' lets this kernel use 1 GPU: 0 (physical 1) "
     "(entry '7' is not a GPU nvidia-smi lists, so CUDA ignores it and every entry after it)"),
    ("out_of_range_mixed", f"2,{U[3]}", [1], 1, {}, "is of another kind than the first entry"),
    ("duplicate_request", "2,3", [0, 0], 2, {}, "GPU list 0,0 names GPU 0 twice; give each id once"),
    ("duplicate_setting", "2,2", [0], 1, {},
     "--gpus 0: CUDA_VISIBLE_DEVICES='2,2' lets this kernel use no GPU (it names GPU 2 twice, and CUDA then "
     "shows no GPU at all); leave --gpus out"),
    ("busy_physical", "2,3", [1], 1, {3: "j1"},
     "GPU 1 (physical 3) is used by running job j1; pick another GPU, stop that job, or pass --force"),
    ("busy_mig", f"{MIG_A},{MIG_B}", [0], 1, {MIG_A: "j1"}, f"GPU 0 (physical {MIG_A}) is used by running job j1"),
    ("auto_too_few", "2,3", "auto", 2, {3: "j1"},
     "gpus='auto' needs 2 free GPUs but 1 of the 2 visible are free (CUDA_VISIBLE_DEVICES='2,3' lets this kernel "
     "use 2 GPUs: 0 (physical 2), 1 (physical 3); GPU 1 (physical 3) is used by job j1); stop a job or give --gpus"),
    ("auto_zero", "2,3", "auto", 0, {}, "gpus='auto' needs a process count of at least 1, got 0"),
    ("bad_id_before_visibility", "", ["x"], 1, {}, "bad GPU id 'x': give non-negative integers"),
    ("text_not_list", "2,3", "0,1", 2, {}, "gpus='0,1': give a list of GPU ids such as [0, 1], or 'auto'"),
    ("negative", "2,3", [-1], 1, {}, "bad GPU id -1: give non-negative integers"),
    ("no_ids", "2,3", [], 1, {}, "gpus=[]: give at least one GPU id"),
]


@pytest.mark.parametrize("cvd, requested, nproc, busy, message", [row[1:] for row in REFUSED_TABLE],
                         ids=[row[0] for row in REFUSED_TABLE])
def test_resolve_gpus_refuses_with_FAKE_nvidia_smi(fake_4_gpus_env, cvd, requested, nproc, busy, message):
    with pytest.raises(GpuError) as info:
        gpus.resolve_gpus(requested, nproc, busy, kernel(fake_4_gpus_env, cvd))
    assert message in str(info.value)
    assert isinstance(info.value, PlanError) and isinstance(info.value, ValueError)


def test_force_shares_a_busy_physical_gpu_but_auto_still_picks_free_ones(fake_4_gpus_env):
    env = kernel(fake_4_gpus_env, "2,3")
    assert gpus.resolve_gpus([1], 1, {3: "j1"}, env, force=True).physical == [3]
    assert gpus.resolve_gpus("auto", 1, {2: "j1"}, env, force=True).physical == [3]


def test_without_nvidia_smi_index_entries_are_refused_naming_the_cause(tmp_path):
    env = {"PATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(GpuError, match="lets this kernel use no GPU \\(nvidia-smi was not found on PATH\\)"):
        gpus.resolve_gpus([0], 1, {}, env)
    with pytest.raises(GpuError, match="nvidia-smi lists no GPU \\(nvidia-smi was not found on PATH\\)"):
        gpus.resolve_gpus([0], 1, {}, {"PATH": str(tmp_path)})


# ---------------------------------------------------------------------------------------------
# Pure helpers for previews, cards and tables


@pytest.mark.parametrize("cvd, typed, expected", [
    (None, [0, 1], "0,1"),
    ("2,3", [0, 1], "2,3"),
    ("2,3", [1], "3"),
    (f"{U[2]}, {U[3]}", [1], U[3]),
    ("2,3", [2], None),
    ("", [0], None),
])
def test_preview_maps_typed_ids_without_nvidia_smi(tmp_path, cvd, typed, expected):
    env = kernel({"PATH": str(tmp_path)}, cvd)  # no nvidia-smi on PATH: nothing is checked
    assert gpus.preview_cuda_visible_devices(typed, env) == expected


@pytest.mark.parametrize("typed, physical, expected", [
    ([0, 1], [2, 3], "GPUs 0,1 (physical 2,3)"),
    ([0, 1], [0, 1], "GPUs 0,1"),
    ([0, 1], ["0", "1"], "GPUs 0,1"),
    ([1], [3], "GPU 1 (physical 3)"),
    ([0], None, "GPU 0"),
    ([0], [MIG_A], f"GPU 0 (physical {MIG_A})"),
    (None, None, ""),
    ([], [], ""),
])
def test_gpus_label(typed, physical, expected):
    assert gpus.gpus_label(typed, physical) == expected


def test_resolved_label_matches_the_card_format(fake_4_gpus_env):
    assert gpus.resolve_gpus([0, 1], 2, {}, kernel(fake_4_gpus_env, "2,3")).label == "GPUs 0,1 (physical 2,3)"


# ---------------------------------------------------------------------------------------------
# The pre-CUDA_VISIBLE_DEVICES helpers, kept until jobctl switches to resolve_gpus


def test_pick_free_skips_busy(fake_4_gpus_env):
    assert gpus.pick_free(2, {0: "a", 1: "a"}, fake_4_gpus_env) == [2, 3]
    with pytest.raises(GpuError, match="needs 3 free GPU"):
        gpus.pick_free(3, {0: "a", 1: "a"}, fake_4_gpus_env)


def test_check_gpus_out_of_range_and_busy(fake_4_gpus_env, tmp_path):
    with pytest.raises(GpuError, match="GPU 7 does not exist"):
        gpus.check_gpus([7], {}, env=fake_4_gpus_env)
    with pytest.raises(GpuError, match="0 GPUs"):
        gpus.check_gpus([0], {}, env={"PATH": str(tmp_path)})
    with pytest.raises(GpuError, match="used by running job abc"):
        gpus.check_gpus([1], {1: "abc"}, env=fake_4_gpus_env)
    gpus.check_gpus([1], {1: "abc"}, force=True, env=fake_4_gpus_env)
