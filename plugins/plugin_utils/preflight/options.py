"""The bench options, read from their one definition: roles/bench/meta/argument_specs.yml.

Every bench_* variable is declared there once - its type, elements, choices, default and doc -
and everything else is derived from it (docker's DOCUMENTATION fragments, kubespray's
validate_inventory: one place):

- the preflight's names and types (role_spec, known_names): a bench_* variable declared nowhere
  is refused as unknown;
- which llm_bench option each variable fills (llm_bench_variables): bench_<option> for every
  option of llm_bench's own argument spec (module_utils/loadgen/options.py) that the role
  declares, so a new sweep option is one entry in each spec and no list here;
- the argument dict the role's sweeps pass to llm_bench (llm_bench_args, through the lookup
  servelab.serving.llm_bench_args) and the settings the manifest records;
- the declared defaults the playbooks fall back on (lookup servelab.serving.bench_default);
- the README's variables table (tools/docs/bench_variables.py, `make docs`).

The ranges are not declared here: the sweep options' are LevelConfig.validate's (llm_bench's one
validator, which the preflight runs over the options the role passes); the rest are the
preflight's own checks (plugin_utils/preflight/host.py) of the variables llm_bench never sees.

Why argument_specs.yml and not a Python table: it is what ansible-core validates the role with,
what ansible-doc shows, and what ansible-lint's schema checks; a Python table would need a
generated copy of it. (Role defaults are Ansible's runtime copy of the declared defaults - the
spec's defaults are documentation only to ansible-core - and a unit test holds them equal.)
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
    ACTION_ARGUMENT_SPEC as LLM_BENCH_SPEC,
)

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
ROLE_DIR = os.path.join(COLLECTION_ROOT, "roles", "bench")
ROLE_SPEC_FILE = os.path.join(ROLE_DIR, "meta", "argument_specs.yml")
ROLE_DEFAULTS_FILE = os.path.join(ROLE_DIR, "defaults", "main.yml")

# Set by playbooks/bench.yml's first play after the preflight; templates may refer to them.
PLAYBOOK_SET = ("bench_run_id",)
# The run's identity, not a setting: llm_bench gets them with the others, the manifest records
# them at its top (run_id) or not at all (a controller path), not under hosts.<host>.bench.
RUN_IDENTITY = ("bench_run_id", "bench_results_root")
PREFIX = "bench_"


@dataclass(frozen=True)
class VariableSpec:
    """One option of the role's argument spec."""
    name: str
    type: str = "str"
    elements: Optional[str] = None
    choices: Tuple[Any, ...] = ()
    required: bool = False
    has_default: bool = False
    default: Any = None
    no_log: bool = False
    description: Tuple[str, ...] = ()


def spec_options(argument_specs: Mapping) -> Dict[str, Mapping]:
    """The `main` entry point's options of a parsed argument_specs.yml."""
    main = ((argument_specs or {}).get("argument_specs") or {}).get("main") or {}
    return dict(main.get("options") or {})


def role_spec(argument_specs: Mapping) -> Dict[str, VariableSpec]:
    """{name: VariableSpec} from the parsed roles/bench/meta/argument_specs.yml."""
    out = {}
    for name, opt in spec_options(argument_specs).items():
        doc = opt.get("description") or ()
        out[str(name)] = VariableSpec(
            name=str(name), type=str(opt.get("type", "str")),
            elements=str(opt["elements"]) if opt.get("elements") else None,
            choices=tuple(opt.get("choices") or ()), required=bool(opt.get("required")),
            has_default="default" in opt, default=opt.get("default"),
            no_log=bool(opt.get("no_log")),
            description=(doc,) if isinstance(doc, str) else tuple(str(d) for d in doc))
    return out


@functools.cache
def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


def load_spec_document(path: str = ROLE_SPEC_FILE) -> dict:
    """The parsed argument_specs.yml (read once per process)."""
    return _load(path)


def bench_spec(path: str = ROLE_SPEC_FILE) -> Dict[str, VariableSpec]:
    return role_spec(load_spec_document(path))


def known_names(spec: Mapping[str, VariableSpec]) -> Tuple[str, ...]:
    """Every bench_* name a user may set: the declared ones."""
    return tuple(sorted(spec))


def declared_default(name: str, spec: Optional[Mapping[str, VariableSpec]] = None) -> Any:
    """The default argument_specs.yml declares for `name` (KeyError: not declared)."""
    opt = (bench_spec() if spec is None else spec)[name]
    return opt.default


def llm_bench_variables(spec: Optional[Mapping[str, VariableSpec]] = None) -> Dict[str, str]:
    """{llm_bench option: bench_* variable}: each llm_bench option (module and action) whose
    bench_<option> the role declares. Secrets (no_log: bench_api_key) are not among them: a
    task passes its key itself, and the manifest never records it."""
    spec = bench_spec() if spec is None else spec
    return {option: PREFIX + option for option in LLM_BENCH_SPEC
            if PREFIX + option in spec and not spec[PREFIX + option].no_log}


def llm_bench_args(values: Mapping[str, Any], record: bool = False,
                   spec: Optional[Mapping[str, VariableSpec]] = None) -> Dict[str, Any]:
    """The llm_bench options the bench role's variables give (`values`: bench_* name -> value).

    An unset one (None, or a variable absent from `values`) is left out, as llm_bench's own
    default then applies. With `record`: the settings the manifest records under
    hosts.<host>.bench - the unset ones as null, without the run's identity (RUN_IDENTITY)."""
    out: Dict[str, Any] = {}
    for option, variable in llm_bench_variables(spec).items():
        value = values.get(variable)
        if record:
            if variable not in RUN_IDENTITY:
                out[option] = value
        elif value is not None:
            out[option] = value
    return out
