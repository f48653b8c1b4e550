"""The workloads users bring (issue 28, item 2): ShareGPT files, Hugging Face datasets from a
local path or cache, shared-prefix groups, multi-turn conversations, trace replay, and the
optional tokenizer. Every fixture is written here; nothing is fetched."""
from __future__ import annotations

import json
import sys

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError, level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.generated import (
    ConversationOrder,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.trace import (
    NEVER_NS, TraceSchedule, mean_rate,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (
    WorkloadError, check_spec, load, reads_client_files,
)

ANSWER = "here is a long enough answer with many words in it"       # 11 words


def sharegpt_entries():
    return [
        {"id": "a", "conversations": [{"from": "human", "value": "explain python decorators "
                                       "with an example please"},
                                      {"from": "gpt", "value": ANSWER}]},
        # a system turn first: the first human turn is still the prompt
        {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": "what is a monad in haskell"},
                                      {"from": "gpt", "value": "a monoid in the category of "
                                                               "endofunctors, roughly"},
                                      {"from": "human", "value": "thanks"},
                                      {"from": "gpt", "value": "you are welcome"}]},
        {"id": "short", "conversations": [{"from": "human", "value": "hi"},
                                          {"from": "gpt", "value": "hello there my friend"}]},
        {"id": "unanswered", "conversations": [{"from": "human", "value": "is anyone here at "
                                                                          "all today"}]},
    ]


def test_sharegpt_first_human_turn_is_the_prompt_the_answer_sets_the_length(tmp_path):
    path = tmp_path / "ShareGPT_V3.json"
    path.write_text(json.dumps(sharegpt_entries()))
    w = load({"kind": "sharegpt", "path": str(path)})
    assert w.kind == "sharegpt" and len(w.prompts) == 2        # short and unanswered skipped
    first, second = w.prompts
    assert first.messages == [{"role": "user", "content": "explain python decorators with an "
                                                          "example please"}]
    assert first.max_tokens == 11 and first.input_tokens == 7 and not first.ignore_eos
    assert [m["role"] for m in second.messages] == ["system", "user"]
    assert second.max_tokens == 8
    assert w.token_source == "words"
    fixed = load({"kind": "sharegpt", "path": str(path), "output_tokens": 32, "limit": 1})
    assert [p.max_tokens for p in fixed.prompts] == [32]
    # a fixed output length: the answer's own length no longer filters ("short" has a 2-word
    # prompt, still skipped); a seed draws the sample at random
    assert len(load({"kind": "sharegpt", "path": str(path), "output_tokens": 32}).prompts) == 2
    path.write_text(json.dumps([dict(sharegpt_entries()[0], id=str(i)) for i in range(30)]))
    drawn = load({"kind": "sharegpt", "path": str(path), "limit": 5, "seed": 3}).prompts
    in_order = ["ShareGPT_V3.json item %d" % i for i in range(1, 6)]
    assert len(drawn) == 5 and [p.label for p in drawn] != in_order
    assert [p.label for p in drawn] == [p.label for p in load(
        {"kind": "sharegpt", "path": str(path), "limit": 5, "seed": 3}).prompts]
    path.write_text(json.dumps(sharegpt_entries()))
    path.write_text(json.dumps([{"prompt": "not sharegpt"}]))
    with pytest.raises(WorkloadError, match=r"workload.path .*item 1.*conversations"):
        load({"kind": "sharegpt", "path": str(path)})


def test_hf_rows_from_jsonl_parquet_and_arrow_files_and_a_split(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    data = tmp_path / "ds" / "data"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text(
        json.dumps({"prompt": "write a haiku about rust", "completion": "one two three four"})
        + "\n" + json.dumps({"question": "why is the sky blue", "max_tokens": 7}) + "\n")
    pq.write_table(pa.Table.from_pylist([{"conversations": sharegpt_entries()[0]["conversations"]}]),
                   str(data / "train-00000-of-00001.parquet"))
    table = pa.Table.from_pylist([{"messages": [{"role": "user", "content": "test question"}]}])
    with pa.ipc.new_stream(str(data / "test.arrow"), table.schema) as writer:
        writer.write_table(table)
    w = load({"kind": "hf", "path": str(tmp_path / "ds"), "split": "train"})
    # the files in name order: train-00000-of-00001.parquet, then train.jsonl
    assert [p.messages[-1]["content"] for p in w.prompts] == [
        "explain python decorators with an example please", "write a haiku about rust",
        "why is the sky blue"]
    assert [p.max_tokens for p in w.prompts] == [11, 4, 7]
    arrow = load({"kind": "hf", "path": str(data / "test.arrow")})
    assert arrow.prompts[0].messages == [{"role": "user", "content": "test question"}]
    assert arrow.prompts[0].max_tokens is None        # the max_tokens option then applies
    field = load({"kind": "hf", "path": str(data / "train.jsonl"), "prompt_field": "question"})
    assert [p.text for p in field.prompts] == ["why is the sky blue"]


def test_hf_dataset_by_name_from_the_local_cache_never_the_hub(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "datasets--someone--tiny-chat" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "data.jsonl").write_text(json.dumps({"text": "hello from the cache"}) + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    w = load({"kind": "hf", "name": "someone/tiny-chat"})
    assert w.prompts[0].text == "hello from the cache"
    assert load({"kind": "hf", "name": "someone/tiny-chat", "revision": "abc123"}).prompts
    # what datasets.load_dataset prepared: arrow files in the streaming format, one per split
    pa = pytest.importorskip("pyarrow")
    prepared = tmp_path / "datasets" / "someone___prepared" / "default" / "0.0.0" / "f00"
    prepared.mkdir(parents=True)
    for split in ("train", "test"):
        table = pa.Table.from_pylist([{"prompt": "a %s prompt" % split}])
        with pa.ipc.new_stream(str(prepared / ("prepared-%s.arrow" % split)), table.schema) as out:
            out.write_table(table)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    w = load({"kind": "hf", "name": "someone/prepared", "split": "test"})
    assert [p.text for p in w.prompts] == ["a test prompt"]
    with pytest.raises(WorkloadError, match=r"workload.name 'someone/other'.*huggingface-cli "
                                            r"download --repo-type dataset someone/other"):
        load({"kind": "hf", "name": "someone/other"})


def test_a_missing_reader_names_the_variable_and_the_install_command(tmp_path, monkeypatch):
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(WorkloadError, match=r"workload: reading .*x.parquet needs the `pyarrow` "
                                            r"package .*pip install pyarrow"):
        load({"kind": "hf", "path": str(tmp_path / "x.parquet")})
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(WorkloadError, match=r"workload.tokenizer .*tokenizer.json.*pip install "
                                            r"tokenizers"):
        load({"kind": "synthetic", "input_tokens": 8, "output_tokens": 4,
              "tokenizer": str(tmp_path / "tokenizer.json")})
    empty = tmp_path / "model"
    empty.mkdir()
    with pytest.raises(WorkloadError, match=r"workload.tokenizer .*pip install transformers"):
        load({"kind": "synthetic", "input_tokens": 8, "output_tokens": 4,
              "tokenizer": str(empty)})


def test_shared_prefix_groups_share_a_system_prefix_each_prompt_its_own_question():
    w = load({"kind": "shared_prefix", "groups": 3, "prompts_per_group": 4,
              "prefix_tokens": 50, "question_tokens": 10, "output_tokens": 16, "seed": 2})
    assert len(w.prompts) == 12 and w.kind == "shared_prefix"
    prefixes = [p.messages[0]["content"] for p in w.prompts]
    assert len(set(prefixes)) == 3
    assert all(len(set(prefixes[g * 4:(g + 1) * 4])) == 1 for g in range(3))
    assert len({p.messages[0]["content"].split()[0] for p in w.prompts}) == 3   # groups differ
    assert len({p.messages[1]["content"] for p in w.prompts}) == 12
    assert all(p.messages[0]["role"] == "system" and p.messages[1]["role"] == "user"
               for p in w.prompts)
    assert all(len(p.messages[0]["content"].split()) == 50 for p in w.prompts)
    assert all(len(p.messages[1]["content"].split()) == 10 for p in w.prompts)
    assert all(p.max_tokens == 16 and p.ignore_eos and p.input_tokens == 60 for p in w.prompts)


def test_multi_turn_each_turn_carries_the_history_and_turns_go_in_order():
    w = load({"kind": "multi_turn", "conversations": 3, "turns": 3, "input_tokens": 12,
              "output_tokens": 8})
    assert len(w.prompts) == 9 and w.conversations == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    for conv in w.conversations:
        turns = [w.prompts[i] for i in conv]
        assert [len(t.messages) for t in turns] == [1, 3, 5]
        for earlier, later in zip(turns, turns[1:]):
            # the later turn's history: the earlier request, its answer, then the new question
            assert later.messages[:len(earlier.messages)] == earlier.messages
            assert later.messages[len(earlier.messages)]["role"] == "assistant"
            assert len(later.messages[len(earlier.messages)]["content"].split()) == 8
        assert all(t.max_tokens == 8 and t.ignore_eos for t in turns)
    # Closed loop: a worker sends a whole conversation in order, then its next one.
    first, second = ConversationOrder(w.conversations, 0, 2), ConversationOrder(w.conversations, 1, 2)
    assert [first.next_index() for _i in range(6)] == [0, 1, 2, 6, 7, 8]
    assert [second.next_index() for _i in range(4)] == [3, 4, 5, 0]


def test_multi_turn_from_a_sharegpt_file_uses_its_answers_as_history(tmp_path):
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(sharegpt_entries()))
    w = load({"kind": "multi_turn", "path": str(path)})
    # a: one turn; b: two turns (system kept); short: one turn; unanswered: none
    assert [len(c) for c in w.conversations] == [1, 2, 1]
    b2 = w.prompts[w.conversations[1][1]]
    assert [m["role"] for m in b2.messages] == ["system", "user", "assistant", "user"]
    assert b2.messages[2]["content"].startswith("a monoid") and b2.max_tokens == 3
    assert not b2.ignore_eos
    capped = load({"kind": "multi_turn", "path": str(path), "turns": 1, "conversations": 2})
    assert [len(c) for c in capped.conversations] == [1, 1]


def test_trace_replay_sends_at_the_relative_scaled_timestamps(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 1000, "input_length": 30, "output_length": 5, "hash_ids": [1]},
            {"timestamp": 1500, "input_length": 12, "output_length": 9},
            {"timestamp": 3000, "input_length": 20, "output_length": 3},
            {"timestamp": 1200, "input_length": 8, "output_length": 2}]      # out of order
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = load({"kind": "trace", "path": str(path)})
    assert w.arrivals_s == [0.0, 0.2, 0.5, 2.0]
    assert [p.input_tokens for p in w.prompts] == [30, 8, 12, 20]
    assert [len(p.text.split()) for p in w.prompts] == [30, 8, 12, 20]
    assert [p.max_tokens for p in w.prompts] == [5, 2, 9, 3]
    assert all(p.ignore_eos for p in w.prompts)
    assert load({"kind": "trace", "path": str(path), "speedup": 2}).arrivals_s == [
        0.0, 0.1, 0.25, 1.0]
    assert mean_rate(w.arrivals_s) == pytest.approx(1.5)
    # Two client processes interleave the arrivals; each sends the trace's own prompt.
    s0, s1 = TraceSchedule(w.arrivals_s, 10, 0, 2), TraceSchedule(w.arrivals_s, 10, 1, 2)
    assert (s0.index_of_next, s0.advance(), s0.index_of_next, s0.advance()) == (
        0, 10, 2, 10 + 500_000_000)
    assert s0.done and s0.next_ns == NEVER_NS and s0.index_of_next is None
    assert [s1.advance(), s1.advance()] == [10 + 200_000_000, 10 + 2_000_000_000]
    azure = tmp_path / "azure.jsonl"
    azure.write_text(json.dumps({"TIMESTAMP": 2.5, "ContextTokens": 4, "GeneratedTokens": 6})
                     + "\n" + json.dumps({"TIMESTAMP": 3.0, "ContextTokens": 5,
                                          "GeneratedTokens": 1}) + "\n")
    a = load({"kind": "trace", "path": str(azure), "timestamp_unit": "s"})
    assert a.arrivals_s == [0.0, 0.5] and [p.max_tokens for p in a.prompts] == [6, 1]
    azure.write_text(json.dumps({"timestamp": 1, "input_length": 3}) + "\n")
    with pytest.raises(WorkloadError, match="line 1: no output length"):
        load({"kind": "trace", "path": str(azure)})


def _fixture_tokenizer(path):
    """A word-level tokenizer that splits numbers into digits: the kind of vocabulary where one
    word is not one token (the 78-tokens-for-64 of the issue)."""
    tokenizers = pytest.importorskip("tokenizers")
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import workloads
    words = list(workloads._WORDS)
    vocab = {"[UNK]": 0}
    for w in words + list("0123456789"):
        vocab.setdefault(w, len(vocab))
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Whitespace(),
        tokenizers.pre_tokenizers.Digits(individual_digits=True)])
    tok.save(str(path))
    return tokenizers.Tokenizer.from_file(str(path))


