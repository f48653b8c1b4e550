# -*- coding: utf-8 -*-
"""Unknown role variables: a name with a role's prefix that the role does not declare.

A misspelled `cuda_toolkit_verison` is not an error to Ansible: the role runs its default (13.0.1)
and reports success. bench.yml refuses unknown `bench_*` names in its own preflight
(plugins/plugin_utils/preflight.py); this is the same rule for every other role of the collection,
each role's known names read from its own `meta/argument_specs.yml` (every entry point) and
`defaults/main.yml`, so a new variable is known as soon as it is declared.

Pure Python (no Ansible import): the action plugin `role_vars_check` gathers the hosts' variables
and calls `unknown_variables`; the unit tests call it directly.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import yaml

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES_DIR = os.path.join(COLLECTION_ROOT, "roles")


@dataclasses.dataclass(frozen=True)
class RoleVariables:
    """The names role `role` knows: every `<role>_*` variable it declares or defaults."""

    role: str
    known: Tuple[str, ...]
    # Names with the prefix that something else reads or sets (a play, the role's own set_fact),
    # with who does: they are not the role's options, but not typos either.
    elsewhere: Tuple[Tuple[str, str], ...] = ()

    @property
    def prefix(self) -> str:
        return self.role + "_"

    def all_known(self) -> Tuple[str, ...]:
        return tuple(sorted(set(self.known) | {name for name, _where in self.elsewhere}))


@dataclasses.dataclass(frozen=True)
class UnknownVariable:
    name: str
    role: str
    suggestion: Optional[str]
    host: str = ""
    where: str = ""          # file:line where the value was set, when Ansible knows it

    @property
    def message(self) -> str:
        if self.suggestion:
            text = "%s: unknown variable; did you mean %s?" % (self.name, self.suggestion)
        else:
            text = ("%s: unknown variable (roles/%s/meta/argument_specs.yml declares no such option); "
                    "remove it, or name your own helper variables without the %s_ prefix"
                    % (self.name, self.role, self.role))
        if self.where:
            text += " (set in %s)" % self.where
        return text


def spec_names(argument_specs: Mapping) -> Tuple[str, ...]:
    """Every option name of every entry point of a parsed meta/argument_specs.yml."""
    names = set()
    for entry in ((argument_specs or {}).get("argument_specs") or {}).values():
        names.update(str(k) for k in ((entry or {}).get("options") or {}))
    return tuple(sorted(names))


def load_role(role: str, roles_dir: str = ROLES_DIR,
              elsewhere: Optional[Mapping[str, str]] = None) -> RoleVariables:
    """Read roles/<role>/meta/argument_specs.yml and defaults/main.yml. A role without an argument
    spec is an error: without one there is nothing to check the names against."""
    spec_file = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
    if not os.path.isfile(spec_file):
        raise ValueError("role %s has no %s: its variables cannot be checked" % (role, spec_file))
    with open(spec_file, encoding="utf-8") as handle:
        known = set(spec_names(yaml.safe_load(handle)))
    defaults_file = os.path.join(roles_dir, role, "defaults", "main.yml")
    if os.path.isfile(defaults_file):
        with open(defaults_file, encoding="utf-8") as handle:
            known.update(str(k) for k in (yaml.safe_load(handle) or {}))
    prefix = role + "_"
    return RoleVariables(role=role, known=tuple(sorted(n for n in known if n.startswith(prefix))),
                         elsewhere=tuple(sorted((elsewhere or {}).items())))


def _owner(name: str, roles: Sequence[RoleVariables]) -> Optional[RoleVariables]:
    # The longest prefix wins, should one role's name start another's.
    matching = [r for r in roles if name.startswith(r.prefix)]
    return max(matching, key=lambda r: len(r.prefix)) if matching else None


def unknown_variables(names: Iterable[str], roles: Sequence[RoleVariables], host: str = "",
                      origins: Optional[Mapping[str, str]] = None) -> List[UnknownVariable]:
    """The names among `names` that carry a role's prefix but that role does not know, each with
    the closest known name of that role (difflib, as bench.yml's check does)."""
    found = []
    for name in sorted(set(str(n) for n in names)):
        role = _owner(name, roles)
        if role is None or name in role.all_known():
            continue
        near = difflib.get_close_matches(name, role.all_known(), n=1, cutoff=0.6)
        found.append(UnknownVariable(name=name, role=role.role, suggestion=near[0] if near else None,
                                     host=host, where=(origins or {}).get(name, "")))
    return found


def failure_message(found: Sequence[UnknownVariable]) -> str:
    """One line per variable, with the hosts that have it; nothing has been changed yet."""
    by_message: Dict[str, List[str]] = {}
    for item in found:
        by_message.setdefault(item.message, [])
        if item.host and item.host not in by_message[item.message]:
            by_message[item.message].append(item.host)
    lines = ["%d unknown role variable(s): a misspelled name would silently run the role's default. "
             "Nothing was changed." % len(by_message)]
    for message, hosts in by_message.items():
        lines.append("- %s%s" % (message, " [%s]" % ", ".join(hosts) if hosts else ""))
    return "\n".join(lines)
