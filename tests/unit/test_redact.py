"""module_utils/redact.py: which names are secrets, and that their values never survive."""
from __future__ import annotations

import shlex

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.redact import (
    MARKER,
    Rules,
    collect_secrets,
    is_secret_flag,
    is_secret_name,
    redact_argv,
    redact_cmdline,
    redact_env,
    redact_text,
    redact_tree,
    secret_values,
)

CANARY = "canary-5f3a9c1e"


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "OPENAI_API_KEY", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
    "SECRET_KEY_BASE", "DB_PASSWORD", "DB_PASS", "MYSQL_PASSWD", "GOOGLE_CREDENTIALS",
    "NGC_AUTH", "apiKey", "api_key", "api-key", "hf-token", "token", "env.HF_TOKEN",
    "API_KEY_SECRET", "x-api-key", "MY_APIKEY_VALUE",
])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    # the false positives a substring match would make
    "CUDA_VISIBLE_DEVICES", "MONKEY", "KEYBOARD_LAYOUT", "TOKENIZERS_PARALLELISM",
    "max_tokens", "num_draft_tokens", "PWD", "PATH",
    # a secret word followed by what the value really is: a path, a socket, a map file, an id
    "SSH_AUTH_SOCK", "HF_TOKEN_PATH", "speculative-token-map", "speculative_token_map",
    "AWS_ACCESS_KEY_ID", "PASSWORD_FILE",
    # TOKEN as a unit, inside a name: the simulator's and SGLang's own flags
    "moe-token-share", "prefill-per-token-ms", "TOKEN_COUNT",
])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_user_list_adds_exact_names_and_flags():
    rules = Rules.of(["my_license", "--license"])
    assert is_secret_name("MY_LICENSE", rules) and not is_secret_name("MY_LICENSE")
    assert is_secret_flag("--license", rules) and is_secret_flag("--license=x", rules)
    assert not is_secret_flag("--license")


def test_argv_flag_forms_and_switches():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", CANARY, "--hf-token=" + CANARY,
            "--enable-auth", "--port", "30000", "HF_TOKEN=" + CANARY,
            "--speculative-token-map", "/models/map.pt", "--tp", "8"]
    out = redact_argv(argv)
    assert CANARY not in " ".join(out)
    assert out[3:5] == ["--api-key", MARKER] and out[5] == "--hf-token=" + MARKER
    # a secret-named switch does not swallow the next flag; paths and sizes stay
    assert out[6:9] == ["--enable-auth", "--port", "30000"]
    assert out[9] == "HF_TOKEN=" + MARKER
    assert out[10:] == ["--speculative-token-map", "/models/map.pt", "--tp", "8"]
    assert argv[4] == CANARY   # a copy: the caller's argv still launches the server


def test_env_values_of_secret_keys_only():
    env = {"HF_TOKEN": CANARY, "CUDA_HOME": "/usr/local/cuda", "EMPTY_TOKEN": "",
           "TOKENIZERS_PARALLELISM": "false", "HF_ENDPOINT": f"https://user:{CANARY}@hub/x"}
    out = redact_env(env)
    assert out["HF_TOKEN"] == MARKER and out["CUDA_HOME"] == "/usr/local/cuda"
    assert out["EMPTY_TOKEN"] == "" and out["TOKENIZERS_PARALLELISM"] == "false"
    assert out["HF_ENDPOINT"] == f"https://user:{MARKER}@hub/x"
    assert env["HF_TOKEN"] == CANARY


def test_text_known_values_and_marked_values():
    text = (f"servelab_simulator.py: error: unrecognized arguments: --api-key {CANARY}\n"
            f"server_args=ServerArgs(tokenizer_path='/m', api_key='{CANARY}x', "
            f"speculative_token_map=None)\nAuthorization: Bearer {CANARY}y\n"
            f'{{"hf_token": "{CANARY}z"}} and the value {CANARY} alone')
    out = redact_text(text, {CANARY})
    assert "canary" not in out
    assert "tokenizer_path='/m'" in out and "speculative_token_map=None" in out
    assert f"api_key='{MARKER}'" in out and f"Bearer {MARKER}" in out


def test_short_and_boolean_values_are_not_searched_for_in_text():
    # "1" or "true" under a secret-looking name would mask every 1 and true in every message.
    assert secret_values({"SOME_TOKEN": "1", "X_AUTH": "true", "HF_TOKEN": CANARY}) == {CANARY}
    assert redact_env({"SOME_TOKEN": "1"}) == {"SOME_TOKEN": MARKER}   # still blanked in place


def test_secret_values_and_collect_secrets_find_every_source():
    params = {"profile": {"env": {"HF_TOKEN": CANARY + "1"},
                          "extra_args": ["--api-key", CANARY + "2"],
                          "command": ["srv", "--token=" + CANARY + "3"],
                          "simulator": {"api_key": CANARY + "4"}},
              "env": {"OPENAI_API_KEY": CANARY + "5", "PATH": "/bin"}}
    assert collect_secrets(params) == {CANARY + str(i) for i in range(1, 6)}
    assert secret_values({"HF_TOKEN": "abcd"}, ["--api-key", "efgh"]) == {"abcd", "efgh"}


def test_tree_redacts_env_dicts_argv_lists_and_cmdlines_anywhere():
    tree = {"profiles": {"p": {"h": {
        "env": {"HF_TOKEN": CANARY, "A": "b"},
        "cmdline": f"python srv.py --api-key '{CANARY}' --port 1",
        "cmd": ["python", "--password", CANARY],
        "log_tail": f"started with HF_TOKEN={CANARY}",
        "status": "failed", "auth": True, "api_key": None}}}}
    out = redact_tree(tree)
    assert CANARY not in repr(out)
    rec = out["profiles"]["p"]["h"]
    assert rec["env"] == {"HF_TOKEN": MARKER, "A": "b"}
    assert rec["cmdline"] == f"python srv.py --api-key {shlex.quote(MARKER)} --port 1"
    assert rec["status"] == "failed" and rec["auth"] is True and rec["api_key"] is None


def test_redaction_is_idempotent():
    once = redact_cmdline(f"srv --api-key {CANARY} --token={CANARY}")
    assert redact_cmdline(once) == once
    assert redact_text(redact_text(f"api_key={CANARY}")) == f"api_key={MARKER}"


@pytest.mark.parametrize("text, leaked", [
    ("server_args: api_key='sk-live-123' model=m", "sk-live-123"),
    ("ServerArgs(model_path=m, api_key='sk-live-123')", "sk-live-123"),
    ("kwargs: token=tok-live-9 port=1", "tok-live-9"),
    ("cfg: {password: hunter2-pass}", "hunter2-pass"),
])
def test_a_secret_assignment_inside_another_assignments_value_is_masked(text, leaked):
    # The outer `name:` is not secret; its value is itself `secret_name=value`.
    out = redact_text(text)
    assert leaked not in out and MARKER in out, out
