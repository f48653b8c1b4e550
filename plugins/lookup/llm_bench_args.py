# -*- coding: utf-8 -*-
"""llm_bench_args (lookup): the llm_bench options the bench role's variables give, built once.

The bench role's sweeps (tasks/profile.yml, tasks/router.yml) pass it as llm_bench's C(settings)
and the manifest records it (tasks/main.yml): one dict instead of three ~35-line copies. Which
variable fills which option is derived (plugin_utils/preflight/options.py): bench_<option> for
every llm_bench option the role declares in roles/bench/meta/argument_specs.yml.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: llm_bench_args
author: servelab (!UNKNOWN)
short_description: The llm_bench options the bench role's variables give
description:
  - Returns one dict (option name to value) of every llm_bench option whose C(bench_<option>)
    variable roles/bench/meta/argument_specs.yml declares (C(bench_concurrency) ->
    C(concurrency), ...), templated in the task's context. Secrets (C(bench_api_key)) are not in
    it.
  - Unset variables (null) are left out, so that llm_bench's own defaults apply; with
    O(record=true) they are kept as null and the run's identity (C(run_id), C(results_root)) is
    left out - the settings the manifest records under C(hosts.<host>.bench).
options:
  record:
    description: The manifest's record instead of llm_bench's arguments.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Sweep with the role's settings; the task's own options win
  servelab.serving.llm_bench:
    settings: "{{ lookup('servelab.serving.llm_bench_args') }}"
    base_url: http://127.0.0.1:30000
    model: servelab-sim
"""

RETURN = r"""
_raw:
  description: One dict of llm_bench options.
  type: list
  elements: dict
"""

from ansible.plugins.lookup import LookupBase

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import (
    llm_bench_args, llm_bench_variables,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        variables = variables or {}
        names = [name for name in llm_bench_variables().values() if name in variables]
        # Templated as the vars lookup templates a variable (the role's defaults hold templates).
        values = self._templar.template([variables[name] for name in names])
        return [llm_bench_args(dict(zip(names, values)), record=self.get_option("record"))]
