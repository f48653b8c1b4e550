"""Port ownership from /proc/net/tcp, and the log scan for skipped features."""
import os
import socket

from ansible_collections.servelab.serving.plugins.module_utils.server import ports as server_ports
from ansible_collections.servelab.serving.plugins.module_utils.server.logscan import scan_lines, scan_log


def test_a_listening_socket_is_found_with_its_owner():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert not server_ports.is_listening(port)      # bound is not listening
        sock.listen()
        assert server_ports.is_listening(port)
        holders = server_ports.listeners(port)
        assert os.getpid() in holders
        assert server_ports.describe(holders)[0].startswith(f"pid {os.getpid()} (")
    assert not server_ports.is_listening(port)


def test_ipv6_listeners_count_too():
    try:
        sock = socket.socket(socket.AF_INET6)
        sock.bind(("::1", 0))
    except OSError:
        import pytest
        pytest.skip("no IPv6 loopback here")
    with sock:
        sock.listen()
        assert server_ports.is_listening(sock.getsockname()[1])


SGLANG_TP2_LOG = """\
[2026-11-29 10:00:01 TP0] Load weight end.
[2026-11-29 10:00:02 TP0] FlashInfer workspace preflight probe failed (CUDA_ERROR_NOT_SUPPORTED). Skipping allreduce fusion.
[2026-11-29 10:00:02 TP1] FlashInfer workspace preflight probe failed (CUDA_ERROR_NOT_SUPPORTED). Skipping allreduce fusion.
[2026-11-29 10:00:03 TP0] TorchSymmMemCommunicator: World size 2 not supported, communicator is not available.
[2026-11-29 10:00:03] Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.
[2026-11-29 10:00:09] The server is fired up and ready to roll!
"""


def test_skipped_features_are_reported_once_with_a_count():
    found = scan_lines(SGLANG_TP2_LOG.splitlines(), "sglang")
    assert len(found.features_skipped) == 2
    fusion, symm = found.features_skipped
    assert fusion.startswith("flashinfer_allreduce_fusion: [2026-11-29 10:00:02 TP0]")
    assert fusion.endswith("Skipping allreduce fusion. (x2)")
    assert symm.startswith("torch_symm_mem: ") and "(x" not in symm
    assert found.engine_adjustments == [
        "max_running_requests: [2026-11-29 10:00:03] Max running requests is reset to 48 for "
        "speculative decoding. You can override this by explicitly setting "
        "--max-running-requests."]


def test_a_clean_log_and_other_engines_report_nothing(tmp_path):
    assert scan_lines(["The server is fired up and ready to roll!"], "sglang").features_skipped == []
    # The patterns are SGLang's strings: another engine's log is not judged by them.
    assert scan_lines(SGLANG_TP2_LOG.splitlines(), "command").features_skipped == []
    log = tmp_path / "server.log"
    log.write_text(SGLANG_TP2_LOG)
    assert len(scan_log(str(log), "sglang").features_skipped) == 2
    assert scan_log(str(tmp_path / "missing.log"), "sglang").features_skipped == []


def test_describe_folds_a_command_lines_newlines_into_one_line():
    """`python3 -c "<code over lines>"` holding the port: the preflight's message stays one line."""
    line = server_ports.describe({4242: "python3 -c \nimport socket\n\ts.bind(('127.0.0.1', 1))"})[0]
    assert line == "pid 4242 (python3 -c import socket s.bind(('127.0.0.1', 1)))"
