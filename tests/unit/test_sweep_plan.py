"""A sweep's measurements with repeats (plugin_utils/sweep_plan.py): rounds, the part files each
repeat has, which ones a resumed run still lacks, and how the progress line and the end table
name a repeat. The action end to end: tests/integration/test_llm_bench_repeats.py."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import level_configs
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import level_line
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    part_stem,
    read_parts,
    write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils import progress
from ansible_collections.servelab.serving.plugins.plugin_utils.run_record import measured_part
from ansible_collections.servelab.serving.plugins.plugin_utils.sweep_plan import (
    RepeatsError,
    check_repeats,
    part_key,
    sweep_order,
)

OPTIONS = {"base_url": "http://127.0.0.1:1", "model": "m", "concurrency": [1, 5, 30]}


def configs(**extra):
    return level_configs(dict(OPTIONS, **extra), read_workload=False)[0]


def test_repeats_run_in_rounds():
    plan = sweep_order(configs(), 3, rate_mode=False)
    assert [(m.cfg.concurrency, m.repeat) for m in plan] == [
        (c, r) for r in (1, 2, 3) for c in (1, 5, 30)]
    assert [m.position for m in plan] == list(range(9))
    assert plan[4].level_index == 1 and plan[4].where == "C=5 repeat 2/3"
    assert plan[4].step == {"concurrency": [5]}
    # One repeat: the labels a sweep always had.
    assert [m.where for m in sweep_order(configs(), 1, rate_mode=False)] == ["C=1", "C=5", "C=30"]


def test_open_loop_repeats_name_the_rate():
    plan = sweep_order(configs(load_mode="rate", concurrency=[64], request_rate=[2, 4.5]), 2,
                       rate_mode=True)
    assert [m.where for m in plan] == ["rate=2/s repeat 1/2", "rate=4.5/s repeat 1/2",
                                       "rate=2/s repeat 2/2", "rate=4.5/s repeat 2/2"]
    key = part_key("gpu1", "eagle3", plan[3], rate_mode=True)
    assert part_stem(key) == "gpu1__eagle3__c64__r4p5__rep2"


@pytest.mark.parametrize("value", [0, -1, 2.5, "two", True, None])
def test_repeats_must_be_an_integer_of_at_least_one(value):
    with pytest.raises(RepeatsError, match=r"^bench_repeats: .* must be an integer >= 1"):
        check_repeats(value, "bench_repeats")


def test_repeats_given_as_text_are_numbers():
    assert check_repeats("3") == 3 and check_repeats(2.0) == 2


def test_a_resumed_sweep_lacks_only_the_repeat_whose_part_is_missing(tmp_path):
    """Repeats 1 and 3 of C=5 finished; repeat 2 was in flight when the run was cut: a resume
    finds every other part and measures that one only."""
    plan = sweep_order(configs(), 3, rate_mode=False)
    for m in plan:
        if (m.cfg.concurrency, m.repeat) != (5, 2):
            row = dict(part_key("gpu1", "baseline", m, rate_mode=False), output_tok_s=10.0)
            write_level_files(str(tmp_path), row, [])
    missing = [m for m in plan
               if measured_part(str(tmp_path), part_key("gpu1", "baseline", m, False)) is None]
    assert [(m.cfg.concurrency, m.repeat) for m in missing] == [(5, 2)]
    # Repeat 1 keeps the name of a level measured once: a run measured once resumes with more.
    assert (tmp_path / "gpu1__baseline__c5.json").is_file()
    assert (tmp_path / "gpu1__baseline__c5__rep3.json").is_file()
    # The parts read back in report order, repeats of a level together.
    rows = [row for row, _jsonl in read_parts(str(tmp_path))]
    assert [(r["concurrency"], r["repeat"]) for r in rows] == [
        (1, 1), (1, 2), (1, 3), (5, 1), (5, 3), (30, 1), (30, 2), (30, 3)]


def test_a_part_from_before_repeats_reads_as_repeat_one(tmp_path):
    write_level_files(str(tmp_path), {"host": "h", "profile": "p", "concurrency": 2}, [])
    [(row, _jsonl)] = read_parts(str(tmp_path))
    assert row["repeat"] == 1


def test_the_progress_line_names_the_repeat_and_the_eta_counts_repeats():
    # Measurement 5 of 9 (3 levels x 3 repeats) at 10 s each: 5 measurements left, this one too.
    eta = progress.estimate_eta([10.0], 5, 9)
    assert eta.seconds == pytest.approx(50.0)
    line = progress.progress_line(2, 3, "C=5", 62, eta, "eagle3", 2, 2, repeat=2, repeats=3)
    assert line == "profile 2/2 eagle3 · level 2/3 C=5 · repeat 2/3 · 01:02 elapsed · ETA 00:50"
    assert "repeat" not in progress.progress_line(2, 3, "C=5", 62, eta, repeat=1, repeats=1)


def test_lines_and_the_end_table_tell_the_repeats_apart():
    rows = [{"host": "h", "profile": "p", "concurrency": 5, "repeat": r, "output_tok_s": 10.0 * r,
             "requests": 40, "errors": 0} for r in (1, 2)]
    assert level_line(rows[1]).startswith("h/p C=5 repeat 2: output 20.0")
    assert level_line(rows[0]).startswith("h/p C=5: output 10.0")
    assert level_line(rows[0], repeats=2).startswith("h/p C=5 repeat 1/2: ")
    table = progress.levels_table(rows)
    assert table[0].split()[:4] == ["host", "profile", "C", "repeat"]
    assert [line.split()[3] for line in table[2:]] == ["1", "2"]
    assert progress.level_key(rows[0]) != progress.level_key(rows[1])


def test_the_eta_reads_every_repeat_of_the_other_sweeps(tmp_path):
    """The walls behind the ETA come from the part files' write times, repeats included (open
    loop ones too, whose names carry a rate and a repeat)."""
    import os

    names = ["g__a__c1.json", "g__a__c2.json", "g__a__c1__rep2.json", "g__a__c2__rep2.json",
             "g__b__c8__r2.json", "g__b__c8__r2__rep2.json"]
    for i, name in enumerate(names):
        path = tmp_path / name
        path.write_text("{}")
        os.utime(path, (1000 + 10 * i, 1000 + 10 * i))
    walls = progress.level_walls_from_parts(str(tmp_path))
    # sweep a: 3 gaps of 10 s between its 4 measurements; sweep b: 1 gap (its parts 10 s apart)
    assert sorted(walls) == pytest.approx([10.0, 10.0, 10.0, 10.0])