def test_a_tokenizer_makes_input_lengths_exact_and_says_so(tmp_path):
    path = tmp_path / "tokenizer.json"
    tok = _fixture_tokenizer(path)

    def count(text):
        return len(tok.encode(text, add_special_tokens=False).ids)

    spec = {"kind": "synthetic", "input_tokens": 64, "output_tokens": 8, "count": 6}
    approx = load(spec)
    assert approx.token_source == "words"
    assert all(count(p.text) > 64 for p in approx.prompts)     # the number is 6 tokens, not 1
    exact = load(dict(spec, tokenizer=str(path)))
    assert exact.token_source == "tokenizer:%s" % path
    assert [count(p.text) for p in exact.prompts] == [64] * 6
    assert all(p.input_tokens == 64 for p in exact.prompts)
    assert "~" not in exact.description and "~" in approx.description
    by_dir = load(dict(spec, tokenizer=str(tmp_path)))      # a directory holding tokenizer.json
    assert [count(p.text) for p in by_dir.prompts] == [64] * 6
    sp = load({"kind": "shared_prefix", "groups": 2, "prompts_per_group": 2,
               "prefix_tokens": 40, "question_tokens": 9, "output_tokens": 4,
               "tokenizer": str(path)})
    assert all(count(p.messages[0]["content"]) == 40 and count(p.messages[1]["content"]) == 9
               for p in sp.prompts)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 33, "output_length": 2}) + "\n")
    assert [count(p.text) for p in load({"kind": "trace", "path": str(trace),
                                         "tokenizer": str(path)}).prompts] == [33]


