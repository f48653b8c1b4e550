"""The streaming HTTP/SSE parser (loadgen_http.StreamConnection), fed bytes directly.

Every response is also fed split at every byte position and in random pieces: the parsed request
must not depend on how TCP cut the stream.
"""
from __future__ import annotations

import json
import random

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    Endpoint, request_body,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.stream import StreamConnection
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import RequestTiming, TOKENS_CHUNKS, TOKENS_SERVER
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import Prompt


class FakeTransport:
    def __init__(self):
        self.written = []
        self.closed = False

    def write(self, data):
        self.written.append(data)

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = True


def chunked(events, sep=b"\n\n"):
    body = b""
    for ev in events:
        data = b"data: " + ev + sep
        body += b"%x\r\n%s\r\n" % (len(data), data)
    return body + b"0\r\n\r\n"


HEAD_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def chat_events(pieces, usage=True, continuous=False, spaced=False):
    dumps = (lambda o: json.dumps(o).encode()) if spaced else (
        lambda o: json.dumps(o, separators=(",", ":")).encode())
    out = [dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    total = 0
    for piece, k in pieces:
        total += k
        obj = {"choices": [{"index": 0, "delta": {"content": piece, "reasoning_content": None},
                            "finish_reason": None}], "usage": None}
        if continuous:
            obj["usage"] = {"prompt_tokens": 5, "completion_tokens": total,
                            "total_tokens": 5 + total}
        out.append(dumps(obj))
    out.append(dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if usage:
        out.append(dumps({"choices": [], "usage": {"prompt_tokens": 5,
                                                   "completion_tokens": total}}))
    out.append(b"[DONE]")
    return out


def run_stream(api, pieces_of_bytes, clock=None):
    """Send one request on a fake connection, feed the response pieces, return the request."""
    done = []
    conn = StreamConnection(api, lambda c, r: done.append(r), lambda c: None)
    conn.connection_made(FakeTransport())
    r = RequestTiming(worker=0, request_id=1, t_send=0)
    conn.send(r, b"POST / HTTP/1.1\r\n\r\n")
    for piece in pieces_of_bytes:
        conn.data_received(piece)
    return done, conn


def splits(data: bytes, rng: random.Random, n: int = 30):
    """Every 2-piece split, plus `n` random many-piece splits."""
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
    for _i in range(n):
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(2, 40))))
        yield [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def summary(r):
    return (r.error, r.completion_tokens, r.prompt_tokens, r.tokens_source, r.chunks,
            None if r.chunk_tokens is None else list(r.chunk_tokens))


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
@pytest.mark.parametrize("continuous", [False, True])
def test_chat_stream_parsed_identically_however_it_is_split(sep, continuous):
    pieces = [("Hello", 1), (" wor", 1), ("ld, \\\"quoted\\\"", 2), ("!", 1)]
    data = HEAD_CHUNKED + chunked(chat_events(pieces, continuous=continuous), sep)
    done, _conn = run_stream("openai_chat", [data])
    assert len(done) == 1
    expected = summary(done[0])
    assert expected[0] is None
    assert expected[1] == 5 and expected[2] == 5 and expected[3] == TOKENS_SERVER
    assert expected[4] == 4                       # 4 token-carrying chunks; role/finish are not
    assert expected[5] == ([1, 1, 2, 1] if continuous else None)
    rng = random.Random(1)
    for parts in splits(data, rng):
        done, _conn = run_stream("openai_chat", parts)
        assert len(done) == 1, parts
        assert summary(done[0]) == expected, parts


def test_spaced_json_and_reasoning_first_are_still_token_chunks():
    events = [json.dumps({"choices": [{"delta": {"reasoning_content": None, "content": "x"}}]})
              .encode(),
              json.dumps({"choices": [{"delta": {"reasoning_content": "think"}}]}).encode(),
              json.dumps({"choices": [{"delta": {"tool_calls": [{"function": {
                  "arguments": "{}"}}]}}]}).encode(),
              json.dumps({"choices": [], "usage": {"prompt_tokens": 3,
                                                   "completion_tokens": 3}}).encode(),
              b"[DONE]"]
    done, _conn = run_stream("openai_chat", [HEAD_CHUNKED + chunked(events)])
    assert done[0].error is None
    assert done[0].chunks == 3 and done[0].completion_tokens == 3


def test_without_usage_the_chunk_count_is_the_labelled_fallback():
    data = HEAD_CHUNKED + chunked(chat_events([("a", 1), ("b", 1), ("c", 1)], usage=False))
    done, _conn = run_stream("openai_chat", [data])
    r = done[0]
    assert r.error is None
    assert r.completion_tokens == 3 and r.tokens_source == TOKENS_CHUNKS


def test_sglang_generate_takes_per_chunk_counts_from_meta_info():
    events = []
    text = ""
    for cum in (2, 5, 6):
        text += "ab" * cum
        events.append(json.dumps({"text": text, "meta_info": {
            "prompt_tokens": 9, "completion_tokens": cum, "finish_reason": None}}).encode())
    events.append(b"[DONE]")
    data = HEAD_CHUNKED + chunked(events)
    rng = random.Random(2)
    for parts in [[data]] + list(splits(data, rng, 10)):
        done, _conn = run_stream("sglang_generate", parts)
        r = done[0]
        assert (r.error, r.completion_tokens, r.prompt_tokens, list(r.chunk_tokens)) == (
            None, 6, 9, [2, 3, 1])


def test_close_delimited_body_ends_at_connection_close():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    body = b"".join(b"data: " + e + b"\n\n" for e in chat_events([("a", 1), ("b", 1)]))
    done, conn = run_stream("openai_chat", [head, body])
    assert done == []                       # not finished until the server closes
    conn.connection_lost(None)
    assert done[0].error is None and done[0].completion_tokens == 2
    assert not conn.reusable


def test_http_error_status_is_recorded_with_the_body():
    msg = b'{"error":{"message":"model not found"}}'
    data = (b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(msg), msg))
    for parts in ([data], [data[:20], data[20:]]):
        done, _conn = run_stream("openai_chat", parts)
        assert done[0].error.startswith("HTTP 404")
        assert "model not found" in done[0].error


