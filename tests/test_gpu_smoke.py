"""scripts/gpu-smoke's pure parts: its job phases, its pass/fail rule, and how
scripts/gpu-smoke-wheels chooses the wheels to carry (against fake wheels: no network in tests)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


smoke = load_script("gpu_smoke")
wheels = load_script("gpu_smoke_wheels")


# ---------------------------------------------------------------------------------------------
# gpu-smoke


def test_gpu_phases_two_builtin_jobs_share_gpu0_then_project_recipe_on_two_gpus():
    first, second = smoke.phases(cpu=False, n_gpus=2)
    assert [(s.name, s.gpus) for s in first] == [("builtin-lora-a", [0]), ("builtin-lora-b", [0])]
    assert all(s.args.startswith("lora_finetune_distributed --config tiny/builtin_lora ") for s in first)
    assert [(s.name, s.gpus) for s in second] == [("project-lora-nccl-2p", [0, 1])]
    assert second[0].args.startswith("lora_finetune --config tiny/lora device=cuda dtype=bf16 ")
    assert all(s.env["NCCL_DEBUG"] == "INFO" for s in first + second)


def test_gpu_phases_with_one_gpu_run_the_project_recipe_on_gpu0_alone():
    _, second = smoke.phases(cpu=False, n_gpus=1)
    assert [(s.name, s.gpus) for s in second] == [("project-lora-nccl-1p", [0])]


def test_cpu_phases_use_the_project_recipe_on_gloo_without_gpus():
    first, second = smoke.phases(cpu=True, n_gpus=0)
    assert [s.args.split()[:2] for s in first] == [["--nproc_per_node", "1"]] * 2
    assert second[0].args.split()[:2] == ["--nproc_per_node", "2"]
    assert all(s.gpus is None and "lora_finetune --config tiny/lora" in s.args for s in first + second)


def stub_job(name, status="succeeded", endpoint="localhost:41000", losses=(2.5,), error=None):
    last = SimpleNamespace(step=len(losses), loss=losses[-1]) if losses else SimpleNamespace(step=None, loss=None)
    return SimpleNamespace(name=name, id=f"id-{name}", status=status, error=error,
                           rendezvous_endpoint=endpoint, summary=lambda: last)


def test_check_passes_two_concurrent_jobs_on_their_own_ports():
    assert smoke.check([[stub_job("a"), stub_job("b", endpoint="localhost:41001")], [stub_job("c")]]) == []


def test_check_names_each_kind_of_failure():
    failures = smoke.check([
        [stub_job("a"), stub_job("b")],  # the same endpoint in one phase
        [stub_job("c", status="failed", error="rank 0: ValueError: x", losses=(), endpoint=None)],
    ])
    assert failures == [
        "concurrent jobs shared a rendezvous endpoint: ['localhost:41000', 'localhost:41000']",
        "c (id-c) ended failed: rank 0: ValueError: x",
        "c (id-c) logged no loss",
        "c (id-c) recorded no rendezvous endpoint",
    ]


def test_whl_folder_is_git_ignored():
    probe = subprocess.run(["git", "check-ignore", "-q", ".whl/torchtune-0.6.1-py3-none-any.whl"], cwd=REPO)
    assert probe.returncode == 0


# ---------------------------------------------------------------------------------------------
# gpu-smoke-wheels, with fake wheels in place of pip download

FAKE_INDEX = {
    # name: (version, Requires-Dist lines)
    "root": ("1.0", ["known-old>=2", "unknown-any", "unknown-capped<=3", "known-extra[x]",
                     "py311-only; python_version < '3.12'", "dev-only; extra == 'dev'"]),
    "known-old": ("2.5", ["leaf"]),
    "unknown-capped": ("3.0", []),
    "known-extra": ("1.0", ["base-dep-of-device-pkg", "extra-dep; extra == 'x'"]),
    "extra-dep": ("0.1", []),
    "leaf": ("4.0", []),
}


def write_fake_wheel(dest: Path, name: str) -> Path:
    version, requires = FAKE_INDEX[name]
    dist = f"{name.replace('-', '_')}-{version}"
    wheel = dest / f"{dist}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", meta)
    return wheel


@pytest.fixture
def fake_downloads(monkeypatch):
    asked = []

    def download(spec, dest):
        asked.append(spec)
        return write_fake_wheel(dest, wheels.Requirement(spec).name)

    monkeypatch.setattr(wheels, "pip_download", download)
    monkeypatch.setattr(wheels, "ROOTS", ["root==1.0"])
    monkeypatch.setattr(wheels, "DEVICE_PACKAGES", {
        "known-old": "1.0", "unknown-any": None, "unknown-capped": None, "known-extra": "1.0",
    })
    return asked


def test_wheels_resolver_with_fake_wheels_carries_exactly_what_the_machine_lacks(fake_downloads, tmp_path):
    dest, cache = tmp_path / "whl", tmp_path / "cache"
    dest.mkdir(), cache.mkdir()
    carried, on_device, problems = wheels.resolve(dest, {"leaf": wheels.Version("4.0")}, cache)
    # root: absent there; known-old: 1.0 there but >=2 needed; unknown-capped: version unknown, capped;
    # extra-dep: asked for through known-extra[x]; leaf: needed by a carried wheel, at its pin
    assert sorted(carried) == ["extra-dep", "known-old", "leaf", "root", "unknown-capped"]
    assert sorted({n for n, _, _ in on_device}) == ["known-extra", "unknown-any"]
    assert problems == []
    assert "leaf==4.0" in fake_downloads  # the project's pin
    assert not any(s.startswith(("py311-only", "dev-only", "base-dep-of-device-pkg")) for s in fake_downloads)
    assert {p.name for p in dest.iterdir()} == {w.name for w, _ in carried.values()}  # extras lookups go to cache


def test_wheels_resolver_reports_a_conflict_between_carried_versions(fake_downloads, tmp_path, monkeypatch):
    monkeypatch.setitem(FAKE_INDEX, "extra-dep", ("0.1", ["leaf<4"]))
    carried, _, problems = wheels.resolve(tmp_path, {}, tmp_path)
    assert problems == ["extra-dep 0.1 needs leaf<4, but leaf 4.0 is carried"]


@pytest.mark.parametrize("requirement, extras, expected", [
    ("a", set(), True),
    ("a; python_version < '3.12'", set(), False),
    ("a; python_version >= '3.12'", set(), True),
    ("a; sys_platform == 'win32'", set(), False),
    ("a; extra == 'dev'", set(), False),
    ("a; extra == 'x'", {"x"}, True),
])
def test_markers_are_evaluated_for_the_gpu_machines_python(requirement, extras, expected):
    assert wheels.applies(wheels.Requirement(requirement), extras) is expected
