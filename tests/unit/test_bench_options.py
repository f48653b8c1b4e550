"""Every bench option is defined once, in roles/bench/meta/argument_specs.yml (read by
plugins/plugin_utils/preflight/options.py); these tests fail when a second definition creeps
back: a default written again in a playbook or a task file, a role default that disagrees with
the spec, a Python table of option names, or a README table that is not the spec's.
"""
from __future__ import annotations

import ast
import glob
import os
import re

import pytest
import yaml

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight import options

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = options.bench_spec()
with open(options.ROLE_DEFAULTS_FILE, encoding="utf-8") as _fh:
    DEFAULTS = yaml.safe_load(_fh)

# `bench_x | default(...)`, also as `hostvars[h].bench_x | default(...)`.
DEFAULT_CALL = re.compile(r"(?<!\w)(bench_[a-z0-9_]+)\s*\|\s*default\(\s*(.*)")
OWN_DEFAULT = re.compile(r"lookup\('servelab\.serving\.bench_default', '(bench_[a-z0-9_]+)'\)")
VARIABLE = re.compile(r"(?!(?:true|false|none|True|False|None)\b)[a-z_][\w.]*(\[[^\]]*\])*\s*[),|]")
# A Python literal with this many option names is a second list of the options.
TABLE_SIZE = 7


def yaml_files():
    return sorted(glob.glob(os.path.join(REPO, "playbooks", "*.yml")) + [os.path.join(REPO, "bench.yml")]
                  + glob.glob(os.path.join(REPO, "roles", "bench", "tasks", "*.yml"))
                  + glob.glob(os.path.join(REPO, "roles", "bench", "vars", "*.yml")))


def hard_coded_defaults(text: str):
    """(variable, the default written) for each bench option given a default of its own: a
    default(...) may hold only omit, another variable, the environment, or the option's declared
    default (lookup servelab.serving.bench_default)."""
    out = []
    for line in text.splitlines():
        for name, rest in DEFAULT_CALL.findall(line):
            if name not in SPEC:
                continue           # not an option (bench_interrupt_status: the script's own)
            own = OWN_DEFAULT.match(rest)
            if own:
                ok = own.group(1) == name
            else:
                ok = (rest.startswith("omit") or rest.startswith("lookup('ansible.builtin.env'")
                      or bool(VARIABLE.match(rest)))
            if not ok:
                out.append((name, rest.strip()))
    return out


def test_no_playbook_or_task_file_writes_a_default_of_a_bench_option():
    found = {}
    for path in yaml_files():
        with open(path, encoding="utf-8") as fh:
            bad = hard_coded_defaults(fh.read())
        if bad:
            found[os.path.relpath(path, REPO)] = bad
    assert found == {}, ("defaults belong in roles/bench/meta/argument_specs.yml; read them with "
                         "lookup('servelab.serving.bench_default', '<name>'): %s" % found)


@pytest.mark.parametrize("text", [
    "concurrency: \"{{ hostvars[h].bench_concurrency | default([1, 2]) }}\"",
    "baseline: \"{{ bench_report_baseline | default('baseline') }}\"",
    "- not (bench_continue_on_profile_failure | default(false) | bool)",
    "x: \"{{ bench_remeasure | default(lookup('servelab.serving.bench_default', 'bench_break_lock')) }}\"",
])
def test_a_second_default_put_back_is_caught(text):
    assert hard_coded_defaults(text), text


@pytest.mark.parametrize("text", [
    "resume: \"{{ bench_resume | default(omit) }}\"",
    "api_key: \"{{ bench_api_key | default(omit, true) }}\"",
    "state_dir: \"{{ hostvars[n].bench_state_dir | default(bench_state_dir) }}\"",
    "x: \"{{ bench_remeasure | default(lookup('servelab.serving.bench_default', 'bench_remeasure')) }}\"",
])
def test_what_is_no_second_default_passes(text):
    assert hard_coded_defaults(text) == []