def test_without_a_tokenizer_the_prompt_text_is_unchanged():
    """The words path is today's synthetic workload, byte for byte (same seed, same prompts)."""
    w = load({"kind": "synthetic", "input_tokens": 20, "output_tokens": 5, "count": 3, "seed": 7})
    import random
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import workloads
    rng = random.Random(7)
    words = [str(rng.randrange(10 ** 6))] + [rng.choice(workloads._TOKEN_WORDS) for _i in range(19)]
    assert w.prompts[0].text == " ".join(words)


@pytest.mark.parametrize("spec, field", [
    ({"kind": "sharegpt"}, "workload.path is required for kind sharegpt"),
    ({"kind": "trace"}, "workload.path is required for kind trace"),
    ({"kind": "hf"}, "workload.path or workload.name"),
    ({"kind": "hf", "name": "local"}, "owner/name"),
    ({"kind": "trace", "path": "t", "speedup": 0}, "workload.speedup"),
    ({"kind": "trace", "path": "t", "timestamp_unit": "h"}, "workload.timestamp_unit"),
    ({"kind": "shared_prefix", "prefix_tokens": 8, "question_tokens": 0, "output_tokens": 1},
     "workload.question_tokens"),
    ({"kind": "shared_prefix", "prefix_tokens": 8}, "workload.question_tokens is required"),
    ({"kind": "multi_turn", "turns": 2}, "workload.input_tokens is required"),
    ({"kind": "synthetic", "input_tokens": 1, "output_tokens": 1, "tokenizer": 3},
     "workload.tokenizer"),
    ({"kind": "sharegpt", "path": "p", "ignore_eos": "maybe"}, "workload.ignore_eos"),
    ({"kind": "sharegpt", "path": "p", "groups": 2}, "unknown key.*groups for kind sharegpt"),
])
def test_bad_new_workloads_name_the_field(spec, field):
    with pytest.raises(WorkloadError, match=field):
        load(spec)


