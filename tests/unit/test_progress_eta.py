"""plugin_utils/progress.py: the ETA arithmetic, the clock, the progress line, the level wall
times read from a run's part files, and the run's start in its manifest."""
from __future__ import annotations

import os

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils import progress


def test_clock():
    assert progress.clock(0) == "00:00"
    assert progress.clock(102) == "01:42"
    assert progress.clock(130.4) == "02:10"
    assert progress.clock(3723) == "1:02:03"
    assert progress.clock(-5) == "00:00"
    assert progress.clock(None) == "--:--"
    assert progress.clock(float("nan")) == "--:--"


@pytest.mark.parametrize("level_index, level_count, profile_index, profile_count, left", [
    (1, 8, 1, 2, 16),      # everything still to run
    (3, 8, 2, 2, 6),       # the example: profile 2/2, level 3/8 -> levels 3..8
    (8, 8, 2, 2, 1),       # the last level of the run
    (2, 2, 1, 2, 3),       # this profile's last level, then a whole profile
    (1, 4, None, None, 4),  # the sweep does not know where it stands: this sweep only
    (1, 4, 3, 2, 4),       # an index past the count: no profile left, never negative
])
def test_levels_left(level_index, level_count, profile_index, profile_count, left):
    assert progress.levels_left(level_index, level_count, profile_index, profile_count) == left


def test_eta_averages_the_measured_levels_times_the_levels_left():
    eta = progress.estimate_eta([10.0, 20.0, 30.0], level_index=3, level_count=8,
                                profile_index=2, profile_count=2, guess_s=999)
    assert not eta.guessed and eta.levels_left == 6
    assert eta.seconds == pytest.approx(20.0 * 6)
    assert eta.text() == "ETA 02:00"


def test_eta_counts_the_profiles_left_and_their_server_starts():
    eta = progress.estimate_eta([12.0], level_index=2, level_count=3, profile_index=1,
                                profile_count=3, profile_overhead_s=5.0)
    # 2 levels left here + 3 levels x 2 profiles, each profile after this one starting a server
    assert eta.levels_left == 8
    assert eta.seconds == pytest.approx(12.0 * 8 + 5.0 * 2)


def test_eta_before_any_level_is_a_labelled_guess():
    guess = progress.guess_level_seconds(level_seconds=30, warmup_requests=2)
    assert guess == pytest.approx(30 + 3 * progress.REQUEST_GUESS_S)
    eta = progress.estimate_eta([], 1, 2, 1, 2, guess_s=guess)
    assert eta.guessed and eta.seconds == pytest.approx(guess * 4)
    assert eta.text().startswith("ETA ~")
    # garbage walls (a clock step backwards) are not measurements
    assert progress.estimate_eta([-1.0, float("nan")], 1, 2, guess_s=10).guessed


def test_progress_line_with_and_without_the_profile_place():
    eta = progress.Eta(seconds=130, guessed=False, levels_left=6)
    line = progress.progress_line(3, 8, "C=5", 102, eta, "eagle3", 2, 2)
    assert line == "profile 2/2 eagle3 · level 3/8 C=5 · 01:42 elapsed · ETA 02:10"
    line = progress.progress_line(1, 2, "rate=2/s", 0, progress.Eta(40, True, 2), "baseline")
    assert line == "level 1/2 rate=2/s · 00:00 elapsed · ETA ~00:40"


def test_run_started_prefers_the_resume():
    assert progress.run_started({}) is None
    assert progress.run_started({"started_at": "not a time"}) is None
    start = progress.run_started({"started_at": "2026-12-02T01:00:00+00:00"})
    assert start == progress.parse_time("2026-12-02T01:00:00Z")
    resumed = progress.run_started({"started_at": "2026-12-02T01:00:00+00:00",
                                    "resumed_at": "2026-12-02T02:00:00.5+00:00"})
    assert resumed - start == pytest.approx(3600.5)
    # a naive time is UTC (the manifest's are all UTC)
    assert progress.parse_time("2026-12-02T01:00:00") == start


def test_server_start_seconds_from_the_manifest():
    manifest = {"profiles": {"baseline": {"h1": {"ready_seconds": 4.0}, "h2": {"ready_seconds": "6"}},
                             "eagle3": {"h1": {"ready_seconds": None}, "h2": "garbage"}}}
    assert progress.server_start_seconds(manifest) == pytest.approx(5.0)
    assert progress.server_start_seconds({}) == 0.0


def _part(parts_dir, stem, mtime):
    path = parts_dir / (stem + ".json")
    path.write_text("{}")
    (parts_dir / (stem + ".jsonl")).write_text("")
    os.utime(path, (mtime, mtime))


def test_level_walls_from_parts(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    t0 = 1_000_000.0
    for i, c in enumerate((1, 2, 5)):                    # baseline: 10 s, then 14 s
        _part(parts, "h1__baseline__c%d" % c, t0 + (0, 10, 24)[i])
    for i, c in enumerate((1, 2)):                       # eagle3 (the sweep running now)
        _part(parts, "h1__eagle3__c%d" % c, t0 + 100 + 30 * i)
    _part(parts, "h1__rate__c8__r2p5", t0 + 200)         # open loop: a profile of its own
    _part(parts, "h1__rate__c8__r5", t0 + 206)
    _part(parts, "h1__old__c1", t0 - 500)                # before the (resumed) run started
    _part(parts, "h1__old__c2", t0 - 400)
    walls = progress.level_walls_from_parts(str(parts), since=t0,
                                            skip=progress.sweep_stem("h1", "eagle3"))
    assert sorted(walls) == pytest.approx([6.0, 10.0, 14.0])
    assert sorted(progress.level_walls_from_parts(str(parts))) == pytest.approx(
        [6.0, 10.0, 14.0, 30.0, 100.0])
    assert progress.level_walls_from_parts(str(tmp_path / "missing")) == []


def test_sweep_stem_matches_the_part_names():
    # host and profile are made file-safe the way results/parts.py names the parts
    assert progress.sweep_stem("gpu 1", "eagle3/v2") == "gpu_1__eagle3_v2"
