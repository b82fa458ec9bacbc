"""``tune-magic`` (also ``python -m tune_magic``): the command-line twin of the notebook magics.

Subcommands call the same public API as the magics. Bad input exits 2 with one paragraph on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from .command import PlanError, build_plan

EXIT_USAGE = 2


class CliError(Exception):
    """A user mistake on the command line: printed as one paragraph, exit 2."""


def _split_leading(argv: Sequence[str], value_flags: set[str], switch_flags: set[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (our leading options, the ``tune run`` arguments that follow).

    Our own options must come first; the first token that is not one of them starts the
    ``tune run`` part, which may itself begin with torchrun options (``--nproc_per_node``). A ``--``
    ends our options explicitly.
    """
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if token == "--":
            return list(argv[:i]), list(argv[i + 1 :])
        if name in value_flags:
            i += 1 if "=" in token else 2
        elif token in switch_flags:
            i += 1
        else:
            break
    return list(argv[:i]), list(argv[i:])


def _cmd(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tune-magic cmd",
        description="Print the exact command a tune run-style line launches (nothing is started).",
        usage="tune-magic cmd [--json] [--gpus G] [--job-id ID] [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--gpus", help="GPU ids for the job, e.g. 0,1 (sets CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--job-id", help="build the plan for this job id (per-job output_dir)")
    own, rest = _split_leading(argv, {"--gpus", "--job-id"}, {"--json", "-h", "--help"})
    ns = parser.parse_args(own)
    plan = build_plan(rest, gpus=ns.gpus, job_id=ns.job_id)
    print(json.dumps(plan.to_dict(), indent=2) if ns.json else plan.command_line())
    return 0


def _ls(argv: Sequence[str]) -> int:
    from . import catalog

    parser = argparse.ArgumentParser(prog="tune-magic ls", description="List recipes and configs, like tune ls.")
    parser.add_argument("--json", action="store_true", help="print a JSON list of recipes with their configs")
    ns = parser.parse_args(argv)
    recipes = catalog.recipes()
    rows: list[tuple[str, str]] = []
    data = []
    for r in recipes:
        extra = catalog.shipped_configs_for(r.name) if r.source == catalog.TORCHTUNE else ()
        names = list(r.configs) + list(extra)
        data.append({"name": r.name, "source": r.source, "path": str(r.path),
                     "supports_distributed": r.supports_distributed, "configs": names})
        label = r.name if r.source == catalog.TORCHTUNE else f"{r.name} (tune_magic)"
        shown = [c if c not in extra else f"{c} (tune_magic)" for c in names] or [""]
        rows += [(label if i == 0 else "", c) for i, c in enumerate(shown)]
    if ns.json:
        print(json.dumps(data, indent=2))
        return 0
    width = max(len(a) for a, _ in rows) + 3
    print(f"{'RECIPE':<{width}}CONFIG")
    for a, b in rows:
        print(f"{a:<{width}}{b}".rstrip())
    return 0


def _assets(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tune-magic assets",
        description="Write the tiny offline model, tokenizer and dataset (default: $TUNE_MAGIC_HOME/assets).",
    )
    parser.add_argument("dir", nargs="?", help="target directory")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--force", action="store_true", help="rewrite even if the assets exist")
    ns = parser.parse_args(argv)
    from .assets import make_assets

    paths = make_assets(ns.dir, seed=ns.seed, force=ns.force)
    print(paths.root)
    return 0


def _demo(argv: Sequence[str]) -> int:
    from .demo import main as demo_main

    return demo_main(argv)


_COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "cmd": (_cmd, "print the command a tune run-style line launches"),
    "ls": (_ls, "list recipes and configs (torchtune's and tune_magic's)"),
    "assets": (_assets, "write the tiny offline assets"),
    "demo": (_demo, "run the demo"),
}


def _usage() -> str:
    lines = ["usage: tune-magic COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in _COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tune-magic``. Returns the exit status (0 ok, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in _COMMANDS:
        print(f"tune-magic: unknown command {name!r}\n{_usage()}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _COMMANDS[name][0](rest)
    except (PlanError, CliError) as exc:
        print(f"tune-magic {name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse's own usage errors already printed
        return int(exc.code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