def test_the_hf_reader_is_the_one_error_path_for_a_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"workload.path .*no such file"):
        load({"kind": "hf", "path": str(tmp_path / "absent.parquet")})
    with pytest.raises(WorkloadError, match=r"workload.tokenizer .*no such file"):
        load({"kind": "synthetic", "input_tokens": 1, "output_tokens": 1,
              "tokenizer": str(tmp_path / "nope")})


def test_which_workloads_read_files_on_the_bench_client():
    assert reads_client_files(check_spec({"kind": "sharegpt", "path": "a.json"}))
    assert reads_client_files(check_spec({"kind": "hf", "name": "o/n"}))
    assert reads_client_files(check_spec({"kind": "synthetic", "input_tokens": 1,
                                          "output_tokens": 1, "tokenizer": "/t.json"}))
    assert not reads_client_files(check_spec({"kind": "multi_turn", "input_tokens": 1,
                                              "output_tokens": 1}))
    assert not reads_client_files(check_spec({"kind": "builtin"}))


def test_the_options_accept_the_new_kinds_on_the_controller_without_reading_files():
    configs, workload = level_configs({"base_url": "http://127.0.0.1:1", "concurrency": [1],
                                       "model": "m", "workload": {"kind": "sharegpt",
                                                                  "path": "/nowhere.json"}},
                                      read_workload=False)
    assert workload is None and len(configs) == 1
    with pytest.raises(BenchOptionsError, match="workload.path is required for kind trace"):
        level_configs({"base_url": "http://127.0.0.1:1", "concurrency": [1], "model": "m",
                       "workload": {"kind": "trace"}}, read_workload=False)


