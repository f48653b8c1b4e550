"""The proposer (plugins/plugin_utils/tune/proposer.py) on its own, with a made-up model: the
initial design spreads out, the correction follows the measured trials, a failed trial makes its
twin and whatever asks more memory risky but not forbidden, and the stop rule ends the tune when
nothing is expected to beat the best."""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.proposer import (
    MORE_MEMORY_RISK, Observation, Prediction, propose, rank,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import Space, key

SPACE = Space.parse({"mem_fraction_static": [0.7, 0.8, 0.85, 0.9],
                     "cuda_graph_max_bs": [16, 64, 256]})
CANDIDATES = list(SPACE.candidates())


class Linear:
    """More memory, bigger graphs: more score (what a prior that knows no OOM says)."""
    name = "test"
    spread = 0.1

    def fit(self, observations):
        return {}

    def predict(self, flags):
        return Prediction(100 * flags["--mem-fraction-static"]
                          + flags["--cuda-graph-max-bs"] / 16, None, "test")


def obs(flags, status="finished", score=None):
    return Observation(flags, score, status)


def test_the_first_trial_is_the_models_best_and_the_next_spread_out():
    first = propose(SPACE, CANDIDATES, Linear(), [], set(), None, 0.05)
    assert first.flags == {"--mem-fraction-static": 0.9, "--cuda-graph-max-bs": 256}
    second = propose(SPACE, CANDIDATES, Linear(), [obs(first.flags, score=100.0)],
                     {first.key}, 100.0, 0.05)
    assert "initial design" in second.reason
    assert second.flags == {"--mem-fraction-static": 0.7, "--cuda-graph-max-bs": 16}


def test_a_failure_makes_more_memory_risky_and_its_twin_less_so():
    failed = {"--mem-fraction-static": 0.9, "--cuda-graph-max-bs": 64}
    observations = [obs(failed, "failed"),
                    obs({"--mem-fraction-static": 0.7, "--cuda-graph-max-bs": 16}, score=80.0),
                    obs({"--mem-fraction-static": 0.8, "--cuda-graph-max-bs": 256}, score=90.0)]
    ranked = {r.key: r for r in rank(SPACE, CANDIDATES, Linear(), observations,
                                     {key(o.flags) for o in observations})}
    assert ranked[key({"--mem-fraction-static": 0.9, "--cuda-graph-max-bs": 256})].risk \
        == MORE_MEMORY_RISK
    twin = ranked[key({"--mem-fraction-static": 0.85, "--cuda-graph-max-bs": 64})]
    assert 0 < twin.risk < 0.25
    # the twin is still proposed: its promise outweighs a quarter's risk
    pick = propose(SPACE, CANDIDATES, Linear(), observations,
                   {key(o.flags) for o in observations}, 90.0, 0.05)
    assert pick.flags == {"--mem-fraction-static": 0.85, "--cuda-graph-max-bs": 256} or \
        pick.flags == {"--mem-fraction-static": 0.85, "--cuda-graph-max-bs": 64}, pick.flags
    assert not pick.done


def test_the_tune_ends_when_nothing_is_expected_to_beat_the_best():
    observations = [obs(f, score=200.0) for f in CANDIDATES[:3]]
    done = propose(SPACE, CANDIDATES, Linear(), observations,
                   {key(o.flags) for o in observations}, 200.0, 0.05)
    assert done.done and "no untried candidate is expected to beat the best (200)" in done.reason