def test_error_event_inside_the_stream_fails_the_request():
    events = [b'{"error":{"message":"out of memory"}}', b"[DONE]"]
    done, _conn = run_stream("openai_chat", [HEAD_CHUNKED + chunked(events)])
    assert "out of memory" in done[0].error


def test_connection_lost_mid_stream_is_an_error_with_what_arrived():
    data = HEAD_CHUNKED + chunked(chat_events([("a", 1), ("b", 1)]))
    done, conn = run_stream("openai_chat", [data[:len(data) // 2]])
    conn.connection_lost(ConnectionResetError("reset"))
    assert done[0].error.startswith("connection lost")


def test_keep_alive_serves_the_next_request_on_the_same_connection():
    data = HEAD_CHUNKED + chunked(chat_events([("a", 1)]))
    done = []
    conn = StreamConnection("openai_chat", lambda c, r: done.append(r), lambda c: None)
    conn.connection_made(FakeTransport())
    for i in range(3):
        conn.send(RequestTiming(worker=0, request_id=i, t_send=0), b"x")
        # the final CRLF of the previous body arriving late, glued to the next head
        conn.data_received(data[:-2] if i < 2 else data)
        if i < 2:
            conn.data_received(b"")
    assert [r.error for r in done] == [None, None, None]
    assert conn.reusable


def test_timestamps_one_clock_read_per_socket_read():
    data = HEAD_CHUNKED + chunked(chat_events([("a", 1), ("b", 1), ("c", 1)]))
    done, _conn = run_stream("openai_chat", [data])
    r = done[0]
    assert r.t_send <= r.t_first == r.t_last        # all chunks came in one read
    assert len(set(r.chunk_times)) == 1


def test_endpoint_and_request_body():
    ep = Endpoint("http://127.0.0.1:30000/v1", "openai_chat", api_key="k")
    assert ep.path == "/v1/chat/completions"
    wire = ep.wire(b"{}")
    assert wire.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:30000\r\n")
    assert b"Authorization: Bearer k\r\n" in wire and wire.endswith(b"Content-Length: 2\r\n\r\n{}")
    assert Endpoint("http://h:1", "sglang_generate").path == "/generate"
    with pytest.raises(ValueError, match="base_url"):
        Endpoint("127.0.0.1:30000", "openai_chat")
    p = Prompt(messages=[{"role": "user", "content": "hi"}])
    chat = json.loads(request_body("openai_chat", "m", p, 7, True, {"temperature": 0}))
    assert chat["stream"] and chat["max_tokens"] == 7 and chat["ignore_eos"]
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert chat["temperature"] == 0 and chat["messages"][0]["content"] == "hi"
    gen = json.loads(request_body("sglang_generate", "", p, 7, True))
    assert gen == {"text": "hi", "sampling_params": {"max_new_tokens": 7, "ignore_eos": True},
                   "stream": True}


def test_a_truncated_event_is_malformed_not_a_token():
    broken = b'{"id":"x","object":"broken","choices":[{"index":0,"delta":{"content":"'
    events = chat_events([("a", 1)])
    events.insert(2, broken)
    done, _conn = run_stream("openai_chat", [HEAD_CHUNKED + chunked(events)])
    assert done[0].error.startswith("malformed chunk")
    assert done[0].chunks == 1
    gen = [b'{"text":"ab","meta_info":{"completion_tokens":1}}',
           b'{"text":"abcd","meta_info":{"com', b"[DONE]"]
    done, _conn = run_stream("sglang_generate", [HEAD_CHUNKED + chunked(gen)])
    assert done[0].error.startswith("malformed chunk")
