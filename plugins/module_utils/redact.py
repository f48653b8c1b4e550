"""Which values are secrets, and how they are blanked out: env keys, argv flags, free text.

Secrets reach servelab as a profile's `env`, the module's `env` (bench_server_env), flags in
`extra_args` or `command` (`--api-key X`), and llm_server's `api_key`. They must reach the server
and nothing else: not manifest.json, not the state file, not summary.md or report.html, not
Ansible's output. Every writer and every printer asks this module, so "what is a secret" is
decided once.

A name is secret when a word of it says so. Words are split on `_`, `-`, `.` and camelCase, and
compared whole: `TOKENIZERS_PARALLELISM` (TOKENIZERS is not TOKEN) and `MONKEY` (one word) are
not secrets. SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL(S) and APIKEY make a secret
anywhere in the name (`SECRET_KEY_BASE`), unless a later word says the value is a path, a name,
a size (`PASSWORD_FILE`). KEY, TOKEN, AUTH, PASS, AUTHORIZATION and COOKIE are too common in
other names to count anywhere: they must end it (`HF_TOKEN`, `OPENAI_API_KEY`, `--api-key`,
`apiKey`), so `SSH_AUTH_SOCK`, `AWS_ACCESS_KEY_ID`, SGLang's `--speculative-token-map` and the
simulator's `--moe-token-share` are not secrets. A user list adds exact names (`MY_LICENSE`)
and flags (`--license`).

Standard library only: it ships with llm_server (target side) and the controller uses it too.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional, Set

MARKER = "<redacted>"

# Anywhere in a name, these make it a secret ...
STRONG_SECRET_WORDS = frozenset((
    "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY",
))
# ... and these as its last word (TOKEN is also a unit: --moe-token-share, --prefill-per-token-ms).
LAST_SECRET_WORDS = frozenset(("KEY", "TOKEN", "AUTH", "PASS", "AUTHORIZATION", "COOKIE"))
SECRET_WORDS = STRONG_SECRET_WORDS | LAST_SECRET_WORDS
# A word after the last strong one that says what the value is instead: a path, a name, a size.
NOT_SECRET_AFTER = frozenset((
    "MAP", "PATH", "FILE", "DIR", "SOCK", "SOCKET", "ID", "NAME", "URL", "HEADER", "TYPE",
    "MODE", "LENGTH", "LEN", "SIZE", "LIMIT", "COUNT", "NUM", "ENV", "VAR", "FORMAT", "METHOD",
))
# Values shorter than this, and these words, are blanked where they stand (an env value, a
# flag's argument) but never searched for in free text: masking "1" or "true" everywhere would
# garble every message without hiding anything.
MIN_TEXT_SECRET = 4
NOT_TEXT_SECRETS = frozenset(("true", "false", "none", "null", "yes", "no", "on", "off"))

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_ENV_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
# In free text: `--flag value` / `--flag=value`; `name=value`, `name: value`, `"name": "value"`
# (SGLang logs its ServerArgs as `api_key='...'`); `Bearer <token>`; `scheme://user:pw@host`.
_TEXT_FLAG = re.compile(
    r"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|[ \t]+)(?!-)(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)")
_TEXT_ASSIGN = re.compile(
    r"(?<![\w.-])([\"']?)([A-Za-z_][\w.-]*)\1(\s*[=:]\s*)(\"[^\"\n]*\"|'[^'\n]*'|[^\s,;()\[\]{}=\"']+)")
_AUTH_SCHEMES = ("Bearer", "Basic")
_TEXT_BEARER = re.compile(r"\b(Bearer|Basic)(\s+)(?!<redacted>\s)([A-Za-z0-9._~+/=<>-]{4,})")
_TEXT_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)([^@\s/]+)(@)")


@dataclass(frozen=True)
class Rules:
    """The built-in rule plus a user's exact names (env keys, case-insensitive) and flags."""
    names: frozenset = frozenset()
    flags: frozenset = frozenset()

    @classmethod
    def of(cls, entries: Optional[Iterable[str]] = None) -> Rules:
        """From one user list: an entry starting with '-' is a flag, any other an env name."""
        names, flags = set(), set()
        for entry in entries or ():
            entry = str(entry).strip()
            if entry.startswith("-"):
                flags.add(entry)
            elif entry:
                names.add(entry.upper())
        return cls(frozenset(names), frozenset(flags))


