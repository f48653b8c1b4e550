"""The preflight's type checks: a value the bench role's tasks could not use as declared in
roles/bench/meta/argument_specs.yml (options.py reads it), and what ansible-core's own
ArgumentSpecValidator (the role's built-in validation) rejects.

Types follow the role's argument spec strictly: a list or a mapping given as a string is an error,
not a conversion (Ansible's validator would split "1,2,5", but the role's tasks use the variable
itself, not the converted copy, and fail later with a Jinja type error); numbers and booleans
given as strings (-e key=value) are accepted as the modules accept them.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import BOOLEANS

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.model import FIX, Problem
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import VariableSpec


def unknown_variables(names: Iterable[str], known: Sequence[str],
                      origins: Optional[Mapping[str, str]] = None) -> List[Problem]:
    """bench_* names nobody reads: a typo silently runs the default instead."""
    problems = []
    for name in sorted(set(names)):
        if not name.startswith("bench_") or name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if near:
            msg = "%s: unknown variable; did you mean %s?" % (name, near[0])
        else:
            msg = ("%s: unknown variable (neither declared in roles/bench/meta/argument_specs.yml "
                   "nor read by bench.yml); remove it, or name your own helper variables without "
                   "the bench_ prefix" % name)
        problems.append(Problem(name, msg, (origins or {}).get(name, "")))
    return problems


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, (int, float)):
        return "a number"
    return "a %s" % type(value).__name__


def is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        return bool(re.fullmatch(r"\s*[+-]?\d+\s*", value))
    return False


def is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False


def to_number(value: Any) -> float:
    return float(value)


def _list_hint(name: str, text: str) -> str:
    """The YAML list a comma-separated string probably meant."""
    parts = [p.strip() for p in text.strip().strip("[]").split(",") if p.strip()]
    shown = ", ".join(parts) if parts else "..."
    return ("%s: %r is a string; give a YAML list [%s] (with -e, JSON: -e '{\"%s\": [%s]}')"
            % (name, text, shown, name, shown))


def _check_scalar(name: str, kind: str, value: Any) -> Optional[str]:
    if kind == "int" and not is_int(value):
        return "%s: %r is %s, not an integer; %s" % (name, value, _kind(value), FIX)
    if kind == "float" and not is_number(value):
        return "%s: %r is %s, not a number; %s" % (name, value, _kind(value), FIX)
    if kind == "bool" and not (isinstance(value, bool) or str(value).lower() in
                               {str(b).lower() for b in BOOLEANS}):
        return "%s: %r is not true or false; %s" % (name, value, FIX)
    if kind in ("str", "path", "raw") and isinstance(value, (Mapping, list, tuple)):
        return "%s: expected a single value, got %s; %s" % (name, _kind(value), FIX)
    return None


def check_type(spec: VariableSpec, value: Any) -> List[str]:
    """Messages for a value the role's tasks could not use as declared (None = unset, fine)."""
    name = spec.name
    if value is None:
        return []
    if spec.type == "list":
        if isinstance(value, str):
            return [_list_hint(name, value)]
        if not isinstance(value, (list, tuple)):
            return ["%s: expected a list, got %s (%r); %s" % (name, _kind(value), value, FIX)]
        out = []
        for i, item in enumerate(value):
            if spec.elements == "dict":
                if not isinstance(item, Mapping):
                    out.append("%s[%d]: expected a mapping, got %s (%r)"
                               % (name, i, _kind(item), item))
            elif spec.elements in ("int", "float") and (isinstance(item, str)
                                                        or not is_number(item)):
                # Strings are rejected even when numeric: the role compares the items in Jinja.
                out.append("%s[%d]: %r is %s; give numbers, e.g. [1, 2, 5]"
                           % (name, i, item, _kind(item)))
            elif spec.elements == "int" and not is_int(item):
                out.append("%s[%d]: %r is not an integer" % (name, i, item))
            elif spec.elements:
                msg = _check_scalar("%s[%d]" % (name, i), spec.elements, item)
                if msg:
                    out.append(msg)
        return out
    if spec.type == "dict":
        if not isinstance(value, Mapping):
            return ["%s: expected a mapping, got %s (%r); give a YAML mapping; %s"
                    % (name, _kind(value), value, FIX)]
        return []
    msg = _check_scalar(name, spec.type, value)
    if msg:
        return [msg]
    if spec.choices and value not in spec.choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in spec.choices], n=1)
        return ["%s: %r is not one of %s%s" % (
            name, value, ", ".join(map(str, spec.choices)),
            "; did you mean %s?" % near[0] if near else "")]
    return []


def plain(value: Any) -> Any:
    """Tagged and lazy Ansible containers -> plain ones, for the validator and for JSON."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def validator_messages(spec_options: Mapping[str, Mapping], values: Mapping[str, Any]
                       ) -> List[Tuple[str, str]]:
    """(name, message) for what ansible-core's ArgumentSpecValidator (the role's built-in
    validation, with the same spec) rejects. `required` is left to the checks here: bench_run_id
    is set by bench.yml after the preflight."""
    spec = {}
    for name, opt in spec_options.items():
        opt = {k: v for k, v in opt.items()
               if k in ("type", "elements", "choices", "options", "no_log")}
        spec[name] = opt
    params = {k: plain(v) for k, v in values.items() if k in spec and v is not None}
    result = ArgumentSpecValidator(spec).validate(params)
    out = []
    for message in result.error_messages:
        named = [n for n in spec if re.search(r"\b%s\b" % re.escape(n), message)]
        out.append((named[0] if named else "bench_*", str(message)))
    return out
