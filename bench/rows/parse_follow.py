"""Row 5: parser throughput vs ``grep -c 'loss:'``, and the follower's memory vs ``tail -F``.

Both measured by ``bench/bench_parse.py`` (see its docstring): (a) a 1,000,000-line DiskLogger file
parsed by ``tune_magic.logs.readers.parse_file`` (best of N runs per side); (b) a fresh process follows
a 1 GB combined job log (``--quick``: 100 MB) plus the 100,000-line metric file it names with
``JobMetricsFollower`` until caught up; its RSS growth over its RSS after imports, beside the RSS of
``tail -n +1 -F`` reading the same log.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench import bench_parse
from bench.common import log, row, row_main

KEY, NUMBER = "parse_follow", "5"
METRIC = "Parser throughput (1,000,000-line DiskLogger file)"
FLOOR = 500_000
RSS_GOAL_MIB = 100


def run(quick: bool) -> list[dict]:
    repeat = 1 if quick else 3
    target = (100 if quick else 1000) * 1_000_000
    tmp = Path(tempfile.mkdtemp(prefix="tune_magic_bench_parse_"))
    try:
        parse = bench_parse.bench_parse(tmp, repeat)
        log(f"parse: {parse}")
        follow = bench_parse.bench_follow(tmp, target)
        log(f"follow: {follow}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rate, grep = parse["parser_columns_lines_per_s"], parse["grep_lines_per_s"]
    growth = max(follow["follower_rss_growth_peak_mib"], follow["follower_rss_growth_final_mib"])
    size_mb = follow["combined_log_bytes"] / 1e6
    return [
        row(KEY, NUMBER + "a", METRIC,
            project=f"{rate:,} lines/s ({parse['parser_columns_s']:.2f} s; as MetricPoint objects "
                    f"{parse['parser_metricpoints_lines_per_s']:,} lines/s)",
            anchor=f"{grep:,} lines/s (`grep -c 'loss:'`, {parse['grep_s']:.3f} s)",
            ratio_text=f"{rate / grep:.3f} of grep's rate (higher is better)",
            goal=f"≥ {FLOOR:,} lines/s", met=rate >= FLOOR,
            how=f"`logparse.parse_file`, 3 metrics per line, best of {repeat}; grep counts lines only",
            spread_text=f"best of {repeat} per side",
            note=f"{parse['points']:,} points, {parse['malformed']} malformed lines.", data=parse),
        row(KEY, NUMBER + "b", f"Follower memory: RSS growth following a {size_mb:,.0f} MB job log",
            project=f"{growth:.1f} MiB peak growth (RSS after imports {follow['follower_rss_after_imports_mib']} MiB; "
                    f"{follow['follower_mb_per_s']} MB/s)",
            anchor=f"{follow['tail_F_rss_peak_mib']} MiB peak RSS (`tail -n +1 -F`, whole process)",
            ratio_text=f"{growth / follow['tail_F_rss_peak_mib']:.1f} (growth vs tail's whole RSS)",
            goal=f"< {RSS_GOAL_MIB} MB growth", met=growth < RSS_GOAL_MIB,
            how=f"fresh process, `JobMetricsFollower` polled until caught up on {size_mb:,.0f} MB + "
                f"{follow['steps']:,} metric lines; /proc VmHWM/VmRSS",
            spread_text="one run (peak RSS)",
            note=f"Follower read it in {follow['follower_seconds']} s; tail -F in about {follow['tail_F_seconds_approx']} s; "
                 f"{follow['steps']:,} loss steps recovered.",
            data=follow),
    ]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
