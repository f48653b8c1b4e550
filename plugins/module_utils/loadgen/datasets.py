"""Prompts from the datasets users bring: ShareGPT-format files and Hugging Face datasets, read
from a local path or the local Hugging Face cache (never the hub). Standard library, plus pyarrow
for parquet and arrow files (imported only when such a file is read).

- sharegpt: the JSON list vLLM's and SGLang's benchmarks read ({"conversations": [{"from":
  "human"|"gpt", "value": ...}]}): the first human turn is the prompt, the gpt answer after it
  gives the output length (its tokens: max_tokens). Entries whose prompt or answer is under 4
  tokens are skipped, as vLLM does; with `seed`, `limit` entries are drawn at random (vLLM's
  sampling), else the first `limit` are taken.
- hf: rows of a JSON list, JSONL, parquet or arrow file, a directory of them, or a dataset in the
  local cache by name (owner/name: the hub's download cache, $HF_HUB_CACHE, $HF_HOME/hub or
  ~/.cache/huggingface/hub, snapshots/<revision>/; else what `datasets` prepared there,
  $HF_DATASETS_CACHE, $HF_HOME/datasets or ~/.cache/huggingface/datasets, <owner>___<name>/).
  A row is a ShareGPT conversation, OpenAI `messages`, or a text field (`prompt_field`, else
  the first of prompt, text, question, instruction, input); the output length is
  `output_field`'s tokens, else an answer field's, else max_tokens.
"""
from __future__ import annotations