def test_the_role_defaults_are_the_declared_ones():
    """defaults/main.yml is Ansible's runtime copy (a role spec's defaults are documentation
    only to ansible-core): each value is the spec's, and the spec declares each variable."""
    assert set(DEFAULTS) <= set(SPEC), set(DEFAULTS) - set(SPEC)
    role = ""
    for path in glob.glob(os.path.join(options.ROLE_DIR, "*", "*.yml")):
        if "/meta/" not in path and "/defaults/" not in path:
            with open(path, encoding="utf-8") as fh:
                role += fh.read()
    for name, opt in SPEC.items():
        if name in DEFAULTS:
            assert not opt.has_default or DEFAULTS[name] == opt.default, name
        elif opt.has_default:
            # Only what the role itself never reads (bench.yml's report: bench_report_baseline).
            assert not re.search(r"(?<!\w)%s(?!\w)" % name, role), name
    for name, value in DEFAULTS.items():
        if not SPEC[name].has_default:
            # Unset (null), a list the spec requires, or a template over the host's variables.
            assert value in (None, []) or "{{" in str(value), name


def option_tables(source: str):
    """(line, names) of each Python literal listing TABLE_SIZE or more bench options (with or
    without the bench_ prefix)."""
    names = set(SPEC) | {n[len("bench_"):] for n in SPEC}
    out = []
    for node in ast.walk(ast.parse(source)):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)) or not items:
            continue
        found = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
        if len(found) >= TABLE_SIZE:
            out.append((node.lineno, found))
    return out


def test_no_python_file_lists_the_options_again():
    found = {}
    for path in sorted(glob.glob(os.path.join(REPO, "plugins", "**", "*.py"), recursive=True)
                       + glob.glob(os.path.join(REPO, "tools", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as fh:
            tables = option_tables(fh.read())
        if tables:
            found[os.path.relpath(path, REPO)] = tables
    assert found == {}, ("derive names and types from roles/bench/meta/argument_specs.yml "
                         "(plugin_utils/preflight/options.py): %s" % found)


def test_a_python_list_of_option_names_put_back_is_caught():
    old = ('SWEEP_OPTIONS = {"int": ("max_tokens", "warmup_requests", "min_latency_samples", '
           '"processes", "min_window_requests", "max_requests", "ci_batches", "socket_rcvbuf", '
           '"seed")}')
    assert option_tables(old)
    assert option_tables("KNOWN = [%s]" % ", ".join(repr(n) for n in sorted(SPEC)[:TABLE_SIZE]))
    assert option_tables('CHECKED = ("bench_model", "bench_state_dir")') == []


def test_the_llm_bench_options_are_derived_by_name_from_both_specs():
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
        ACTION_ARGUMENT_SPEC,
    )
    derived = options.llm_bench_variables()
    assert derived["concurrency"] == "bench_concurrency" and derived["repeats"] == "bench_repeats"
    for option, variable in derived.items():
        assert option in ACTION_ARGUMENT_SPEC and variable == "bench_" + option
        assert not SPEC[variable].no_log
    # Every declared bench_<option> of llm_bench's is in it, but the secret.
    assert {"bench_" + o for o in ACTION_ARGUMENT_SPEC if "bench_" + o in SPEC} - set(
        derived.values()) == {"bench_api_key"}


def test_bench_default_reads_the_declared_default():
    from ansible_collections.servelab.serving.plugins.lookup.bench_default import LookupModule
    from ansible.errors import AnsibleLookupError
    lookup = LookupModule()
    assert lookup.run(["bench_concurrency", "bench_report_baseline"], {}) == [
        SPEC["bench_concurrency"].default, "baseline"]
    with pytest.raises(AnsibleLookupError, match="bench_concurency is not declared"):
        lookup.run(["bench_concurency"], {})


def test_llm_bench_takes_the_settings_under_the_tasks_own_options():
    from types import SimpleNamespace

    from ansible.errors import AnsibleActionFail

    from ansible_collections.servelab.serving.plugins.action.llm_bench import ActionModule
    action = ActionModule.__new__(ActionModule)
    action._task = SimpleNamespace(args={"settings": {"concurrency": [1, 2], "server_metrics": True,
                                                      "base_url": ""},
                                         "base_url": "http://h:1", "server_metrics": False})
    action._merge_settings()
    assert action._task.args == {"concurrency": [1, 2], "server_metrics": False,
                                 "base_url": "http://h:1"}
    action._task = SimpleNamespace(args={"settings": "concurrency=1"})
    with pytest.raises(AnsibleActionFail, match="settings must be a dict"):
        action._merge_settings()
