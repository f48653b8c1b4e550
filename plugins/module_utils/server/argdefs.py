"""An engine release's own argument definitions, read from its source without importing it.

Importing sglang needs torch and a GPU stack; its source does not. Two styles are understood:
- `parser.add_argument("--flag", ..., help=...)` calls (every SGLang release, and vLLM);
- annotated dataclass fields `name: A[type, "help" | Arg(help=, cli_name=, aliases=, no_cli=)]`
  that SGLang (0.5.14+) turns into `--name-with-dashes` (sglang/srt/arg_groups/arg_utils.py).
A flag is "deprecated" when its help text or action says so. Environment variables come from
sglang/srt/environ.py (`NAME = EnvBool(...)` and friends).

Used by the tests (against wheels from PyPI) and by llm_server before a launch (against the
engine installed on the target), so a flag the release does not know never reaches a server.
"""
from __future__ import annotations

import ast
import os
import re
import zipfile
from dataclasses import dataclass
from typing import Dict, Iterable, List, Set, Tuple

SGLANG_ARG_SOURCES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/")
SGLANG_ENVIRON = "sglang/srt/environ.py"
_ENV_ASSIGN = re.compile(r"^\s+([A-Z][A-Z0-9_]+)\s*=\s*Env[A-Za-z]*\(", re.MULTILINE)


@dataclass(frozen=True)
class ArgDef:
    flag: str
    deprecated: bool
    source: str


def _text(node) -> str:
    try:
        value = ast.literal_eval(node)
        return value if isinstance(value, str) else ""
    except (ValueError, SyntaxError, TypeError):
        return ast.unparse(node)


def _is_deprecated(help_text: str, action: str = "") -> bool:
    head = help_text.strip().lower()
    return ("deprecated" in head[:60] or "(deprecated" in head
            or "deprecated" in action.lower())


def _add_argument_defs(tree, source: str) -> Iterable[ArgDef]:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and a.value.startswith("--")]
        help_text = action = ""
        for kw in node.keywords:
            if kw.arg == "help":
                help_text = _text(kw.value)
            elif kw.arg == "action":
                action = ast.unparse(kw.value)
        for flag in flags:
            yield ArgDef(flag, _is_deprecated(help_text, action), source)


def _field_defs(tree, source: str) -> Iterable[ArgDef]:
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(stmt.annotation, ast.Subscript)
                    and ast.unparse(stmt.annotation.value) in ("A", "Annotated",
                                                               "typing.Annotated")):
                continue
            parts = stmt.annotation.slice
            metadata = parts.elts[1:] if isinstance(parts, ast.Tuple) else []
            flag = "--" + stmt.target.id.replace("_", "-")
            aliases: List[str] = []
            help_text = ""
            is_cli = negatable = False
            for meta in metadata:
                if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
                    help_text, is_cli = meta.value, True
                elif isinstance(meta, (ast.JoinedStr, ast.BinOp)):
                    help_text, is_cli = _text(meta), True
                elif isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
                    is_cli = True
                    for kw in meta.keywords:
                        if kw.arg == "cli_name":
                            flag = _literal(kw.value) or flag
                        elif kw.arg == "aliases":
                            aliases = list(_literal(kw.value) or [])
                        elif kw.arg == "help":
                            help_text = _text(kw.value)
                        elif kw.arg == "action" and "BooleanOptionalAction" in ast.unparse(kw.value):
                            negatable = True
                    if any(kw.arg == "no_cli" and _literal(kw.value) is True
                           for kw in meta.keywords):
                        is_cli = False
                        break
            if not is_cli:
                continue
            deprecated = _is_deprecated(help_text)
            for name in [flag] + aliases:
                yield ArgDef(name, deprecated, source)
            if negatable:
                yield ArgDef("--no-" + flag[2:], deprecated, source)


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def argdefs_from_sources(sources: Iterable[Tuple[str, str]]) -> Dict[str, ArgDef]:
    """{flag: ArgDef} from (name, python source) pairs. A flag defined twice keeps the
    non-deprecated definition (a field plus a deprecated alias registration)."""
    defs: Dict[str, ArgDef] = {}
    for name, text in sources:
        tree = ast.parse(text)
        for found in list(_add_argument_defs(tree, name)) + list(_field_defs(tree, name)):
            known = defs.get(found.flag)
            if known is None or (known.deprecated and not found.deprecated):
                defs[found.flag] = found
    return defs


def env_names_from_source(text: str) -> Set[str]:
    return set(_ENV_ASSIGN.findall(text))


def _wanted(path: str) -> bool:
    return path.endswith(".py") and any(
        path == prefix or (prefix.endswith("/") and path.startswith(prefix))
        for prefix in SGLANG_ARG_SOURCES)


def sglang_defs_from_wheel(wheel: str) -> Tuple[Dict[str, ArgDef], Set[str]]:
    """(flags, environment variable names) of the SGLang release in this wheel file."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = [(n, archive.read(n).decode("utf-8")) for n in names if _wanted(n)]
        env_text = archive.read(SGLANG_ENVIRON).decode("utf-8") if SGLANG_ENVIRON in names else ""
    return argdefs_from_sources(sources), env_names_from_source(env_text)


def sglang_defs_from_site(site_dir: str) -> Tuple[Dict[str, ArgDef], Set[str]]:
    """Same, from an installed package: `site_dir` holds the `sglang` directory."""
    sources = []
    for prefix in SGLANG_ARG_SOURCES:
        path = os.path.join(site_dir, prefix)
        if prefix.endswith("/"):
            for root, _dirs, files in os.walk(path):
                for fname in sorted(files):
                    if fname.endswith(".py"):
                        full = os.path.join(root, fname)
                        sources.append((os.path.relpath(full, site_dir), _read(full)))
        elif os.path.exists(path):
            sources.append((prefix, _read(path)))
    env_path = os.path.join(site_dir, SGLANG_ENVIRON)
    env_text = _read(env_path) if os.path.exists(env_path) else ""
    return argdefs_from_sources(sources), env_names_from_source(env_text)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def flags_in(cmd: Iterable[str]) -> List[str]:
    return [part.split("=", 1)[0] for part in cmd if part.startswith("--")]


@dataclass(frozen=True)
class FlagProblem:
    kind: str        # unknown_flag | deprecated_flag | unknown_env
    message: str


def check_against(cmd: Iterable[str], env: Iterable[str], defs: Dict[str, ArgDef],
                  env_names: Set[str], env_prefix: str = "SGLANG_") -> List[FlagProblem]:
    """Problems with a rendered command: unknown or deprecated flags, unknown engine env vars."""
    problems = []
    for flag in flags_in(cmd):
        found = defs.get(flag)
        if found is None:
            problems.append(FlagProblem("unknown_flag", f"{flag} is not defined by this release"))
        elif found.deprecated:
            problems.append(FlagProblem("deprecated_flag",
                                        f"{flag} is deprecated in this release ({found.source})"))
    for name in env:
        if name.startswith(env_prefix) and name not in env_names:
            problems.append(FlagProblem("unknown_env",
                                        f"environment variable {name} is not read by this release"))
    return problems