def test_a_level_that_cannot_keep_the_order_refuses_trace_and_multi_turn(tmp_path, monkeypatch):
    """Until the load generator has the hooks (level.WORKLOAD_HOOKS), a trace or multi-turn
    workload would be sent shuffled: the options say so instead of measuring something else."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import level
    monkeypatch.setattr(level, "WORKLOAD_HOOKS", (), raising=False)
    base = {"base_url": "http://127.0.0.1:1", "concurrency": [1], "model": "m"}
    with pytest.raises(BenchOptionsError, match=r"workload.kind trace: .*trace timestamp"):
        level_configs(dict(base, workload={"kind": "trace", "path": "/t.jsonl"}),
                      read_workload=False)
    with pytest.raises(BenchOptionsError, match=r"workload.kind multi_turn: .*turns in order"):
        level_configs(dict(base, workload={"kind": "multi_turn", "input_tokens": 4,
                                           "output_tokens": 4}), read_workload=False)
    monkeypatch.setattr(level, "WORKLOAD_HOOKS", ("arrivals", "conversations"), raising=False)
    assert level_configs(dict(base, workload={"kind": "multi_turn", "input_tokens": 4,
                                              "output_tokens": 4}))[1].conversations


class _DigitTokenizer:
    """A stand-in tokenizer (no package needed): a word is a token, but every digit of a number
    is a token of its own, as in the BPE vocabularies where "64 tokens" of words came to 78."""

    def __init__(self):
        self.vocab = {}
        self.words = []

    def encode(self, text):
        ids = []
        for word in text.split():
            for piece in (list(word) if word.isdigit() else [word]):
                if piece not in self.vocab:
                    self.vocab[piece] = len(self.words)
                    self.words.append(piece)
                ids.append(self.vocab[piece])
        return ids

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_exact_lengths_with_any_tokenizer_behind_the_counter():
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.tokens import Tokenizer
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import synthetic
    fake = _DigitTokenizer()
    counter = Tokenizer("/models/fake", fake.encode, fake.decode)
    words = synthetic(64, 8, count=5, seed=3)
    assert all(len(fake.encode(p.text)) > 64 for p in words.prompts)     # the head's digits
    exact = synthetic(64, 8, count=5, seed=3, counter=counter)
    assert [len(fake.encode(p.text)) for p in exact.prompts] == [64] * 5
    assert exact.token_source == "tokenizer:/models/fake" and words.token_source == "words"


def test_the_old_kinds_keep_their_rules(tmp_path):
    """jsonl's `limit: 0` (or null) is still "no limit"; synthetic's seed still defaults to 1."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert len(load({"kind": "jsonl", "path": str(path), "limit": 0}).prompts) == 2
    assert check_spec({"kind": "synthetic", "input_tokens": 2, "output_tokens": 2})["seed"] == 1
