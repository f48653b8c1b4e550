"""The tuner (playbooks/tune.yml, docs/tune.md): the search for the serving flags that give the
most goodput under the user's SLO, in a fraction of a grid's trials.

One concern per module: the SLO test and score of one measured level (objective.py); the
highest load that meets it, by bisection with short levels first (capacity.py, run by llm_bench's
action between its levels); the searched flags and the candidates they give (space.py); the
model that ranks the untried candidates (model.py) and the proposer that picks the next trial
(proposer.py); the tune's record of its trials, which a resume keeps (state.py); what the report
and best.yml show (results.py). Controller only.
"""