import glob
import json
import os
import random
from typing import Dict, Iterator, List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.prompts import (
    Prompt, Workload, WorkloadError,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.tokens import Counter

FILE_TYPES = (".json", ".jsonl", ".parquet", ".arrow")
MIN_TOKENS = 4                  # vLLM's ShareGPT filter: shorter prompts or answers are skipped
PROMPT_FIELDS = ("prompt", "text", "question", "instruction", "input")
ANSWER_FIELDS = ("completion", "response", "answer", "output", "chosen")
HUMAN = ("human", "user")
ASSISTANT = ("gpt", "assistant", "chatgpt", "bard", "bing", "model")


def hf_cache_dirs() -> List[str]:
    """Where the hub client caches downloads, in the order it looks."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        dirs.append(os.path.join(os.environ["HF_HOME"], "hub"))
    dirs.append(os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub"))
    return dirs


def datasets_cache_dirs() -> List[str]:
    """Where the `datasets` library keeps what load_dataset prepared (arrow files)."""
    dirs = []
    if os.environ.get("HF_DATASETS_CACHE"):
        dirs.append(os.environ["HF_DATASETS_CACHE"])
    if os.environ.get("HF_HOME"):
        dirs.append(os.path.join(os.environ["HF_HOME"], "datasets"))
    dirs.append(os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "datasets"))
    return dirs


def resolve(path: Optional[str], name: Optional[str], revision: Optional[str],
            variable: str) -> str:
    """The local file or directory a dataset option names; nothing is downloaded."""
    if path:
        path = os.path.expanduser(str(path))
        if not os.path.exists(path):
            raise WorkloadError("%s.path %r: no such file or directory on the bench client"
                                % (variable, path))
        return path
    if not name or "/" not in str(name):
        raise WorkloadError("%s: give `path` (a local file or directory) or `name` (owner/name "
                            "of a dataset in the local Hugging Face cache)" % variable)
    folder = "datasets--" + str(name).replace("/", "--")
    tried = []
    for cache in hf_cache_dirs():
        snapshots = os.path.join(cache, folder, "snapshots")
        tried.append(snapshots)
        if not os.path.isdir(snapshots):
            continue
        if revision:
            candidate = os.path.join(snapshots, str(revision))
            if os.path.isdir(candidate):
                return candidate
            continue
        revs = sorted(glob.glob(os.path.join(snapshots, "*")), key=os.path.getmtime)
        if revs:
            return revs[-1]
    # What `datasets.load_dataset` prepared: <cache>/<owner>___<name>/<config>/<version>/<hash>/
    for cache in datasets_cache_dirs():
        prepared = os.path.join(cache, str(name).replace("/", "___"))
        tried.append(prepared)
        if os.path.isdir(prepared):
            return prepared
    raise WorkloadError("%s.name %r: not in the local Hugging Face cache (looked in %s); "
                        "download it there first (huggingface-cli download --repo-type dataset "
                        "%s) or give %s.path" % (variable, name, ", ".join(tried), name,
                                                 variable))


def data_files(root: str, split: Optional[str], variable: str) -> List[str]:
    """The readable files under `root` (itself, if a file); with `split`, those naming it."""
    if os.path.isfile(root):
        return [root]
    found = sorted(p for p in glob.glob(os.path.join(root, "**", "*"), recursive=True)
                   if p.endswith(FILE_TYPES) and os.path.isfile(p)
                   and os.path.basename(p) not in ("dataset_info.json", "state.json",
                                                   "dataset_dict.json"))
    if split:
        found = [p for p in found if split in os.path.relpath(p, root).replace(os.sep, "/")]
    if not found:
        raise WorkloadError("%s: no %s file under %s%s" % (
            variable, "/".join(t[1:] for t in FILE_TYPES), root,
            " for split %r" % split if split else ""))
    return found


def _arrow(path: str, variable: str):
    try:
        import pyarrow  # noqa: F401 - optional dependency
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise WorkloadError("%s: reading %s needs the `pyarrow` package on the bench client, which "
                            "is not installed: pip install pyarrow (or convert the file to JSONL)"
                            % (variable, path)) from None
    return pyarrow


def read_rows(path: str, variable: str) -> Iterator[Tuple[str, dict]]:
    """(where, row) for each row of a JSON list, JSONL, parquet or arrow file."""
    base = os.path.basename(path)
    if path.endswith((".parquet", ".arrow")):
        pa = _arrow(path, variable)
        try:
            if path.endswith(".parquet"):
                table = pa.parquet.read_table(path)
            else:
                try:     # `datasets` writes the streaming format; others the file format
                    with pa.ipc.open_stream(path) as reader:
                        table = reader.read_all()
                except pa.ArrowInvalid:
                    with pa.ipc.open_file(path) as reader:
                        table = reader.read_all()
        except (OSError, pa.ArrowException) as exc:
            raise WorkloadError("%s: cannot read %s (%s)" % (variable, path, exc)) from None
        for i, row in enumerate(table.to_pylist()):
            yield "%s row %d" % (base, i + 1), row
        return
    with open(path, encoding="utf-8") as fh:
        head = fh.read(1)
        while head and head.isspace():
            head = fh.read(1)
        fh.seek(0)
        if head == "[":
            try:
                rows = json.load(fh)
            except ValueError as exc:
                raise WorkloadError("%s: %s is not a JSON list (%s)" % (variable, path, exc)) from None
            for i, row in enumerate(rows):
                yield "%s item %d" % (base, i + 1), row
            return
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield "%s line %d" % (base, lineno), json.loads(line)
                except ValueError as exc:
                    raise WorkloadError("%s: %s line %d is not JSON (%s)"
                                        % (variable, path, lineno, exc)) from None


def turns(conversation) -> List[Dict[str, str]]:
    """ShareGPT turns ({from, value}, or {role, content}) as chat messages."""
    out = []
    for turn in conversation or ():
        if not isinstance(turn, dict):
            continue
        who = str(turn.get("from", turn.get("role", ""))).lower()
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str):
            continue
        role = ("user" if who in HUMAN else "assistant" if who in ASSISTANT
                else "system" if who == "system" else None)
        if role:
            out.append({"role": role, "content": text})
    return out


def first_exchange(messages: List[Dict[str, str]]) -> Optional[Tuple[List[dict], str]]:
    """(messages up to the first user turn, the assistant answer after it), or None."""
    for i, m in enumerate(messages):
        if m["role"] == "user":
            if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant":
                return messages[:i + 1], messages[i + 1]["content"]
            return None
    return None


def _row_prompt(row: dict, spec: dict, counter: Counter) -> Optional[Tuple[List[dict], Optional[int]]]:
    """(messages, output tokens or None) of one hf row; None if it has no prompt."""
    if isinstance(row.get("conversations"), list):
        exchange = first_exchange(turns(row["conversations"]))
        return (exchange[0], counter.count(exchange[1])) if exchange else None
    if isinstance(row.get("messages"), list):
        messages = turns(row["messages"])
        exchange = first_exchange(messages)
        if exchange:
            return exchange[0], counter.count(exchange[1])
        return (messages, None) if messages else None
    names = [spec["prompt_field"]] if spec.get("prompt_field") else PROMPT_FIELDS
    text = next((row[n] for n in names if isinstance(row.get(n), str) and row[n]), None)
    if text is None:
        return None
    answers = [spec["output_field"]] if spec.get("output_field") else ANSWER_FIELDS
    answer = next((row[n] for n in answers if isinstance(row.get(n), str)), None)
    out = counter.count(answer) if answer is not None else None
    if out is None and isinstance(row.get("max_tokens"), int):
        out = row["max_tokens"]
    return [{"role": "user", "content": text}], out


def from_rows(spec: dict, counter: Counter, kind: str) -> Workload:
    """The prompts of a sharegpt or hf workload (spec checked by workloads.check_spec)."""
    variable = "workload"
    root = resolve(spec.get("path"), spec.get("name"), spec.get("revision"), variable)
    files = data_files(root, spec.get("split"), variable)
    fixed_out = spec.get("output_tokens")
    # With a seed, every usable entry is read and a sample of `limit` drawn (vLLM shuffles with
    # its seed, then takes the first N); without one, the first `limit` in file order.
    sample = spec.get("seed")
    limit = spec.get("limit") if sample is None else None
    prompts: List[Prompt] = []
    seen = skipped = 0
    for path in files:
        for where, row in read_rows(path, variable):
            seen += 1
            if not isinstance(row, dict):
                raise WorkloadError("%s.path %s: expected an object, got %s"
                                    % (variable, where, type(row).__name__))
            if kind == "sharegpt":
                if not isinstance(row.get("conversations"), list):
                    raise WorkloadError("%s.path %s: a ShareGPT entry has `conversations`: [{from, "
                                        "value}, ...] (use kind hf for other row formats)"
                                        % (variable, where))
                exchange = first_exchange(turns(row["conversations"]))
                got = (exchange[0], counter.count(exchange[1])) if exchange else None
            else:
                got = _row_prompt(row, spec, counter)
            if got is None:
                skipped += 1
                continue
            messages, out = got
            n_in = counter.count(messages[-1]["content"])
            # vLLM's filter; with a fixed output length the answer's own does not matter
            if kind == "sharegpt" and (n_in < MIN_TOKENS
                                       or (not fixed_out and (out or 0) < MIN_TOKENS)):
                skipped += 1
                continue
            prompts.append(Prompt(messages=messages, max_tokens=fixed_out or out or None,
                                  ignore_eos=bool(spec.get("ignore_eos", False)),
                                  label=where, input_tokens=n_in))
            if limit and len(prompts) >= limit:
                break
        if limit and len(prompts) >= limit:
            break
    if sample is not None:
        random.Random(sample).shuffle(prompts)
        prompts = prompts[:spec["limit"]] if spec.get("limit") else prompts
    if not prompts:
        raise WorkloadError("%s: no usable prompts in %s (%d rows read, %d without a prompt%s)"
                            % (variable, root, seen, skipped,
                               " or with a prompt or answer under %d tokens" % MIN_TOKENS
                               if kind == "sharegpt" else ""))
    return Workload(kind, prompts, "%d prompts from %s (%s)" % (len(prompts), root, kind),
                    token_source=counter.source)
