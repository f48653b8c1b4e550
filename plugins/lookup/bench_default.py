# -*- coding: utf-8 -*-
"""bench_default (lookup): a bench option's default as roles/bench/meta/argument_specs.yml
declares it, for the plays of playbooks/ that read a bench_* variable outside the role (where
the role's defaults are not loaded): no second default written in a playbook."""
from __future__ import annotations

DOCUMENTATION = r"""
name: bench_default
author: servelab (!UNKNOWN)
short_description: The declared default of a bench option
description:
  - Returns the default roles/bench/meta/argument_specs.yml declares for each named C(bench_*)
    variable (null where it declares none); fails for a name it does not declare.
options:
  _terms:
    description: C(bench_*) variable names.
    required: true
"""

EXAMPLES = r"""
- name: The report's baseline, else the declared default
  ansible.builtin.debug:
    msg: "{{ bench_report_baseline | default(lookup('servelab.serving.bench_default', 'bench_report_baseline')) }}"
"""

RETURN = r"""
_raw:
  description: The declared defaults, one per name.
  type: list
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import bench_spec


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        spec = bench_spec()
        out = []
        for term in terms:
            if term not in spec:
                raise AnsibleLookupError("bench_default: %s is not declared in "
                                         "roles/bench/meta/argument_specs.yml" % term)
            out.append(spec[term].default)
        return out
