"""tests/simproc.py, the one way tests and benchmarks run a server child process: it reports a
server that does not start with that server's own words, and it ends the process by PID."""
import os
import signal

import pytest

from simproc import ServerProcess, ServerStartError


def test_a_server_that_exits_at_start_raises_with_its_output(tmp_path):
    with pytest.raises(ServerStartError) as info:
        ServerProcess("--profile", "no-such-profile", truth_log=tmp_path / "truth.jsonl")
    message = str(info.value)
    assert "servelab_simulator.pyz exited with status 2" in message
    assert "no-such-profile" in message               # argparse's complaint, from its stderr


def test_a_silent_server_times_out_and_is_ended(tmp_path):
    silent = tmp_path / "silent.py"
    silent.write_text("import sys, time\nprint('warming up', file=sys.stderr, flush=True)\n"
                      "time.sleep(120)\n")
    with pytest.raises(ServerStartError) as info:
        ServerProcess(script=str(silent), start_timeout=1)
    assert "no listening line within 1 s" in str(info.value)
    assert "warming up" in str(info.value)


def test_the_simulator_listens_and_is_ended_by_pid(tmp_path):
    with ServerProcess("--profile", "fixed", truth_log=tmp_path / "truth.jsonl") as srv:
        assert srv.url == "http://127.0.0.1:%d" % srv.port and srv.port > 0
        os.kill(srv.pid, 0)                            # alive: no error
        assert srv.truth_records() == []
    assert srv.proc.returncode == 0                    # SIGTERM: the simulator's clean exit
    with pytest.raises(ProcessLookupError):
        os.kill(srv.pid, 0)
    assert srv.stop() == 0                             # a second stop is harmless


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path):
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "print('stubborn listening on http://127.0.0.1:9', flush=True)\n"
                        "time.sleep(120)\n")
    srv = ServerProcess(script=str(stubborn), stop_timeout=1)
    assert srv.port == 9
    assert srv.stop() == -signal.SIGKILL