DEFAULT_RULES = Rules()


def _words(name: str) -> List[str]:
    return [w for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", name).upper()) if w]


def is_secret_name(name: Any, rules: Rules = DEFAULT_RULES) -> bool:
    """Whether an env key (or a dict key, or a flag without its dashes) names a secret."""
    if not isinstance(name, str) or not name:
        return False
    if name.upper() in rules.names:
        return True
    words = _words(name)
    if words and words[-1] in SECRET_WORDS:
        return True
    last = max((i for i, w in enumerate(words) if w in STRONG_SECRET_WORDS), default=None)
    return last is not None and not any(w in NOT_SECRET_AFTER for w in words[last + 1:])


def is_secret_flag(arg: Any, rules: Rules = DEFAULT_RULES) -> bool:
    """Whether `arg` (`--api-key`, `--hf-token=...`) is a flag whose value is a secret: its name
    says so, or the user listed it."""
    if not isinstance(arg, str) or not arg.startswith("-") or arg in ("-", "--"):
        return False
    flag = arg.split("=", 1)[0]
    return flag in rules.flags or is_secret_name(flag.lstrip("-"), rules)


def _text_worthy(value: str) -> bool:
    return len(value) >= MIN_TEXT_SECRET and value.strip().lower() not in NOT_TEXT_SECRETS


def _argv_secrets(argv: Iterable[Any], rules: Rules) -> Set[str]:
    found: Set[str] = set()
    argv = [a for a in argv if isinstance(a, str)]
    for i, arg in enumerate(argv):
        if is_secret_flag(arg, rules):
            if "=" in arg:
                found.add(arg.split("=", 1)[1])
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                found.add(argv[i + 1])
        else:
            match = _ENV_ASSIGNMENT.match(arg)   # `env HF_TOKEN=... python ...`
            if match and is_secret_name(match.group(1), rules):
                found.add(match.group(2))
    return found


def secret_values(env: Optional[Mapping] = None, argv: Optional[Iterable[Any]] = None,
                  rules: Rules = DEFAULT_RULES) -> Set[str]:
    """The secret values in an environment and a command line, for masking them in text (and
    for Ansible's no_log_values). Short and boolean-looking values are left out (see above)."""
    found: Set[str] = set()
    for key, value in (env or {}).items():
        if is_secret_name(key, rules) and isinstance(value, (str, int, float)) \
                and not isinstance(value, bool):
            found.add(str(value))
    found |= _argv_secrets(argv or (), rules)
    return {v for v in found if _text_worthy(v)}


def collect_secrets(tree: Any, rules: Rules = DEFAULT_RULES) -> Set[str]:
    """secret_values over a whole structure: every dict's secret-named scalar values and every
    list of strings read as a command line (a module's parameters, a manifest merge)."""
    found: Set[str] = set()

    def walk(node):
        if isinstance(node, Mapping):
            found.update(secret_values({k: v for k, v in node.items()
                                        if not isinstance(v, (Mapping, list, tuple))}, (), rules))
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            if node and all(isinstance(v, str) for v in node):
                found.update(v for v in _argv_secrets(node, rules) if _text_worthy(v))
            for value in node:
                walk(value)

    walk(tree)
    return found


def redact_env(env: Optional[Mapping], rules: Rules = DEFAULT_RULES) -> dict:
    """A copy of `env` with the values of secret keys replaced by MARKER (an empty value stays
    empty: it hides nothing and says the variable is unset); other values lose URL passwords."""
    out = {}
    for key, value in (env or {}).items():
        if is_secret_name(key, rules) and value not in (None, ""):
            out[key] = MARKER
        elif isinstance(value, str):
            out[key] = _TEXT_URL_PASSWORD.sub(r"\1" + MARKER + r"\3", value)
        else:
            out[key] = value
    return out


def redact_argv(argv: Iterable[Any], rules: Rules = DEFAULT_RULES) -> list:
    """A copy of a command line with the value of every secret flag (`--api-key X`,
    `--api-key=X`) and every secret `NAME=value` replaced by MARKER.

    A secret flag followed by another flag (`--enable-auth --port 1`) is taken as a switch: its
    neighbour is not a value. A secret that itself starts with '-' must be written `--flag=-x`.
    """
    argv = list(argv)
    out = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            out.append(MARKER)
            skip = False
            continue
        if is_secret_flag(arg, rules):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + MARKER)
                continue
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = isinstance(nxt, str) and not nxt.startswith("-")
            out.append(arg)
            continue
        match = _ENV_ASSIGNMENT.match(arg) if isinstance(arg, str) else None
        if match and is_secret_name(match.group(1), rules) and match.group(2):
            out.append(match.group(1) + "=" + MARKER)
            continue
        out.append(arg)
    return out


