"""Role sglang's venv filters (plugins/filter/sglang_venv.py): a venv's name from its pins, the rollback
state recorded before the first change, and what the rollback did, in words for the stack's report."""
from __future__ import annotations

import base64
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter import sglang_venv as f

PINS = ["torch==2.14.1+cu130", "sglang-kernel==0.4.10+cu130", "sglang==0.5.23", "flashinfer-python==0.7.2",
        "flashinfer-cubin==0.7.2", "flashinfer-jit-cache==0.7.2+cu130"]


def test_a_venv_is_named_by_everything_pip_would_install_differently():
    name = f.venv_name(PINS, "0.5.23", "13.0")
    assert name.startswith("sglang-0.5.23-cu130-") and len(name) == len("sglang-0.5.23-cu130-") + 10
    assert f.venv_name(list(reversed(PINS)), "0.5.23", "13.0") == name, "the order of the pins does not matter"
    assert f.venv_name(PINS + ["torchvision==0.29.1+cu130"], "0.5.23", "13.0") != name
    assert f.venv_name(PINS, "0.5.23", "13.0", python="python3.12") != name
    assert f.venv_name([p.replace("0.7.2", "0.7.3") for p in PINS], "0.5.23", "13.0") != name


def b64(data) -> str:
    return base64.b64encode(json.dumps(data).encode()).decode()


def test_the_rollback_state_is_read_or_refused_naming_the_file():
    state = {"venv": {"kind": "dir", "link": None, "parked": "/opt/sglang/venvs/previous"}, "fact": "",
             "recorded": "2026-12-06T03:11:44Z", "build": "/opt/sglang/venvs/x", "path": "/opt/sglang/venv"}
    assert f.rollback_state(b64(state)) == {k: state[k] for k in ("venv", "fact", "recorded")}
    for bad, why in ((b64({"venv": {"kind": "dir"}, "fact": "", "recorded": "x"}), "without the place"),
                     (b64({"venv": {"kind": "link"}, "fact": "", "recorded": "x"}), "link without its target"),
                     (b64({"venv": {"kind": "file"}, "fact": "", "recorded": "x"}), "not a link, a directory"),
                     (b64({"fact": ""}), "missing venv, recorded"), ("bm90IGpzb24=", "Expecting value")):
        with pytest.raises(AnsibleFilterError, match=why) as err:
            f.rollback_state(bad, "/var/lib/servelab/sglang-rollback.json")
        assert str(err.value).startswith("/var/lib/servelab/sglang-rollback.json is not a rollback state")


VENV = "/opt/sglang/venv"
DIR = {"kind": "dir", "link": None, "parked": "/opt/sglang/venvs/previous"}


def test_the_outcome_of_a_venv_put_back():
    after = {"path": VENV, "kind": "dir", "link": None, "resolved": VENV}
    out = f.rollback_outcome({"changed": True}, DIR, after, VENV, "2.14.1+cu128", ["/opt/sglang/venvs/sglang-x"])
    assert out == {"restored": True, "text": "the SGLang venv /opt/sglang/venv put back: the venv directory "
                                             "(torch 2.14.1+cu128), as before; the venv built beside it removed "
                                             "(/opt/sglang/venvs/sglang-x)"}
    untouched = f.rollback_outcome({"changed": False}, DIR, after, VENV, "2.14.1+cu128", [])
    assert untouched["restored"] and untouched["text"].startswith("the SGLang venv /opt/sglang/venv not touched: ")
    none = f.rollback_outcome({"changed": False}, {"kind": "absent"}, {"kind": "absent"}, VENV)
    assert none == {"restored": True, "text": "the SGLang venv /opt/sglang/venv not touched: absent, as before"}


def test_the_outcome_of_a_venv_not_put_back_is_said():
    link = {"kind": "link", "link": "/opt/sglang/venvs/new", "resolved": "/opt/sglang/venvs/new"}
    failed = f.rollback_outcome({"failed": True, "msg": "the venv directory ... is not at /opt/sglang/venvs/previous"},
                                DIR, link, VENV, "2.14.1+cu130")
    assert not failed["restored"]
    assert failed["text"] == ("the SGLang venv /opt/sglang/venv could NOT be put back (the venv directory ... is not at "
                              "/opt/sglang/venvs/previous): it is a link to /opt/sglang/venvs/new (torch 2.14.1+cu130)")
    other = f.rollback_outcome({"changed": True}, {"kind": "link", "link": "/opt/sglang/venvs/old"}, link, VENV)
    assert not other["restored"] and "NOT what it was before: a link to /opt/sglang/venvs/old" in other["text"]