def _is_marker(value: str) -> bool:
    return value.strip("'\"") == MARKER


def _quoted_marker(value: str) -> str:
    quote = value[:1] if value[:1] in ("'", '"') and value[-1:] == value[:1] else ""
    return quote + MARKER + quote


def redact_text(text: Any, secrets: Iterable[str] = (), rules: Rules = DEFAULT_RULES) -> Any:
    """`text` with every known secret value replaced, then every value that the text itself
    marks as secret (`--api-key X`, `api_key='X'`, `HF_TOKEN=X`, `Bearer X`, `://user:X@`).
    Non-strings are returned as they are."""
    if not isinstance(text, str) or not text:
        return text
    for value in sorted({s for s in secrets if isinstance(s, str) and s}, key=len, reverse=True):
        text = text.replace(value, MARKER)

    def flag(match):
        if not is_secret_flag(match.group(1), rules) or _is_marker(match.group(3)):
            return match.group(0)
        return match.group(1) + match.group(2) + _quoted_marker(match.group(3))

    text = _TEXT_BEARER.sub(lambda m: m.group(1) + m.group(2) + MARKER, text)
    text = _TEXT_FLAG.sub(flag, text)
    text = _redact_assignments(text, rules)
    return _TEXT_URL_PASSWORD.sub(r"\1" + MARKER + r"\3", text)


def _redact_assignments(text: str, rules: Rules) -> str:
    """Every `name=value` / `name: value` whose name is secret, with the value masked. A match
    whose name is not secret gives its value back to the scan: in `server_args: api_key='X'`
    the value of `server_args` is itself the assignment `api_key='X'`."""
    out = []
    pos = 0
    while True:
        match = _TEXT_ASSIGN.search(text, pos)
        if match is None:
            break
        value = match.group(4)
        out.append(text[pos:match.start(4)])
        if is_secret_name(match.group(2), rules) and not _is_marker(value) \
                and value not in _AUTH_SCHEMES:   # `Authorization: Bearer X`: X is the secret
            out.append(_quoted_marker(value))
            pos = match.end()
        else:
            pos = match.start(4)
    out.append(text[pos:])
    return "".join(out)


def redact_cmdline(cmdline: Any, secrets: Iterable[str] = (), rules: Rules = DEFAULT_RULES) -> Any:
    """A shell-quoted command line (llm_server's `cmdline`) redacted as argv, then as text."""
    if not isinstance(cmdline, str) or not cmdline:
        return cmdline
    try:
        argv = shlex.split(cmdline)
    except ValueError:      # not shell syntax: treat it as prose
        return redact_text(cmdline, secrets, rules)
    return redact_text(shlex.join(redact_argv(argv, rules)), secrets, rules)


# Keys under which a string is a shell-quoted command line rather than prose.
CMDLINE_KEYS = frozenset(("cmdline", "command_line"))


def redact_tree(tree: Any, secrets: Iterable[str] = (), rules: Rules = DEFAULT_RULES) -> Any:
    """A copy of a JSON-like structure with every secret blanked: secret-named dict values,
    secret flags in lists of strings, command lines, and known or marked secrets in any text."""
    secrets = frozenset(secrets)

    def walk(node, key=None):
        if isinstance(node, Mapping):
            out = {}
            for k, value in node.items():
                if is_secret_name(k, rules) and isinstance(value, (str, int, float)) \
                        and not isinstance(value, bool) and value != "":
                    out[k] = MARKER
                else:
                    out[k] = walk(value, k)
            return out
        if isinstance(node, (list, tuple)):
            items = list(node)
            if items and all(isinstance(v, str) for v in items):
                items = redact_argv(items, rules)
            return [walk(v) for v in items]
        if isinstance(node, str):
            if key in CMDLINE_KEYS:
                return redact_cmdline(node, secrets, rules)
            return redact_text(node, secrets, rules)
        return node

    return walk(tree)
